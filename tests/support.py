"""Helpers shared by test folders (each folder's conftest.py is its own module named conftest)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The demo model is seeded, so one copy serves every test run on this machine.
SHARED_DATA_DIR = Path(tempfile.gettempdir()) / "clawdbot-test-data"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Clock:
    """A clock the test moves by hand, so TTL and ageing need no sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
