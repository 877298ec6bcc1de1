from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import paged_kernel


@dataclass
class PrefillSpan:
    """One sequence computing several tokens this step: rows [start, end) of the flat batch."""

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor
    mask: torch.Tensor | None  # [end - start, context_len]; None when nothing was computed before


@dataclass
class DecodeBucket:
    """Sequences computing their last token and its draft tokens, if any (speculation.py). Their
    block tables are padded to the longest, so buckets hold similar lengths and bound the gathered
    KV; their queries are padded to the most any of them has, a padded query repeating its
    sequence's last, so that one attention call serves the bucket. Its queries are rows
    [start, end) of the flat batch."""

    start: int
    end: int
    block_tables: torch.Tensor  # [num_seqs, max_blocks], padded with block 0
    num_queries: int  # per sequence, padding included
    query_rows: torch.Tensor  # [num_seqs * num_queries]: the flat batch row of each query
    real_queries: torch.Tensor  # where rows start..end-1 are in `query_rows`: padding left out
    # [num_seqs, 1, num_queries * query heads per KV head, max_blocks * block_size]: each query
    # sees its sequence's KV up to its own position
    mask: torch.Tensor


@dataclass
class DecodeRows:
    """The decodes' queries for the paged kernel (paged_kernel.py), rows [0, len(context_lens)) of
    the flat batch: each reads its sequence's KV in place, up to its own position."""

    block_tables: torch.Tensor  # the decoding sequences' block tables, one after another
    table_starts: torch.Tensor  # [rows]: where the row's sequence's table starts in `block_tables`
    context_lens: torch.Tensor  # [rows]: the keys the row sees, its own included
    num_threads: int  # the kernel's, whatever the layers' (model_runner.py)


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the KV pool and what each attends to. The flat batch holds
    the decodes first, each sequence's query tokens together, then the prefill spans. The decodes
    are either `decode_rows`, where the paged kernel is built, or `decode_buckets`."""

    slot_mapping: torch.Tensor
    decode_rows: DecodeRows | None
    decode_buckets: list[DecodeBucket]
    prefills: list[PrefillSpan]


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    num_kv_heads, head_dim = k.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., num_blocks] block ids -> [..., num_kv_heads, num_blocks * block_size, head_dim]."""
    # index_select copies whole blocks (memcpy on CPU); indexing with the table, `cache[block_table]`,
    # copies element by element: 431 against 113 us for 8 x 800 tokens of SmolLM2's KV heads.
    blocks = cache.index_select(0, block_table.flatten()).view(*block_table.shape, *cache.shape[1:])
    return blocks.flatten(-4, -3).transpose(-3, -2)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim], already stored in the pool: views
    of the layer's projections (model.py), each head contiguous, the rows further apart."""
    out = q.new_empty(q.shape)
    num_heads, head_dim = q.shape[-2:]
    num_kv_heads = k.shape[-2]
    if meta.decode_rows is not None:
        rows = meta.decode_rows
        paged_kernel.decode_attention(
            q, out, k_cache, v_cache, rows.block_tables, rows.table_starts, rows.context_lens, scale, rows.num_threads
        )
    for bucket in meta.decode_buckets:
        # The query heads sharing a KV head, at each of the sequence's positions, become that KV
        # head's query rows: GQA without repeating the cache, and one call for all the drafts.
        num_seqs, num_queries = bucket.block_tables.shape[0], bucket.num_queries
        group = num_heads // num_kv_heads
        grouped_q = (
            q.index_select(0, bucket.query_rows)
            .view(num_seqs, num_queries, num_kv_heads, group, head_dim)
            .transpose(1, 2)
            .reshape(num_seqs, num_kv_heads, num_queries * group, head_dim)
        )
        attended = F.scaled_dot_product_attention(
            grouped_q,
            gather_blocks(k_cache, bucket.block_tables),
            gather_blocks(v_cache, bucket.block_tables),
            attn_mask=bucket.mask,
            scale=scale,
        )
        attended = attended.view(num_seqs, num_kv_heads, num_queries, group, head_dim).transpose(1, 2)
        out[bucket.start : bucket.end] = attended.reshape(-1, num_heads, head_dim).index_select(0, bucket.real_queries)
    for span in meta.prefills:
        # [1, heads, tokens, head_dim]: with a batch dimension SDPA takes its fused CPU kernel;
        # without one it falls back to the math path, 9x slower for an 800-token prompt.
        span_q = q[span.start : span.end].transpose(0, 1)[None]
        if span.mask is None:
            span_k, span_v = k[span.start : span.end].transpose(0, 1), v[span.start : span.end].transpose(0, 1)
        else:
            span_k = gather_blocks(k_cache, span.block_table)[:, : span.context_len]
            span_v = gather_blocks(v_cache, span.block_table)[:, : span.context_len]
        out[span.start : span.end] = F.scaled_dot_product_attention(
            span_q,
            span_k[None],
            span_v[None],
            attn_mask=span.mask,
            is_causal=span.mask is None,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
    return out
