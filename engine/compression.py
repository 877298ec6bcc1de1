"""Importance-scored context compression.

When the next prompt would not fit the budget, every earlier message outside the protected tail is
scored for relevance to the current question (embedding similarity), recency and role. The
highest-scoring ones stay, word for word; each run of dropped messages is replaced by a short
summary the model writes. Order is kept. The result becomes the session's new stable prefix, so
this runs rarely: it compresses to `target_ratio` of the budget, leaving room for many turns.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.embeddings import Embedder
from engine.history import MessageRecord, TokenHistory

Summarize = Callable[[str], Awaitable[str]]

# Framing of a summary message plus its lead-in, in tokens; reserved per dropped span.
SUMMARY_OVERHEAD_TOKENS = 24
SUMMARY_PREFIX = "Summary of an earlier part of this conversation: "


@dataclass(frozen=True)
class CompressionConfig:
    max_prompt_tokens: int = 6144
    target_ratio: float = 0.6
    compress_ahead_ratio: float = 0.9
    keep_last_turns: int = 2
    relevance_weight: float = 0.6
    recency_weight: float = 0.3
    role_weight: float = 0.1
    recency_half_life_turns: float = 4.0
    summary_max_tokens: int = 96


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
            digest.update(array("i", history.ids_of(record)).tobytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class CompressionPlan:
    """The new context in chronological order: kept records and spans to summarize."""

    layout: tuple[MessageRecord | Span, ...]

    @property
    def spans(self) -> list[Span]:
        return [item for item in self.layout if isinstance(item, Span)]


def needs_compression(history: TokenHistory, pending_tokens: int, config: CompressionConfig) -> bool:
    return history.num_tokens + pending_tokens > config.max_prompt_tokens


def plan_compression(
    history: TokenHistory,
    question: str,
    pending_tokens: int,
    current_turn: int,
    embedder: Embedder,
    config: CompressionConfig,
) -> CompressionPlan:
    """Choose what stays. `pending_tokens`: the new user message plus the generation prompt;
    `current_turn`: the session-wide index of the turn being asked (records carry theirs)."""
    records = history.records
    span_cost = config.summary_max_tokens + SUMMARY_OVERHEAD_TOKENS
    # Protect the last turns; if even they do not fit beside one summary, protect fewer.
    for keep_last_turns in range(config.keep_last_turns, -1, -1):
        protected = {
            id(record)
            for record in records
            if record.role == "system" or record.turn_index >= current_turn - keep_last_turns
        }
        fixed_tokens = pending_tokens + sum(record.token_length for record in records if id(record) in protected)
        if fixed_tokens + span_cost <= config.max_prompt_tokens:
            break
    candidates = [record for record in records if id(record) not in protected]
    available = int(config.max_prompt_tokens * config.target_ratio) - fixed_tokens

    kept: set[int] = set()
    for record in _by_importance(candidates, question, current_turn, embedder, config):
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
    assert not run, "the protected tail always ends the history"
    return CompressionPlan(tuple(layout))


def _by_importance(
    candidates: Sequence[MessageRecord],
    question: str,
    current_turn: int,
    embedder: Embedder,
    config: CompressionConfig,
) -> list[MessageRecord]:
    if not candidates:
        return []
    vectors = embedder.encode([question, *(record.text for record in candidates)])
    similarity = vectors[1:] @ vectors[0]
    # Rescaled to [0, 1] among the candidates: each embedder has its own similarity scale
    # (multilingual-e5 puts unrelated texts at 0.8), and only the ranking may weigh in.
    spread = float(similarity.max() - similarity.min())
    relevance = (similarity - similarity.min()) / spread if spread > 0 else np.zeros_like(similarity)
    ages = np.array([current_turn - record.turn_index for record in candidates], dtype=np.float32)
    recency = 0.5 ** (ages / config.recency_half_life_turns)
    # The user's own words carry the facts later questions ask about.
    is_user = np.array([record.role == "user" for record in candidates], dtype=np.float32)
    scores = config.relevance_weight * relevance + config.recency_weight * recency + config.role_weight * is_user
    return [candidates[index] for index in np.argsort(-scores, kind="stable")]


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


async def summarize_spans(
    plan: CompressionPlan, history: TokenHistory, summarize: Summarize, cache: dict[str, str]
) -> dict[Span, str]:
    """One summary per dropped span; a span seen before (same ids) reuses its summary. New ones
    are written concurrently, so the engine batches them and the turn waits for one, not all."""
    digests = {span: span.digest(history) for span in plan.spans}
    missing = {digest: span for span, digest in digests.items() if digest not in cache}
    written = await asyncio.gather(*(summarize(span.transcript) for span in missing.values()))
    for digest, summary in zip(missing, written):
        cache[digest] = SUMMARY_PREFIX + summary.strip()
    return {span: cache[digest] for span, digest in digests.items()}
