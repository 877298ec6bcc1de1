"""The cache's entries in memory: by id, by L1 key, and one vector index per scope."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cache.eviction import Usage
from cache.index import VectorIndex


@dataclass
class Entry:
    id: int
    scope: str
    key: str
    question: str
    answer: str
    cut_at: int | None  # the max_tokens the model's answer was cut at; None: the model ended it
    usage: Usage


class EntryTable:
    """Not thread-safe: its owner serializes every call."""

    def __init__(self, dim: int, approx_index_min_entries: int, ivf_nprobe: int) -> None:
        self.dim = dim
        self.approx_index_min_entries = approx_index_min_entries
        self.ivf_nprobe = ivf_nprobe
        self._entries: dict[int, Entry] = {}
        self._by_key: dict[str, int] = {}
        self._indexes: dict[str, VectorIndex] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def get(self, entry_id: int) -> Entry | None:
        return self._entries.get(entry_id)

    def by_key(self, key: str) -> Entry | None:
        entry_id = self._by_key.get(key)
        return None if entry_id is None else self._entries[entry_id]

    def add(self, entries: list[Entry], vectors: np.ndarray | None) -> None:
        """`entries` of one scope, with their questions' vectors; None for entries found by their
        L1 key only."""
        [scope] = {entry.scope for entry in entries}
        for entry in entries:
            assert entry.key not in self._by_key, "replace an entry by removing the old one first"
            self._entries[entry.id] = entry
            self._by_key[entry.key] = entry.id
        if vectors is None:
            return
        index = self._indexes.get(scope)
        if index is None:
            index = self._indexes[scope] = VectorIndex(self.dim, self.approx_index_min_entries, self.ivf_nprobe)
        index.add([entry.id for entry in entries], vectors)

    def remove(self, entry_ids: list[int]) -> None:
        by_scope: dict[str, list[int]] = {}
        for entry_id in entry_ids:
            entry = self._entries.pop(entry_id)
            del self._by_key[entry.key]
            by_scope.setdefault(entry.scope, []).append(entry_id)
        for scope, ids in by_scope.items():
            index = self._indexes.get(scope)
            indexed = [entry_id for entry_id in ids if index is not None and entry_id in index]
            if not indexed:
                continue
            assert index is not None
            index.remove(indexed)
            if not len(index):
                del self._indexes[scope]

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self._indexes.clear()

    def holds(self, scope: str) -> bool:
        """Whether `scope` has an entry L2 can find: a scope's index goes when its last vector does."""
        return scope in self._indexes

    def nearest(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        """Up to `k` entries of `scope` with their similarity to `vector`, most similar first."""
        index = self._indexes.get(scope)
        if index is None:
            return []
        return [(self._entries[entry_id], similarity) for entry_id, similarity in index.search(vector, k)]
