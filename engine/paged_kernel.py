"""Decode attention read in place from the paged KV pool on CPU: paged_attention.c, built with the
engine's other kernels (kernels.py).

Without it a decode bucket's blocks are gathered into a padded tensor for SDPA, every layer of every
step: a fresh allocation holding the bucket's whole context, written and read again. A decode
step of 8 sequences at 2,048 tokens of context is 1.5x faster with the kernel (bench/engine_bench.py).
"""

import torch

from . import kernels


def serves(device: torch.device, dtype: torch.dtype, num_heads: int, head_dim: int, block_size: int) -> bool:
    """Whether the kernel builds here and fits the model: float32 on CPU, within its buffers."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    library = kernels.library()
    return library is not None and bool(library.paged_decode_supports(num_heads, head_dim, block_size))


def decode_attention(
    q: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    table_starts: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_threads: int,
) -> None:
    """Writes rows [0, len(context_lens)) of `out` [tokens, heads, head_dim], from the same rows of
    `q` (its heads contiguous, its rows any stride apart): row r reads the block table at
    `block_tables[table_starts[r]]`, up to `context_lens[r]` keys, on `num_threads` OpenMP threads."""
    library = kernels.library()
    assert library is not None
    assert q.dtype == out.dtype == k_cache.dtype == v_cache.dtype == torch.float32
    assert q[0].is_contiguous() and q.shape == out.shape
    assert all(t.is_contiguous() for t in (out, k_cache, v_cache, block_tables, table_starts, context_lens))
    assert block_tables.dtype == table_starts.dtype == context_lens.dtype == torch.int64
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    library.paged_decode_attention(
        q.data_ptr(),
        q.stride(0),
        out.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        table_starts.data_ptr(),
        context_lens.data_ptr(),
        len(context_lens),
        num_kv_heads,
        q.shape[1] // num_kv_heads,
        head_dim,
        block_size,
        scale,
        num_threads,
    )
