"""Fixtures of the bot tests: the fake Feishu."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.feishu import FakeFeishu
from tests.support import free_port


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeFeishu]:
    server = FakeFeishu(free_port()).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _switches_off(fake: FakeFeishu) -> Iterator[None]:
    yield
    fake.refuse_cardkit = False
    fake.refuse_connections = False
    fake.rate_limit(0)
    fake.fail("", 0)
