"""bench/benchmark.py: the workload it builds, and a --compare run at a tiny size so it keeps working."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support import ROOT, SHARED_DATA_DIR

BENCH = ROOT / "bench"


def load_bench_module(name: str) -> ModuleType:
    # By path, under a distinct name: bench/ is a folder of scripts, not a package on sys.path.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


workload = load_bench_module("workload")


@pytest.mark.parametrize("requests", [1, 5, 12, 200])
def test_scripts_add_up_to_the_requests_asked(requests: int) -> None:
    spec = workload.load_workload(BENCH / "workload.yaml")
    scripts = workload.build_scripts(spec, requests, max_copies=3)
    assert sum(script.requests for script in scripts) == requests
    assert all(script.copies <= 3 for script in scripts)
    assert scripts == workload.build_scripts(spec, requests, max_copies=3)


def test_the_mix_shares_the_requests() -> None:
    spec = workload.load_workload(BENCH / "workload.yaml")
    sent: Counter[str] = Counter()
    for script in workload.build_scripts(spec, 200, max_copies=8):
        sent[script.kind] += script.requests
    assert sent == {"faq": 70, "paraphrase": 30, "burst": 30, "multi_turn": 40, "long": 30}


def edited_workload(source: str, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of bench/`source` with `edit` applied to its data, written under `tmp_path`."""
    data = yaml.safe_load((BENCH / source).read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def test_a_workload_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    path = edited_workload("workload.yaml", tmp_path, lambda data: data["burst"].update(sizes=3))
    with pytest.raises(ValueError, match="sizes"):
        workload.load_workload(path)


def run_benchmark(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(BENCH / "benchmark.py"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_compare_at_a_tiny_size(tmp_path: Path) -> None:
    # shorter replies: what is checked here is the run, not the figures
    path = edited_workload("workload.yaml", tmp_path, lambda data: data.update(max_tokens=8))
    plot = tmp_path / "bench.png"

    figures = run_benchmark(
        "--compare",
        "--requests",
        "12",
        "--concurrency",
        "4",
        "--workload",
        str(path),
        "--data-dir",
        str(SHARED_DATA_DIR),
        "--plot",
        str(plot),
    )

    baseline, optimized = figures["baseline"], figures["optimized"]
    for side in (baseline, optimized):
        assert side["requests"] == 12 and side["errors"] == 0
        assert 0 < side["ttft_ms_p50"] <= side["latency_ms_p99"]
        assert side["requests_per_s"] > 0 and side["peak_rss_mb"] > 0
    assert baseline["engine_requests"] == 12
    assert baseline["exact_hits"] == baseline["semantic_hits"] == baseline["merged"] == 0
    assert baseline["prompt_tokens_reused"] == 0
    # the second turns of its conversations start from the first turns' KV blocks
    assert optimized["prompt_tokens_reused"] > 0
    assert optimized["engine_requests"] <= baseline["engine_requests"]
    assert set(figures["ratios"]) >= {"ttft_ms_p50", "requests_per_s", "engine_requests", "peak_rss_mb"}
    assert {claim["figure"] for claim in figures["claims"]} >= {
        "TTFT mean",
        "requests/s",
        "served without a model call",
    }
    assert plot.stat().st_size > 10_000


def test_remote_at_a_tiny_size(tmp_path: Path) -> None:
    path = edited_workload("workload.yaml", tmp_path, lambda data: data.update(max_tokens=8))
    figures = run_benchmark(
        "--remote", "--requests", "8", "--concurrency", "2", "--workload", str(path), "--data-dir", str(SHARED_DATA_DIR)
    )
    local, remote = figures["optimized"], figures["remote"]
    for side in (local, remote):
        assert side["requests"] == 8 and side["errors"] == 0 and side["engine_requests"] > 0
    # the engine box's prefix cache, reported through usage.prompt_tokens_details.cached_tokens
    assert remote["prompt_tokens_reused"] > 0
    assert set(figures["http_hop"]) == {"requests_per_s_ratio", "output_tokens_per_s_ratio", "ttft_ms_p50_added"}


def test_the_peer_workload_never_asks_the_same_thing_twice() -> None:
    spec = workload.load_workload(BENCH / "peer_workload.yaml")
    messages = [message for script in workload.build_scripts(spec, 200, max_copies=8) for message in script.turns]
    assert len(messages) == 200 and len(set(messages)) == 200


def test_a_mix_without_its_section_is_refused(tmp_path: Path) -> None:
    path = edited_workload("peer_workload.yaml", tmp_path, lambda data: data["mix"].update(faq=0.5))
    with pytest.raises(ValueError, match="faq needs a faq section"):
        workload.load_workload(path)


@pytest.mark.slow
def test_against_transformers_serve_at_a_tiny_size() -> None:
    figures = run_benchmark(
        "--peer", "transformers-serve", "--requests", "6", "--concurrency", "2", "--data-dir", str(SHARED_DATA_DIR)
    )
    peer, ours = figures["transformers serve"], figures["optimized"]
    for side in (peer, ours):
        assert side["requests"] == 6 and side["errors"] == 0 and side["output_tokens_per_s"] > 0
    assert ours["exact_hits"] == ours["semantic_hits"] == 0  # every message is new
    assert set(figures["ratios"]) >= {"ttft_ms_p50", "output_tokens_per_s"}
