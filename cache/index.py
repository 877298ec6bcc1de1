"""Inner-product search over normalized vectors: exact while small, IVF past a size."""

from __future__ import annotations

import math

import faiss
import numpy as np


class VectorIndex:
    """FAISS with our own ids and deletion. Not thread-safe: the owner serializes calls."""

    def __init__(self, dim: int, approx_min_entries: int, nprobe: int) -> None:
        self.dim = dim
        self.approx_min_entries = approx_min_entries
        self.nprobe = nprobe
        self._vectors: dict[int, np.ndarray] = {}  # kept to retrain the IVF as the index grows
        self._trained_on = 0  # entries the IVF was trained on; 0 while flat
        self._index: faiss.Index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def __len__(self) -> int:
        return len(self._vectors)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._vectors

    @property
    def approximate(self) -> bool:
        return self._trained_on > 0

    def add(self, ids: list[int], vectors: np.ndarray) -> None:
        assert vectors.shape == (len(ids), self.dim) and vectors.dtype == np.float32
        assert not any(i in self._vectors for i in ids), "ids must be new"
        self._vectors.update(zip(ids, vectors, strict=True))
        if self._needs_training():
            self._rebuild()
        else:
            self._index.add_with_ids(vectors, np.asarray(ids, dtype=np.int64))

    def remove(self, ids: list[int]) -> None:
        for i in ids:
            del self._vectors[i]
        self._index.remove_ids(faiss.IDSelectorBatch(np.asarray(ids, dtype=np.int64)))

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to `k` (id, similarity), most similar first."""
        if not self._vectors:
            return []
        similarities, ids = self._index.search(vector.reshape(1, self.dim), min(k, len(self._vectors)))
        return [(int(i), float(s)) for i, s in zip(ids[0], similarities[0], strict=True) if i >= 0]

    def _needs_training(self) -> bool:
        size = len(self._vectors)
        # Retrain when the index has doubled: lists trained on a tenth of the data grow lopsided.
        return size >= self.approx_min_entries and size >= 2 * self._trained_on

    def _rebuild(self) -> None:
        ids = np.fromiter(self._vectors, dtype=np.int64, count=len(self._vectors))
        vectors = np.stack(list(self._vectors.values()))
        nlist = max(1, int(math.sqrt(len(ids))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        # k-means on a sample: 64 points a list place the centroids well and keep a retrain to seconds.
        sample = np.random.default_rng(0).choice(len(ids), size=min(len(ids), 64 * nlist), replace=False)
        index.train(vectors[sample])
        index.nprobe = self.nprobe
        index.add_with_ids(vectors, ids)
        self._index, self._trained_on = index, len(ids)
