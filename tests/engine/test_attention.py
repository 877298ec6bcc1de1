"""Decode attention over the paged KV pool, both ways (the kernel reading it in place, buckets
gathering it for SDPA), against attention computed over each sequence's own keys and values laid
out in order."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import LLMEngine, SamplingParams, paged_kernel
from engine.attention import paged_attention
from engine.kv_pool import cdiv
from engine.sequence import Sequence
from tests.engine.conftest import Checkpoint


@pytest.mark.parametrize("paged_kernel", [True, False], ids=["kernel", "buckets"])
# the kernel's shapes built with constant sizes (head_dim 32, 64, 128 in blocks of 16), and another
@pytest.mark.parametrize(("block_size", "head_dim"), [(4, 8), (16, 32), (16, 64), (16, 128)])
def test_decode_attention_serves_drafts_of_every_length(
    small_checkpoint: Checkpoint, paged_kernel: bool, block_size: int, head_dim: int
) -> None:
    engine = LLMEngine.from_pretrained(
        str(small_checkpoint.path), block_size=block_size, kv_cache_tokens=64 * block_size
    )
    runner = engine.core.runner
    assert runner.paged_kernel, "the kernel builds on CPU in float32"
    runner.paged_kernel = paged_kernel
    gen = torch.Generator().manual_seed(0)
    num_blocks, num_kv_heads = runner.num_blocks, 2
    num_heads = num_kv_heads * runner.num_queries_per_kv
    k_cache, v_cache = (torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    blocks = iter(torch.randperm(num_blocks, generator=gen).tolist())
    # (tokens computed before, draft tokens): no draft, a short one and a long one, all in 3 blocks
    seqs = []
    for i, (num_computed, num_draft) in enumerate(
        [(2 * block_size + 1, 3), (2 * block_size + 3, 0), (2 * block_size + 2, 1)]
    ):
        seq = Sequence(str(i), np.arange(num_computed + 1, dtype=np.int32), SamplingParams(), 0, i, 0)
        seq.num_computed_tokens = num_computed
        seq.draft_token_ids = [0] * num_draft
        seq.block_table = [next(blocks) for _ in range(cdiv(num_computed + 1 + num_draft, block_size))]
        seqs.append(seq)

    batch = runner.prepare([(seq, 1 + len(seq.draft_token_ids)) for seq in seqs])
    if paged_kernel:
        assert batch.meta.decode_rows is not None and batch.meta.decode_buckets == []
        assert batch.meta.decode_rows.context_lens.tolist() == [2 * block_size + n for n in (2, 3, 4, 5, 4, 3, 4)]
    else:
        assert batch.meta.decode_rows is None
        assert [(bucket.start, bucket.end, bucket.num_queries) for bucket in batch.meta.decode_buckets] == [(0, 7, 4)]
    q = torch.randn(len(batch.input_ids), num_heads, head_dim, generator=gen)
    unused = torch.empty(len(batch.input_ids), num_kv_heads, head_dim)
    metas = [batch.meta]
    if batch.meta.decode_rows is not None:  # the kernel's sequences shared among every thread too
        every_thread = dataclasses.replace(batch.meta.decode_rows, num_threads=runner.num_threads)
        metas.append(dataclasses.replace(batch.meta, decode_rows=every_thread))
    for meta in metas:
        out = paged_attention(q, unused, unused, k_cache, v_cache, meta, scale=head_dim**-0.5)
        assert_attends_causally(out, q, batch.sample_seqs, k_cache, v_cache)


def assert_attends_causally(
    out: torch.Tensor, q: torch.Tensor, seqs: list[Sequence], k_cache: torch.Tensor, v_cache: torch.Tensor
) -> None:
    """`out` is plain causal attention over each sequence's keys and values in position order."""
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    row = 0
    for seq in seqs:
        # the sequence's keys and values in position order, then plain causal attention
        slots = [
            seq.block_table[p // block_size] * block_size + p % block_size
            for p in range(len(seq.block_table) * block_size)
        ]
        keys, values = (
            cache.view(-1, num_kv_heads, head_dim)[slots].repeat_interleave(num_heads // num_kv_heads, 1)
            for cache in (k_cache, v_cache)
        )
        for position in range(seq.num_computed_tokens, seq.num_computed_tokens + 1 + len(seq.draft_token_ids)):
            scores = torch.einsum("hd,thd->ht", q[row], keys[: position + 1]) * head_dim**-0.5
            expected = torch.einsum("ht,thd->hd", scores.softmax(-1), values[: position + 1])
            torch.testing.assert_close(out[row], expected)
            row += 1
    assert row == len(q)


def test_without_a_compiler_decodes_gather_for_sdpa_and_greedy_steps_take_the_logits() -> None:
    code = (
        "import torch; from engine import paged_kernel; from engine.greedy_head import GreedyHead; "
        "print(paged_kernel.serves(torch.device('cpu'), torch.float32, 8, 64, 16), GreedyHead.serves(torch.ones(4, 2)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PATH": ""},
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "False False"
    assert "no C compiler (cc) for the engine's CPU kernels: decode attention gathers the KV blocks for SDPA" in (
        result.stderr
    )


def kernels_in_a_process(cache_home: Path) -> subprocess.CompletedProcess[str]:
    """A fresh process's engine kernels, with `cache_home` as its XDG cache folder."""
    code = "from engine import kernels; print(kernels.library() is not None)"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "XDG_CACHE_HOME": str(cache_home)},
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=True,
    )


def test_the_kernels_are_built_once_then_loaded_from_the_cache_folder(tmp_path: Path) -> None:
    assert kernels_in_a_process(tmp_path).stdout.strip() == "True"
    (built,) = (tmp_path / "clawdbot").iterdir()
    built_at = built.stat().st_mtime_ns
    assert kernels_in_a_process(tmp_path).stdout.strip() == "True"
    assert list((tmp_path / "clawdbot").iterdir()) == [built] and built.stat().st_mtime_ns == built_at
    # a cache folder that cannot be made: built for the process alone
    (tmp_path / "a-file").write_text("")
    result = kernels_in_a_process(tmp_path / "a-file")
    assert result.stdout.strip() == "True" and result.stderr == ""
    # a relative one is ignored, as the XDG spec has it: nothing is written where the app runs
    assert kernels_in_a_process(Path("relative")).stdout.strip() == "True"
    assert not (Path(__file__).parents[2] / "relative").exists()


def test_the_kernel_serves_float32_on_cpu_within_its_buffers() -> None:
    cpu = torch.device("cpu")
    assert paged_kernel.serves(cpu, torch.float32, num_heads=32, head_dim=128, block_size=16)
    assert not paged_kernel.serves(cpu, torch.bfloat16, num_heads=32, head_dim=128, block_size=16)
    assert not paged_kernel.serves(cpu, torch.float32, num_heads=32, head_dim=512, block_size=16)
    assert not paged_kernel.serves(torch.device("cuda"), torch.float32, num_heads=32, head_dim=128, block_size=16)
