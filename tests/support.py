"""Helpers shared by test folders (each folder's conftest.py is its own module named conftest)."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / "tests" / "data"  # files the tests read, described in its README

# The demo model is seeded, so one copy serves every test run on this machine.
SHARED_DATA_DIR = Path(tempfile.gettempdir()) / "clawdbot-test-data"


# A PostgreSQL server the storage tests may create databases on (SQLAlchemy URL).
POSTGRES_URL = os.environ.get("CLAWDBOT_TEST_POSTGRES_URL", "")


@contextmanager
def database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty database on `backend` ("sqlite" or "postgresql"), dropped after."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server: set CLAWDBOT_TEST_POSTGRES_URL (.ci/start-postgres starts one)")
    server = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"test_{uuid.uuid4().hex}"
    with server.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        server.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Waits until `condition()` holds: for state that has no event to wait on."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - the state is the app's, with no event to wait on
            await asyncio.sleep(0.01)


class Clock:
    """A clock the test moves by hand, so TTL and ageing need no sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
