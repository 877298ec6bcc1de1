from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a request's output ids into text one token at a time.

    A token may end inside a multi-byte character; its text waits until a later token completes
    the character (the decoded window then no longer ends in U+FFFD). Text that could still turn
    out to be the start of a stop string is held back from `take_delta` until it cannot.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""
        self.num_emitted_chars = 0
        self.stopped = False

    def append(self, token_id: int) -> bool:
        """Adds one token; returns True when the text now contains a stop string (and is cut there)."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return False
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return self._add_text(new_text[len(prefix_text) :])

    def flush(self) -> None:
        """At the end, whatever bytes are still pending become text, replacement chars and all."""
        if self.stopped:
            return
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self._add_text(new_text[len(prefix_text) :])

    def take_delta(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.num_emitted_chars, len(self.text) - self.holdback)
        delta = self.text[self.num_emitted_chars : end]
        self.num_emitted_chars = end
        return delta

    def _add_text(self, delta: str) -> bool:
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        self.stopped = True
        return True

    def _decode(self, token_ids: list[int]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence in, one text out
        return text
