"""Summaries of dropped spans of a conversation, written by the served model."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping

from cache.words import terms
from engine import BACKGROUND_PRIORITY, ChatFormat, Engine, SamplingParams

SUMMARIZER_PROMPT = (
    "You condense conversations. Summarize the conversation below in a few sentences. "
    "Keep names, numbers, facts, decisions and open questions; drop greetings and filler."
)
SUMMARY_PREFIX = "Summary of an earlier part of this conversation: "
# The prompt's framing and instructions, in tokens, on top of the transcript.
PROMPT_OVERHEAD_TOKENS = 64
# Summaries are written in the background: the engine serves every user's turn before them.
SUMMARY_PRIORITY = BACKGROUND_PRIORITY
# The words of a transcript's lines that say whose message it is, not what it says.
ROLE_TERMS = terms("system user assistant summary")


class Summarizer:
    """Writes one summary per span, concurrently, so the engine batches them. The newest
    `capacity` summaries are kept by span digest: a span dropped again (the same ids, in another
    compression or another session) is not summarized again. A summary that carries less of its
    span than the span's stand-in (`carries_more`) is not kept: the stand-in is, in its place.

    `chat_format` should have thinking off, so the summary comes first."""

    def __init__(self, engine: Engine, chat_format: ChatFormat, max_tokens: int, capacity: int) -> None:
        self.engine = engine
        self.chat_format = chat_format
        self.max_tokens = max_tokens
        self.capacity = capacity
        self._summaries: OrderedDict[str, str] = OrderedDict()

    def known(self, digest: str) -> str | None:
        """The summary of the span with this digest, if it has been written."""
        summary = self._summaries.get(digest)
        if summary is not None:
            self._summaries.move_to_end(digest)
        return summary

    async def write(self, transcripts: Mapping[str, str], stand_ins: Mapping[str, str]) -> dict[str, str]:
        """Span digest -> transcript in, span digest -> summary out: the model's, or the span's
        stand-in (`stand_ins`, by digest) where that carries more of the span; only unknown ones
        are written."""
        missing = [digest for digest in transcripts if digest not in self._summaries]
        written = await asyncio.gather(*(self._write(transcripts[digest]) for digest in missing))
        for digest, summary in zip(missing, written, strict=True):
            transcript, stand_in = transcripts[digest], stand_ins[digest]
            kept = SUMMARY_PREFIX + summary.strip() if carries_more(summary, stand_in, transcript) else stand_in
            self._summaries[digest] = kept
        found = {digest: self._summaries[digest] for digest in transcripts}
        for digest in transcripts:
            self._summaries.move_to_end(digest)
        while len(self._summaries) > self.capacity:
            self._summaries.popitem(last=False)
        return found

    async def _write(self, transcript: str) -> str:
        limit = self.engine.max_model_len - self.max_tokens - PROMPT_OVERHEAD_TOKENS
        body = self.chat_format.encode(transcript)[: max(limit // 2, 64)]
        prompt = self.chat_format.prompt(SUMMARIZER_PROMPT, self.chat_format.decode(body))
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens, priority=SUMMARY_PRIORITY)
        deltas = [delta async for delta in self.engine.stream(prompt, params)]
        if deltas[-1].finish_reason not in ("stop", "length"):
            raise RuntimeError(f"the summary was not written ({deltas[-1].finish_reason})")
        return "".join(delta.text for delta in deltas)


def carries_more(summary: str, stand_in: str, transcript: str) -> bool:
    """Whether `summary` holds more of the words of the span's `transcript` than `stand_in` does.

    A summary should say what the span said in fewer words; one that says less of it than its
    messages' openings is no summary. SmolLM2-135M's summaries of the spans bench/quality_bench.py
    drops held less in 118 of 125 (they loop, carry the conversation on, or invent code and logs),
    and as the app ran, the facts a user had stated early were left in 3 of 53 prompts; with the
    stand-ins kept in their place, and their excerpts past the greeting a message opens with
    (chat/compression.py), in 35."""
    said = terms(transcript) - ROLE_TERMS
    return len(terms(summary) & said) > len(terms(stand_in) & said)
