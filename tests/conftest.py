from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Loopback only: the tests never reach past this machine, and a proxy must not intercept them.
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from storage import Database  # noqa: E402


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'test.db'}")
    database.upgrade()
    yield database
    database.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
