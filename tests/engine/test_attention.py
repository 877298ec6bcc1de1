"""Decode attention over the paged KV pool, both ways (the kernel reading it in place, buckets
gathering it for SDPA), against attention computed over each sequence's own keys and values laid
out in order."""

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

BLOCK = 4


@pytest.mark.parametrize("paged_kernel", [True, False], ids=["kernel", "buckets"])
def test_decode_attention_serves_drafts_of_every_length(small_checkpoint: Checkpoint, paged_kernel: bool) -> None:
    engine = LLMEngine.from_pretrained(str(small_checkpoint.path), block_size=BLOCK, kv_cache_tokens=64 * BLOCK)
    runner = engine.core.runner
    assert runner.paged_kernel, "the kernel builds on CPU in float32"
    runner.paged_kernel = paged_kernel
    gen = torch.Generator().manual_seed(0)
    num_blocks, num_kv_heads, head_dim = runner.num_blocks, 2, 8
    num_heads = num_kv_heads * runner.num_queries_per_kv
    k_cache, v_cache = (torch.randn(num_blocks, BLOCK, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    blocks = iter(torch.randperm(num_blocks, generator=gen).tolist())
    # (tokens computed before, draft tokens): no draft, a short one and a long one, all in 3 blocks
    seqs = []
    for i, (num_computed, num_draft) in enumerate([(2 * BLOCK + 1, 3), (2 * BLOCK + 3, 0), (2 * BLOCK + 2, 1)]):
        seq = Sequence(str(i), np.arange(num_computed + 1, dtype=np.int32), SamplingParams(), 0, i, 0)
        seq.num_computed_tokens = num_computed
        seq.draft_token_ids = [0] * num_draft
        seq.block_table = [next(blocks) for _ in range(cdiv(num_computed + 1 + num_draft, BLOCK))]
        seqs.append(seq)

    batch = runner.prepare([(seq, 1 + len(seq.draft_token_ids)) for seq in seqs])
    if paged_kernel:
        assert batch.meta.decode_rows is not None and batch.meta.decode_buckets == []
        assert batch.meta.decode_rows.context_lens.tolist() == [10, 11, 12, 13, 12, 11, 12]
    else:
        assert batch.meta.decode_rows is None
        assert [(bucket.start, bucket.end, bucket.num_queries) for bucket in batch.meta.decode_buckets] == [(0, 7, 4)]
    q = torch.randn(len(batch.input_ids), num_heads, head_dim, generator=gen)
    unused = torch.empty(len(batch.input_ids), num_kv_heads, head_dim)
    out = paged_attention(q, unused, unused, k_cache, v_cache, batch.meta, scale=head_dim**-0.5)

    row = 0
    for seq in batch.sample_seqs:
        # the sequence's keys and values in position order, then plain causal attention
        slots = [seq.block_table[p // BLOCK] * BLOCK + p % BLOCK for p in range(len(seq.block_table) * BLOCK)]
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


def test_the_kernel_serves_float32_on_cpu_within_its_buffers() -> None:
    cpu = torch.device("cpu")
    assert paged_kernel.serves(cpu, torch.float32, num_heads=32, head_dim=128, block_size=16)
    assert not paged_kernel.serves(cpu, torch.bfloat16, num_heads=32, head_dim=128, block_size=16)
    assert not paged_kernel.serves(cpu, torch.float32, num_heads=32, head_dim=512, block_size=16)
    assert not paged_kernel.serves(torch.device("cuda"), torch.float32, num_heads=32, head_dim=128, block_size=16)
