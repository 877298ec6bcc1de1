from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Speaker = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatFormat:
    """Qwen3's chat framing (ChatML) as token ids, computed once per tokenizer.

    A message's ids are exactly what the model's chat template renders for it, so a prompt built
    from framed messages equals the template's for a one-turn conversation.
    """

    tokenizer: PreTrainedTokenizerBase
    im_start: int
    im_end: int
    think_end: int
    newline: tuple[int, ...]
    generation_prompt: tuple[int, ...]
    eos_token_ids: frozenset[int]

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, *, enable_thinking: bool = False) -> ChatFormat:
        ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "</think>"])
        assert isinstance(ids, list)
        im_start, im_end, endoftext, think_end = ids
        # Thinking off: Qwen3's template opens the reply with an empty think block.
        opening = "assistant\n" if enable_thinking else "assistant\n<think>\n\n</think>\n\n"
        return cls(
            tokenizer=tokenizer,
            im_start=im_start,
            im_end=im_end,
            think_end=think_end,
            newline=tuple(_encode(tokenizer, "\n")),
            generation_prompt=(im_start, *tokenizer.encode(opening, add_special_tokens=False)),
            eos_token_ids=frozenset({im_end, endoftext}),
        )

    def encode(self, text: str) -> list[int]:
        """Plain text's ids: a `<|im_end|>` someone typed stays text, never a control token."""
        return _encode(self.tokenizer, text)

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(token_ids))
        assert isinstance(text, str)  # one sequence in, one text out
        return text

    def message(self, speaker: Speaker, text: str) -> list[int]:
        """The ids of one framed message."""
        return [self.im_start, *self.encode(f"{speaker}\n{text}"), self.im_end, *self.newline]

    def reply(self, generated_ids: Sequence[int]) -> list[int]:
        """The ids of an assistant message whose body the engine generated after the generation prompt."""
        body = list(generated_ids)
        while body and body[-1] in self.eos_token_ids:
            body.pop()
        return [*self.generation_prompt, *body, self.im_end, *self.newline]

    def prompt(self, system: str, user: str) -> list[int]:
        """A one-question conversation, ready for the model's answer."""
        return [*self.message("system", system), *self.message("user", user), *self.generation_prompt]


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids
