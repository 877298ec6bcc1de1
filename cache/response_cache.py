"""ResponseCache: L1 exact and L2 semantic answers within a scope, bounded, persisted, PII-free."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from cache.embeddings import BatchingEmbedder, Embedder, EmbedderBusy
from cache.entries import Entry, EntryTable
from cache.eviction import Usage, build_policy, victims
from cache.judge import Judge
from cache.keys import Scope, embedded_text, l1_key, normalize
from cache.levels import CacheLevel
from cache.pii import contains_pii, scrub
from cache.store import CacheStore
from cache.verify import Verifier, load_verifier
from settings import CacheSettings
from storage import Database

log = logging.getLogger(__name__)

# Lookups' vectors kept for the store that follows a miss, so a question is embedded once.
_PENDING_VECTORS = 256

T = TypeVar("T")


@dataclass(frozen=True)
class CacheHit:
    answer: str
    level: Literal[CacheLevel.EXACT, CacheLevel.SEMANTIC]
    similarity: float
    entry_id: int
    cut: bool  # the model's answer was cut at max_tokens


@dataclass(frozen=True)
class EntryView:
    """One entry as the admin console lists it."""

    id: int
    scope: str
    question: str
    answer: str
    hits: int
    created_at: datetime
    last_used_at: datetime


@dataclass(frozen=True)
class CacheFigures:
    enabled: bool
    embedder: str
    threshold: float
    entries: int
    capacity: int
    hits_exact: int
    hits_semantic: int
    misses: int
    hit_rate: float
    rejected_verify: int
    rejected_judge: int
    skipped_pii: int
    over_budget: int  # lookups that missed because their question was not embedded within the budget
    outrun: int  # lookups that missed because the model, started meanwhile, began the answer first
    evictions: int
    expired: int
    lookup_ms_p50: float
    lookup_ms_p99: float
    embed_forwards: int  # the embedder's forwards for lookups and stores
    embedded_texts: int  # the questions those forwards embedded


@dataclass(frozen=True)
class _Written:
    """What a writer's thread did, for the event loop's counters."""

    size: int
    count: int = 0
    evicted: int = 0
    expired: int = 0


class ResponseCache:
    """Answers a question from an earlier answer to the same question, asked in the same scope.

    Locking: the entries (`_table`) are read and changed under `_lock`, in worker threads but for
    one read; nothing holds `_lock` while it waits on the embedder or the database, and the event
    loop never waits for it (a FAISS retrain under it can take seconds). The counters, the figures,
    the pending vectors and the unsaved hits belong to the event loop. Every method that waits is
    async; writers (store, delete, flush, purge, load, saving hits) run one at a time under
    `_writer`, so memory and the database change in the same order.

    A lookup never waits on the database nor queues behind it. Its L1 read, a dict lookup, takes
    `_lock` on the event loop when it is free (the hop to a thread took 2.5 ms at p50 under the
    peer workload's 8 clients); the rest of its work in memory, and the L1 read when a writer holds
    `_lock`, runs on a thread of its own (`_lookups`), not in the default pool with the units of
    work; its embedding is batched with the lookups and stores around it (`BatchingEmbedder`), and
    holds no thread while it waits; its hit is saved later, with the hits around it. A store embeds
    at a lower priority than lookups, before it takes `_writer`.
    """

    def __init__(
        self,
        settings: CacheSettings,
        embedder: Embedder,
        db: Database | None = None,
        *,
        judge: Judge | None = None,
        claim_cpu: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`claim_cpu`: the engine's, held while a lookup's question is embedded (BatchingEmbedder)."""
        if embedder.name not in settings.thresholds:
            raise ValueError(
                f"no L2 threshold for embedder {embedder.name!r}: run `python -m cache calibrate PAIRS.tsv` "
                f"with it and set cache.thresholds[{embedder.name!r}]"
            )
        self.settings = settings
        self.embedder = embedder
        self.judge = judge
        self.threshold = settings.thresholds[embedder.name]
        self.verifier: Verifier | None = load_verifier(embedder.name) if settings.verify else None
        self._clock = clock
        self._policy = build_policy(settings)
        self._store = CacheStore(db, embedder.name)
        self._lock = threading.Lock()
        self._table = EntryTable(embedder.dim, settings.approx_index_min_entries, settings.ivf_nprobe)
        self._writer = asyncio.Lock()
        self._budget_s = settings.lookup_budget_ms / 1000
        self._embeddings = BatchingEmbedder(
            embedder, settings.embed_batch_max, settings.embed_batch_window_ms / 1000, claim_cpu
        )
        self._lookups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-lookups")
        self._num_entries = 0
        self._pending: OrderedDict[str, np.ndarray] = OrderedDict()
        self._unsaved_hits: list[tuple[int, float]] = []
        self._hit_saver: asyncio.Task[None] | None = None
        # each until its vector is in `_pending`: a check finds a question's vector in one or the other
        self._embedding_ahead: dict[str, asyncio.Task[None]] = {}
        self._counts: Counter[str] = Counter()
        # The highest stored id this replica has read (`load`, `sync`): rows past it are new.
        self._synced_through = 0
        self._latencies: deque[float] = deque(maxlen=settings.latency_window)

    # --- serving ------------------------------------------------------------------------------

    async def lookup(
        self,
        scope: Scope,
        question: str,
        max_tokens: int | None = None,
        *,
        while_embedding: Callable[[], asyncio.Future[None]] | None = None,
    ) -> CacheHit | None:
        """An earlier answer to `question` in `scope` that this request may get: a complete one,
        or one the model cut at its max_tokens when this request asks for no more (`max_tokens`;
        None: a complete answer only). `while_embedding` is called when L1 has missed and the
        question is about to be embedded, which takes tens of milliseconds: the caller may start
        meanwhile what a miss needs, and returns a future done once that has begun the answer
        (`race_model`: the lookup then misses)."""
        if not self.settings.enabled:
            return None
        if contains_pii(question):
            self._counts["skipped_pii"] += 1
            return None
        started = time.perf_counter()
        now, key = self._clock(), l1_key(scope, question)
        found = self._exact(scope.key, key, now, max_tokens, wait=False)
        if found is None:  # a writer holds the entries: the lookups' thread waits for them, not the loop
            found = await self._in_lookups(self._exact, scope.key, key, now, max_tokens)
        assert found is not None  # waiting for the lock, `_exact` always answers
        hit, comparable = found
        text, vector = embedded_text(question), None
        if hit is None and comparable and text is not None:
            answering = None if while_embedding is None else while_embedding()
            # the budget is the whole lookup's: the L1 pass may have waited (a busy loop, a writer)
            budget_s = self._budget_s - (time.perf_counter() - started)
            vector = await self._embedding_in_budget(key, text, budget_s, answering)
        elif hit is None and scope.shared and text is not None and key not in self._embedding_ahead:
            self._embed_ahead(key, asyncio.ensure_future(self._embeddings.embed(text, urgent=False)))
        if vector is not None:
            candidates = await self._in_lookups(self._nearest, scope.key, vector, now, max_tokens)
            hit = await self._same_question(question, candidates)
            if hit is not None:
                await self._in_lookups(self._used, hit.entry_id, now)
        if hit is not None:
            self._save_hit(hit.entry_id, now)
        self._latencies.append(time.perf_counter() - started)
        self._counts[f"hits_{hit.level}" if hit else "misses"] += 1
        return hit

    async def store(self, scope: Scope, question: str, answer: str, cut_at: int | None = None) -> bool:
        """Cache `answer` (scrubbed of PII); False when the request may not be cached. `cut_at`:
        the max_tokens the model's answer was cut at (None: the model ended it), so that it only
        serves requests that ask for no more.

        A question with PII is refused here silently: its lookup already counted it."""
        if not self.settings.enabled or contains_pii(question):
            return False
        key, text = l1_key(scope, question), embedded_text(question)
        vector = self._pending.pop(key, None)
        # A follow-up's answer is found by its L1 key only: an L2 hit would need another
        # conversation with the very same history and a reworded question, and embedding every
        # follow-up for it cost each turn 30-200 ms of the embedder that lookups wait for.
        if vector is None and scope.shared and text is not None:
            vector = await self._embeddings.embed(text, urgent=False)
        await self._write(self._insert, scope, key, question, scrub(answer), cut_at, vector, self._clock())
        return True

    async def paraphrase(
        self,
        scope: Scope,
        question: str,
        others: Sequence[str],
        *,
        within_s: float | None = None,
        answering: asyncio.Future[None] | None = None,
    ) -> str | None:
        """The first of `others`, questions being answered now in `scope`, that `question` asks
        again in other words by the L2 gate (threshold, verifier, judge): a request may share its
        generation. It embeds nothing: it compares the vectors the questions' lookups left, or
        joins their embedding under way for at most `within_s` (None: the lookup budget) and, with
        `race_model`, until `answering`, the request's own generation, has begun; a question
        whose lookup could not embed it (its budget ran out) is not compared. Embedding
        them here took the embedder from the lookups: on the peer workload, 134 requests to the
        embedder for 44 first questions, 27 of whose lookups gave up, and a check took 46 ms at p50."""
        # a question with PII is never merged (its answer may hold the PII), a long one never by meaning
        others = [other for other in others if not contains_pii(other) and embedded_text(other) is not None]
        if not self.settings.enabled or contains_pii(question) or embedded_text(question) is None or not others:
            return None
        wait_s = self._budget_s if within_s is None else within_s
        own, *vectors = await asyncio.gather(
            *(self._vector(q, l1_key(scope, q), wait_s, answering) for q in [question, *others])
        )
        if own is None:
            return None
        for other, vector in zip(others, vectors, strict=True):
            if vector is None:
                continue
            similarity = float(own @ vector)
            if similarity >= self.threshold and await self._asks_the_same(question, other, similarity):
                return other
        return None

    async def close(self) -> None:
        """Saves the hits not saved yet and drops the embeddings ahead of stores (at shutdown)."""
        embeddings = list(self._embedding_ahead.values())
        for embedding in embeddings:
            embedding.cancel()
        await asyncio.gather(*embeddings, return_exceptions=True)
        if self._hit_saver is not None:
            await self._hit_saver

    async def _embedding_in_budget(
        self, key: str, text: str, budget_s: float, answering: asyncio.Future[None] | None
    ) -> np.ndarray | None:
        """The vector of a question (`key`: its L1 key, `text`: its `embedded_text`), kept for its
        store, or None past `budget_s`: under a burst the embedder's queue outgrows any wait a hit
        could save (300 concurrent lookups on 2 cores: p99 0.8 s), so a lookup past its budget
        leaves the queue, its question not embedded, and misses; one that the queue ahead of it
        could not serve within the budget misses at once. So does one the model outruns
        (`_racing`)."""
        if budget_s <= 0:
            self._counts["over_budget"] += 1
            return None
        embedding = asyncio.ensure_future(self._embeddings.embed(text, within_s=budget_s))
        racing = self._racing(answering)
        racers: set[asyncio.Future[Any]] = {embedding, *racing}
        try:
            done, _ = await asyncio.wait(racers, timeout=budget_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._leave_or_keep(key, text, embedding)
        if embedding in done and not isinstance(embedding.exception(), EmbedderBusy):
            self._remember(key, embedding.result())
            return embedding.result()
        self._counts["outrun" if embedding not in done and done & racing else "over_budget"] += 1
        return None

    def _leave_or_keep(self, key: str, text: str, embedding: asyncio.Future[np.ndarray]) -> None:
        """A question no longer waited for leaves the embedder's queue, unless the forward under
        way holds it: then its vector is kept as it comes, for its store and the paraphrase checks,
        which embedded it a second time when it was dropped."""
        if embedding.done():
            return
        if self._embeddings.is_in_forward(text) and key not in self._embedding_ahead:
            self._embed_ahead(key, embedding)
        else:
            embedding.cancel()

    def _racing(self, answering: asyncio.Future[None] | None) -> set[asyncio.Future[None]]:
        """What ends a wait for an embedding before its budget: the model, started meanwhile,
        beginning the answer. A hit after that would only keep the user from the model's first
        words (--compare, 2 cores: the lookups of first questions, their embeddings queued
        behind others', ran into their 250 ms budget with the answer's first token ready after
        30-140 ms)."""
        return {answering} if answering is not None and self.settings.race_model else set()

    async def _vector(
        self, question: str, key: str, within_s: float, answering: asyncio.Future[None] | None
    ) -> np.ndarray | None:
        """`question`'s vector if its lookup left one or it is being embedded now (joined, for at
        most `within_s` and until `answering` has begun, racing it: no more work), else None."""
        vector = self._pending.get(key)
        text = embedded_text(question)
        if vector is not None or text is None or within_s <= 0:
            return vector
        if (ahead := self._embedding_ahead.get(key)) is not None:
            await asyncio.wait({ahead, *self._racing(answering)}, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
            return self._pending.get(key)
        if self._embeddings.is_embedding(text):
            vector = await self._embedding_in_budget(key, text, within_s, answering)
        return vector

    def _embed_ahead(self, key: str, embedding: asyncio.Future[np.ndarray]) -> None:
        """Keeps a question's vector as `embedding` brings it, in the background, for its store and
        for a paraphrase asked meanwhile to compare with: a first question its lookup had no vector
        to compare with (its store embeds it anyway), or one whose lookup stopped waiting during
        its forward. An error is left to the store, which then embeds it again."""

        async def keep() -> None:
            try:
                with contextlib.suppress(Exception):
                    self._remember(key, await embedding)
            finally:
                del self._embedding_ahead[key]

        self._embedding_ahead[key] = asyncio.create_task(keep())

    async def _same_question(self, question: str, candidates: list[tuple[CacheHit, str]]) -> CacheHit | None:
        """The first candidate that asks what `question` asks."""
        for candidate, cached in candidates:
            if await self._asks_the_same(question, cached, candidate.similarity):
                return candidate
        return None

    async def _asks_the_same(self, question: str, other: str, similarity: float) -> bool:
        """Past the threshold: the verifier, then the judge, each counted when it says no."""
        if self.verifier is not None and not self.verifier.verdict(question, other, similarity).same:
            self._counts["rejected_verify"] += 1
            return False
        if self.judge is not None and not await self.judge(question, other):
            self._counts["rejected_judge"] += 1
            return False
        return True

    def _remember(self, key: str, vector: np.ndarray) -> None:
        self._pending[key] = vector
        self._pending.move_to_end(key)
        if len(self._pending) > _PENDING_VECTORS:
            self._pending.popitem(last=False)

    def _save_hit(self, entry_id: int, now: float) -> None:
        """Saves the hit soon, with the hits that come meanwhile, in one unit of work: a lookup
        does not wait for the database (300 concurrent hits were 300 commits in a row)."""
        self._unsaved_hits.append((entry_id, now))
        if self._hit_saver is None:
            self._hit_saver = asyncio.create_task(self._save_hits())

    async def _save_hits(self) -> None:
        try:
            while self._unsaved_hits:
                hits, self._unsaved_hits = self._unsaved_hits, []
                try:
                    await self._write(self._record_hits, hits)
                except SQLAlchemyError as exc:  # the counts are lost, the entries are not
                    log.error("response cache: %d hits not saved: %s: %s", len(hits), type(exc).__name__, exc)
        finally:
            self._hit_saver = None

    async def _in_lookups(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._lookups, work, *args)

    # --- worker threads -----------------------------------------------------------------------

    def _exact(
        self, scope: str, key: str, now: float, max_tokens: int | None, *, wait: bool = True
    ) -> tuple[CacheHit | None, bool] | None:
        """The L1 hit if any, and whether `scope` holds vectors to compare the question with: a
        follow-up turn's scope (its history) has none (see `store`), and a new deployment's shared
        scope none yet, so no embedding. None, without `wait`, when a writer holds the entries."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            entry = self._table.by_key(key)
            if entry is not None and self._serves(entry, now, max_tokens):
                entry.usage.hit(now)
                return CacheHit(entry.answer, CacheLevel.EXACT, 1.0, entry.id, entry.cut_at is not None), True
            return None, self._table.holds(scope)
        finally:
            self._lock.release()

    def _nearest(
        self, scope: str, vector: np.ndarray, now: float, max_tokens: int | None
    ) -> list[tuple[CacheHit, str]]:
        """The L2 candidates that pass the threshold, most similar first, each with its cached
        question; each neighbour credited with its closeness to this query (what adaptive eviction
        weighs)."""
        floor = self.threshold - self.settings.related_band
        with self._lock:
            neighbours = self._table.nearest(scope, vector, self.settings.candidates)
            for entry, similarity in neighbours:
                relatedness = min(1.0, max(0.0, (similarity - floor) / (1.0 - floor)))
                entry.usage.credit(relatedness, now, self.settings.closeness_half_life_s)
            return [
                (
                    CacheHit(entry.answer, CacheLevel.SEMANTIC, similarity, entry.id, entry.cut_at is not None),
                    entry.question,
                )
                for entry, similarity in neighbours
                if similarity >= self.threshold and self._serves(entry, now, max_tokens)
            ]

    def _used(self, entry_id: int, now: float) -> None:
        with self._lock:
            entry = self._table.get(entry_id)
            if entry is not None:
                entry.usage.hit(now)

    def _record_hits(self, hits: list[tuple[int, float]]) -> _Written:
        self._store.record_hits(hits)
        with self._lock:
            return _Written(len(self._table))

    def _insert(
        self,
        scope: Scope,
        key: str,
        question: str,
        answer: str,
        cut_at: int | None,
        vector: np.ndarray | None,
        now: float,
    ) -> _Written:
        entry_id = self._store.insert(scope.key, key, question, answer, cut_at, vector, now)
        with self._lock:
            replaced = self._table.by_key(key)
            if replaced is not None:
                self._table.remove([replaced.id])
            evicted, expired = self._make_room(now) if len(self._table) >= self.settings.capacity else ([], [])
            entry = Entry(entry_id, scope.key, key, question, answer, cut_at, Usage(now, now))
            self._table.add([entry], None if vector is None else vector.reshape(1, -1))
            size = len(self._table)
        self._store.delete(evicted + expired)
        return _Written(size, evicted=len(evicted), expired=len(expired))

    def _make_room(self, now: float) -> tuple[list[int], list[int]]:
        """(evicted, expired) ids, removed from memory: the expired ones if any, else the
        policy's victims, `evict_fraction` of the capacity at once so that scoring runs rarely."""
        entries = list(self._table)
        expired = [e.id for e in entries if not self._fresh(e, now)]
        if expired:
            self._table.remove(expired)
            return [], expired
        count = max(1, int(self.settings.capacity * self.settings.evict_fraction))
        chosen = [entries[i].id for i in victims(self._policy, [e.usage for e in entries], count, now)]
        self._table.remove(chosen)
        return chosen, []

    def _fresh(self, entry: Entry, now: float) -> bool:
        return now - entry.usage.created < self.settings.ttl_s

    def _serves(self, entry: Entry, now: float, max_tokens: int | None) -> bool:
        """Fresh, and as long as the request may get: an answer cut at 32 tokens is not the answer
        to a request for 512, and is served cut (finish reason `length`) to one for 32 or fewer."""
        if not self._fresh(entry, now):
            return False
        return entry.cut_at is None or (max_tokens is not None and max_tokens <= entry.cut_at)

    # --- administration -----------------------------------------------------------------------

    async def load(self) -> int:
        """Rebuild the entries and indexes from the database (at start-up); returns the count."""
        loaded = await self._write(self._load, self._clock())
        log.info("response cache: loaded %d entries", loaded)
        return loaded

    def _load(self, now: float) -> _Written:
        rows = self._store.load(now, self.settings.ttl_s)
        evicted: list[int] = []
        with self._lock:
            self._table.clear()
            self._add_rows(rows)
            while len(self._table) > self.settings.capacity:
                evicted += self._make_room(now)[0]
            size = len(self._table)
        self._store.delete(evicted)
        self._synced_through = max((entry.id for entry, _ in rows), default=0)
        return _Written(size, count=size, evicted=len(evicted))

    async def sync(self) -> int:
        """Follow what other replicas on the database stored and deleted (each `sync_interval_s`,
        from the app's scheduler); returns how many entries came and went."""
        return await self._write(self._sync, self._clock())

    def _sync(self, now: float) -> _Written:
        stored, added = self._store.changes(self._synced_through, now, self.settings.ttl_s)
        seen_through = max(stored, default=self._synced_through)
        with self._lock:
            # An entry this replica stored after the query is not gone: only ids it could see count.
            gone = [entry.id for entry in self._table if entry.id <= seen_through and entry.id not in stored]
            self._table.remove(gone)
            new = [(entry, vector) for entry, vector in added if self._table.get(entry.id) is None]
            self._add_rows(new)
            size = len(self._table)
        self._synced_through = max(self._synced_through, seen_through)
        return _Written(size, count=len(gone) + len(new))

    def _add_rows(self, rows: list[tuple[Entry, np.ndarray | None]]) -> None:
        """Stored entries into the table, each scope's vectors in one batch. Under `_lock`."""
        embedded: dict[str, list[tuple[Entry, np.ndarray]]] = {}
        by_key_only: dict[str, list[Entry]] = {}
        for entry, vector in rows:
            if vector is None:
                by_key_only.setdefault(entry.scope, []).append(entry)
            else:
                embedded.setdefault(entry.scope, []).append((entry, vector))
        for pairs in embedded.values():
            self._table.add([entry for entry, _ in pairs], np.stack([vector for _, vector in pairs]))
        for entries in by_key_only.values():
            self._table.add(entries, None)

    async def delete(self, entry_id: int) -> bool:
        return bool(await self._write(self._delete, entry_id))

    def _delete(self, entry_id: int) -> _Written:
        with self._lock:
            found = self._table.get(entry_id) is not None
            if found:
                self._table.remove([entry_id])
            size = len(self._table)
        if found:
            self._store.delete([entry_id])
        return _Written(size, count=int(found))

    async def flush(self) -> int:
        return await self._write(self._flush)

    def _flush(self) -> _Written:
        with self._lock:
            count = len(self._table)
            self._table.clear()
        self._store.clear()
        return _Written(0, count=count)

    async def purge_expired(self) -> int:
        return await self._write(self._purge_expired, self._clock())

    def _purge_expired(self, now: float) -> _Written:
        with self._lock:
            expired = [e.id for e in self._table if not self._fresh(e, now)]
            self._table.remove(expired)
            size = len(self._table)
        self._store.delete(expired)
        return _Written(size, count=len(expired), expired=len(expired))

    async def entries(
        self, query: str = "", limit: int = 50, order: Literal["recent", "hits"] = "recent"
    ) -> list[EntryView]:
        """Entries whose question contains `query` (normalized): the most recently used or the
        most hit first."""
        return await asyncio.to_thread(self._entries, normalize(query), limit, order)

    def _entries(self, needle: str, limit: int, order: Literal["recent", "hits"]) -> list[EntryView]:
        with self._lock:
            views = [
                EntryView(
                    id=e.id,
                    scope=e.scope,
                    question=e.question,
                    answer=e.answer,
                    hits=e.usage.hits,
                    created_at=_datetime(e.usage.created),
                    last_used_at=_datetime(e.usage.last_used),
                )
                for e in self._table
                if needle in normalize(e.question)
            ]
        if order == "hits":
            views.sort(key=lambda view: view.hits, reverse=True)
        else:
            views.sort(key=lambda view: view.last_used_at, reverse=True)
        return views[:limit]

    async def _write(self, work: Callable[..., _Written], *args: object) -> int:
        """Runs one writer's `work` in a thread, after the writers before it; returns its count."""
        async with self._writer:
            written = await asyncio.to_thread(work, *args)
            self._num_entries = written.size
            self._counts["evictions"] += written.evicted
            self._counts["expired"] += written.expired
        return written.count

    # --- figures ------------------------------------------------------------------------------

    def figures(self) -> CacheFigures:
        counts = self._counts
        hits = counts["hits_exact"] + counts["hits_semantic"]
        lookups = hits + counts["misses"]
        latencies = np.asarray(self._latencies) * 1000.0
        return CacheFigures(
            enabled=self.settings.enabled,
            embedder=self.embedder.name,
            threshold=self.threshold,
            entries=self._num_entries,
            capacity=self.settings.capacity,
            hits_exact=counts["hits_exact"],
            hits_semantic=counts["hits_semantic"],
            misses=counts["misses"],
            hit_rate=hits / lookups if lookups else 0.0,
            rejected_verify=counts["rejected_verify"],
            rejected_judge=counts["rejected_judge"],
            skipped_pii=counts["skipped_pii"],
            over_budget=counts["over_budget"],
            outrun=counts["outrun"],
            evictions=counts["evictions"],
            expired=counts["expired"],
            lookup_ms_p50=float(np.percentile(latencies, 50)) if latencies.size else 0.0,
            lookup_ms_p99=float(np.percentile(latencies, 99)) if latencies.size else 0.0,
            embed_forwards=self._embeddings.forwards,
            embedded_texts=self._embeddings.texts,
        )


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)
