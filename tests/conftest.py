from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]
# Loopback only: the tests never reach past this machine, and a proxy must not intercept them.
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as app.py sets it

from storage import Database  # noqa: E402
from support import free_port  # noqa: E402,F401  (kept importable as conftest.free_port)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'test.db'}")
    database.upgrade()
    yield database
    database.close()
