"""The cache's rows in the database, so that entries survive a restart. Each method is one unit of
work and waits on the database: callers run it in a worker thread. Without a database (a
benchmark's in-memory cache) it only hands out ids."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import numpy as np

from cache.entries import Entry
from cache.eviction import Usage
from storage import CacheEntry, CacheRepository, Database


class CacheStore:
    def __init__(self, db: Database | None, embedder_name: str) -> None:
        self.db = db
        self.embedder_name = embedder_name
        self._ids = itertools.count(1)

    def insert(
        self,
        scope: str,
        key: str,
        question: str,
        answer: str,
        cut_at: int | None,
        vector: np.ndarray | None,
        now: float,
    ) -> int:
        """The new row's id; a row of the same key goes in the same unit of work."""
        if self.db is None:
            return next(self._ids)
        row = CacheEntry(
            scope=scope,
            key=key,
            question=question,
            answer=answer,
            cut_at=cut_at,
            embedder=self.embedder_name,
            embedding=b"" if vector is None else vector.astype(np.float32).tobytes(),
            hits=0,
            created_at=_datetime(now),
        )
        with self.db.session() as session:
            repository = CacheRepository(session)
            repository.delete_key(key)
            return repository.add(row).id

    def record_hits(self, hits: list[tuple[int, float]]) -> None:
        """(entry id, when) of each hit, in one unit of work."""
        if self.db is None:
            return
        with self.db.session() as session:
            repository = CacheRepository(session)
            for entry_id, now in hits:
                repository.record_hit(entry_id, _datetime(now))

    def delete(self, entry_ids: list[int]) -> None:
        if self.db is None or not entry_ids:
            return
        with self.db.session() as session:
            CacheRepository(session).delete(entry_ids)

    def clear(self) -> None:
        if self.db is None:
            return
        with self.db.session() as session:
            CacheRepository(session).delete_all()

    def load(self, now: float, ttl_s: float) -> list[tuple[Entry, np.ndarray | None]]:
        """Every live entry with its question's vector (None: found by its L1 key only), oldest
        first. Rows embedded by another model mean nothing to this one, and expired rows are
        served by no one: both are deleted."""
        if self.db is None:
            return []
        with self.db.session() as session:
            repository = CacheRepository(session)
            rows = repository.all()
            live = [r for r in rows if r.embedder == self.embedder_name and _live(r, now, ttl_s)]
            repository.delete(sorted({r.id for r in rows} - {r.id for r in live}))
            return [(_entry_of(row), _vector_of(row)) for row in live]

    def changes(
        self, after_id: int, now: float, ttl_s: float
    ) -> tuple[set[int], list[tuple[Entry, np.ndarray | None]]]:
        """What other replicas did: the ids of every row this embedder's entries are (the ones
        gone from it were deleted), and the live rows added after `after_id`, oldest first."""
        if self.db is None:
            return set(), []
        with self.db.session() as session:
            repository = CacheRepository(session)
            ids = set(repository.ids(self.embedder_name))
            added = [row for row in repository.after(after_id, self.embedder_name) if _live(row, now, ttl_s)]
            return ids, [(_entry_of(row), _vector_of(row)) for row in added]


def _live(row: CacheEntry, now: float, ttl_s: float) -> bool:
    return now - row.created_at.timestamp() < ttl_s


def _vector_of(row: CacheEntry) -> np.ndarray | None:
    return np.frombuffer(row.embedding, dtype=np.float32) if row.embedding else None


def _entry_of(row: CacheEntry) -> Entry:
    last_used = row.last_hit_at or row.created_at
    usage = Usage(created=row.created_at.timestamp(), last_used=last_used.timestamp(), hits=row.hits)
    return Entry(row.id, row.scope, row.key, row.question, row.answer, row.cut_at, usage)


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)
