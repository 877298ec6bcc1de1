"""ResponseCache: L1 exact and L2 semantic answers within a scope, bounded, persisted, PII-free."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

import numpy as np

from engine.cache.config import CacheConfig
from engine.cache.eviction import Usage, build_policy, victims
from engine.cache.index import VectorIndex
from engine.cache.keys import Scope, l1_key, normalize
from engine.cache.verify import verify
from engine.embeddings import Embedder
from engine.pii import contains_pii, scrub
from storage import CacheEntry, CacheRepository, Database

log = logging.getLogger(__name__)

Judge = Callable[[str, str], Awaitable[bool]]
"""judge(question_a, question_b) -> do they ask the same thing? (e.g. a short yes/no by the LLM)"""

_PENDING_VECTORS = 256


@dataclass(frozen=True)
class CacheHit:
    answer: str
    level: Literal["exact", "semantic"]
    similarity: float
    entry_id: int


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


@dataclass
class _Entry:
    id: int
    scope: str
    key: str
    question: str
    answer: str
    usage: Usage


class ResponseCache:
    """Answers a question from an earlier answer to the same question, asked in the same scope.

    Async methods keep the event loop free: embedding, FAISS and database work run in threads,
    and `_lock` serializes those threads' access to the entries and indexes."""

    def __init__(
        self,
        config: CacheConfig,
        embedder: Embedder,
        db: Database | None = None,
        *,
        judge: Judge | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.embedder = embedder
        self.db = db
        self.judge = judge
        self.threshold = config.threshold_for(embedder.name)
        self._clock = clock
        self._policy = build_policy(config.policy, config.eviction)
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._by_key: dict[str, int] = {}
        self._indexes: dict[str, VectorIndex] = {}
        self._pending: OrderedDict[str, np.ndarray] = OrderedDict()  # lookup's vectors, reused by store
        self._ids = itertools.count(1)
        self._counts: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=config.latency_window)

    # --- serving ------------------------------------------------------------------------------

    async def lookup(self, scope: Scope, question: str) -> CacheHit | None:
        if not self.config.enabled:
            return None
        if contains_pii(question):
            self._counts["skipped_pii"] += 1
            return None
        started = time.perf_counter()
        hit = await self._lookup(scope, question)
        self._latencies.append(time.perf_counter() - started)
        self._counts[f"hits_{hit.level}" if hit else "misses"] += 1
        return hit

    async def store(self, scope: Scope, question: str, answer: str) -> bool:
        """Cache `answer` (scrubbed of PII); False when the request may not be cached.

        A question with PII is refused here silently: its lookup already counted it."""
        if not self.config.enabled or contains_pii(question):
            return False
        key = l1_key(scope, question)
        vector = self._pending.pop(key, None)
        if vector is None:
            vector = await self._embed(question)
        await asyncio.to_thread(self._insert, scope.key, key, question, scrub(answer), vector)
        return True

    async def _lookup(self, scope: Scope, question: str) -> CacheHit | None:
        now = self._clock()
        key = l1_key(scope, question)
        exact = self._entries.get(self._by_key.get(key, 0))
        if exact is not None and self._fresh(exact, now):
            return await self._hit(exact, "exact", 1.0, now)
        vector = await self._embed(question)
        self._remember(key, vector)
        for entry, similarity in await asyncio.to_thread(self._neighbours, scope.key, vector, now):
            if similarity < self.threshold:
                break
            if self._fresh(entry, now) and await self._same_question(question, entry.question):
                return await self._hit(entry, "semantic", similarity, now)
        return None

    async def _same_question(self, question: str, cached: str) -> bool:
        if self.config.verify and not verify(question, cached, self.config.min_overlap).same:
            self._counts["rejected_verify"] += 1
            return False
        if self.judge is not None and not await self.judge(question, cached):
            self._counts["rejected_judge"] += 1
            return False
        return True

    async def _hit(self, entry: _Entry, level: Literal["exact", "semantic"], similarity: float, now: float) -> CacheHit:
        entry.usage.hit(now)
        if self.db is not None:
            await asyncio.to_thread(self._persist_hit, entry.id, now)
        return CacheHit(answer=entry.answer, level=level, similarity=similarity, entry_id=entry.id)

    def _fresh(self, entry: _Entry, now: float) -> bool:
        return now - entry.usage.created < self.config.ttl_s

    async def _embed(self, question: str) -> np.ndarray:
        vectors = await asyncio.to_thread(self.embedder.encode, [normalize(question)])
        return vectors[0]

    def _remember(self, key: str, vector: np.ndarray) -> None:
        self._pending[key] = vector
        self._pending.move_to_end(key)
        if len(self._pending) > _PENDING_VECTORS:
            self._pending.popitem(last=False)

    def _neighbours(self, scope: str, vector: np.ndarray, now: float) -> list[tuple[_Entry, float]]:
        """The nearest entries of `scope`, each credited with its closeness to this query."""
        w = self.config.eviction
        floor = self.threshold - w.related_band
        with self._lock:
            index = self._indexes.get(scope)
            found = index.search(vector, self.config.candidates) if index is not None else []
            neighbours = [(self._entries[i], similarity) for i, similarity in found]
            for entry, similarity in neighbours:
                relatedness = min(1.0, max(0.0, (similarity - floor) / (1.0 - floor)))
                entry.usage.credit(relatedness, now, w.closeness_half_life_s)
        return neighbours

    # --- writing (worker threads) -------------------------------------------------------------

    def _insert(self, scope: str, key: str, question: str, answer: str, vector: np.ndarray) -> None:
        now = self._clock()
        with self._lock:
            replaced = self._by_key.get(key)
            if replaced is not None:
                self._remove([replaced])
            if len(self._entries) >= self.config.capacity:
                self._evict(now)
            entry_id = self._persist_new(scope, key, question, answer, vector, now)
            self._add(scope, [_Entry(entry_id, scope, key, question, answer, Usage(now, now))], vector.reshape(1, -1))

    def _add(self, scope: str, entries: list[_Entry], vectors: np.ndarray) -> None:
        for entry in entries:
            self._entries[entry.id] = entry
            self._by_key[entry.key] = entry.id
        index = self._indexes.get(scope)
        if index is None:
            index = self._indexes[scope] = VectorIndex(
                self.embedder.dim, self.config.approx_index_min_entries, self.config.ivf_nprobe
            )
        index.add([e.id for e in entries], vectors)

    def _reset(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self._indexes.clear()
        self._pending.clear()

    def _evict(self, now: float) -> None:
        entries = list(self._entries.values())
        expired = [e.id for e in entries if not self._fresh(e, now)]
        if expired:
            self._remove(expired)
            self._counts["expired"] += len(expired)
            return
        count = max(1, int(self.config.capacity * self.config.evict_fraction))
        chosen = [entries[i].id for i in victims(self._policy, [e.usage for e in entries], count, now)]
        self._remove(chosen)
        self._counts["evictions"] += len(chosen)

    def _remove(self, entry_ids: list[int]) -> None:
        by_scope: dict[str, list[int]] = {}
        for entry_id in entry_ids:
            entry = self._entries.pop(entry_id)
            del self._by_key[entry.key]
            by_scope.setdefault(entry.scope, []).append(entry_id)
        for scope, ids in by_scope.items():
            index = self._indexes[scope]
            index.remove(ids)
            if not len(index):
                del self._indexes[scope]
        if self.db is not None:
            with self.db.session() as session:
                CacheRepository(session).delete(entry_ids)

    # --- persistence --------------------------------------------------------------------------

    def _persist_new(self, scope: str, key: str, question: str, answer: str, vector: np.ndarray, now: float) -> int:
        if self.db is None:
            return next(self._ids)
        row = CacheEntry(
            scope=scope, key=key, question=question, answer=answer, embedder=self.embedder.name,
            embedding=vector.astype(np.float32).tobytes(), hits=0, created_at=_datetime(now),
        )
        with self.db.session() as session:
            return CacheRepository(session).add(row).id

    def _persist_hit(self, entry_id: int, now: float) -> None:
        assert self.db is not None
        with self.db.session() as session:
            CacheRepository(session).record_hit(entry_id, _datetime(now))

    def load(self) -> int:
        """Rebuild the entries and indexes from the database (at start-up); returns the count.

        Rows embedded by another model are deleted: their vectors mean nothing to this one."""
        if self.db is None:
            return 0
        now = self._clock()
        with self.db.session() as session:
            rows = CacheRepository(session).all()
        stale = [r.id for r in rows if r.embedder != self.embedder.name or now - r.created_at.timestamp() >= self.config.ttl_s]
        by_scope: dict[str, list[CacheEntry]] = {}
        for row in rows:
            by_scope.setdefault(row.scope, []).append(row)
        stale_ids = set(stale)
        with self._lock:
            self._reset()
            for scope, scope_rows in by_scope.items():
                live = [r for r in scope_rows if r.id not in stale_ids]
                if live:
                    self._add(scope, [_entry_of(r) for r in live], np.stack([_vector_of(r) for r in live]))
            with self.db.session() as session:
                CacheRepository(session).delete(stale)
            while len(self._entries) > self.config.capacity:
                self._evict(now)
        log.info("response cache: loaded %d entries, dropped %d stale", len(self._entries), len(stale))
        return len(self._entries)

    # --- administration -----------------------------------------------------------------------

    def delete(self, entry_id: int) -> bool:
        with self._lock:
            if entry_id not in self._entries:
                return False
            self._remove([entry_id])
            return True

    def flush(self) -> int:
        with self._lock:
            count = len(self._entries)
            self._reset()
            if self.db is not None:
                with self.db.session() as session:
                    CacheRepository(session).delete_all()
            return count

    def purge_expired(self) -> int:
        now = self._clock()
        with self._lock:
            expired = [e.id for e in self._entries.values() if not self._fresh(e, now)]
            if expired:
                self._remove(expired)
                self._counts["expired"] += len(expired)
            return len(expired)

    def entries(self, query: str = "", limit: int = 50) -> list[EntryView]:
        """Entries whose question contains `query` (normalized), most recently used first."""
        needle = normalize(query)
        with self._lock:
            matching = [e for e in self._entries.values() if needle in normalize(e.question)]
        matching.sort(key=lambda e: e.usage.last_used, reverse=True)
        return [
            EntryView(
                id=e.id, scope=e.scope, question=e.question, answer=e.answer, hits=e.usage.hits,
                created_at=_datetime(e.usage.created), last_used_at=_datetime(e.usage.last_used),
            )
            for e in matching[:limit]
        ]

    def stats(self) -> dict[str, object]:
        counts = self._counts
        lookups = counts["hits_exact"] + counts["hits_semantic"] + counts["misses"]
        latencies = np.asarray(self._latencies) * 1000.0
        return {
            "enabled": self.config.enabled,
            "embedder": self.embedder.name,
            "threshold": self.threshold,
            "entries": len(self._entries),
            "capacity": self.config.capacity,
            "hits_exact": counts["hits_exact"],
            "hits_semantic": counts["hits_semantic"],
            "misses": counts["misses"],
            "hit_rate": (counts["hits_exact"] + counts["hits_semantic"]) / lookups if lookups else 0.0,
            "rejected_verify": counts["rejected_verify"],
            "rejected_judge": counts["rejected_judge"],
            "skipped_pii": counts["skipped_pii"],
            "evictions": counts["evictions"],
            "expired": counts["expired"],
            "lookup_ms_p50": float(np.percentile(latencies, 50)) if latencies.size else 0.0,
            "lookup_ms_p99": float(np.percentile(latencies, 99)) if latencies.size else 0.0,
        }


def _entry_of(row: CacheEntry) -> _Entry:
    last_used = row.last_hit_at or row.created_at
    usage = Usage(created=row.created_at.timestamp(), last_used=last_used.timestamp(), hits=row.hits)
    return _Entry(row.id, row.scope, row.key, row.question, row.answer, usage)


def _vector_of(row: CacheEntry) -> np.ndarray:
    return np.frombuffer(row.embedding, dtype=np.float32)


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, timezone.utc)
