"""Starting the app for the web tests: one process per test module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.app_process import AppProcess
from tests.support import free_port

# The demo model rarely stops by itself: short greedy replies keep the tests fast and repeatable.
BASE_CONFIG: dict[str, dict[str, Any]] = {
    "generation": {"temperature": 0, "max_tokens": 8},
    "logging": {"level": "WARNING"},
}


@contextmanager
def running_app(tmp_path_factory: pytest.TempPathFactory, overrides: dict[str, dict[str, Any]]) -> Iterator[AppProcess]:
    config = {section: dict(values) for section, values in BASE_CONFIG.items()}
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    workdir: Path = tmp_path_factory.mktemp("app")
    app = AppProcess(workdir, free_port(), config).start()
    try:
        yield app
    finally:
        code, _ = app.stop()
        assert code == 0, app.log()
