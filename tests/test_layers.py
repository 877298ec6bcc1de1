"""Dependencies point one way: bot/ -> assistant/ -> chat/ -> cache/, engine/, storage/ (web/ -> chat/
too); the engine imports nothing of ours. Read from the source, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

# Each part of the app, and the parts it may import.
ALLOWED: dict[str, set[str]] = {
    "engine": set(),
    "storage": set(),
    "settings": {"engine"},  # EngineConfig's defaults are the engine section's
    "cache": {"engine", "settings", "storage"},
    "chat": {"cache", "engine", "settings", "storage"},
    "assistant": {"cache", "chat", "engine", "settings", "storage"},
    "bot": {"assistant", "chat", "settings", "storage"},
    "web": {"cache", "chat", "engine", "settings"},
    "logging_setup": {"cache", "settings"},
    "app": {"engine", "logging_setup", "settings", "web", "wiring"},  # engine: its process starts first
}
PARTS = set(ALLOWED) | {"wiring"}


def imported_parts(path: Path) -> set[str]:
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            parts |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts.add(node.module.split(".")[0])
    return parts & PARTS


def sources(part: str) -> list[Path]:
    folder = ROOT / part
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [ROOT / f"{part}.py"]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_point_one_way(part: str) -> None:
    for path in sources(part):
        wrong = imported_parts(path) - ALLOWED[part] - {part}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
