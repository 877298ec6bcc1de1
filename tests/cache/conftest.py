from __future__ import annotations

import pytest

from cache.embeddings import Embedder, SentenceTransformerEmbedder
from tests.support import Clock


@pytest.fixture(scope="session")
def minilm() -> Embedder:
    return SentenceTransformerEmbedder("all-MiniLM-L6-v2")


@pytest.fixture
def clock() -> Clock:
    return Clock()
