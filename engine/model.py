from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .architecture import Architecture
from .attention import AttentionMetadata, paged_attention, store_kv
from .cpu_linear import linear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the same float32 round trip as transformers, so greedy outputs match to the token
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


class Linear(nn.Linear):
    mkl_max_rows = 0  # see cpu_linear: oneDNN computes every step on a CPU until ModelRunner times both

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.mkl_max_rows)


class Embedding(nn.Module):
    """nn.Embedding without its random init, which the checkpoint overwrites anyway: on the meta
    device, where the model is built, that init imports torch._dynamo, 1.6-2.5 s of every engine's
    start on 2 cores."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class MergedLinear(Linear):
    """Several projections of the same input in one matmul; `shards` maps each checkpoint
    projection to its rows."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shards: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, size in shard_sizes.items():
            self.shards[name] = (offset, size)
            offset += size

    def load_shard(self, param: torch.Tensor, shard: str, weight: torch.Tensor) -> None:
        offset, size = self.shards[shard]
        assert weight.shape[0] == size, f"{shard}: expected {size} rows, got {tuple(weight.shape)}"
        param.data.narrow(0, offset, size).copy_(weight)


class HeadsRMSNorm(RMSNorm):
    """Qwen3's q_norm and k_norm in one: each query and key head normalized over head_dim, the
    query heads by q_norm's weight and the key heads by k_norm's."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__(head_dim, eps)
        self.weight = nn.Parameter(torch.ones(num_heads + num_kv_heads, head_dim))
        self.shards = {"q_norm": (0, num_heads), "k_norm": (num_heads, num_kv_heads)}

    def load_shard(self, param: torch.Tensor, shard: str, weight: torch.Tensor) -> None:
        offset, size = self.shards[shard]
        assert weight.shape == param.shape[1:], f"{shard}: expected {tuple(param.shape[1:])}, got {tuple(weight.shape)}"
        param.data.narrow(0, offset, size).copy_(weight)  # each of the heads takes the one vector


# modules whose parameters hold several checkpoint tensors (CausalLM.packed_modules_mapping)
MERGED_MODULES = (MergedLinear, HeadsRMSNorm)


class RotaryEmbedding(nn.Module):
    def __init__(self, inv_freq: tuple[float, ...]) -> None:
        super().__init__()
        # Numbers, not a buffer: the model is built on the meta device and cast to its serving
        # dtype, and the frequencies must stay float32 (transformers moves its copy every step too).
        self.inv_freq = inv_freq

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [tokens, 1, head_dim], computed exactly as transformers' RoPE."""
        inv_freq = torch.tensor(self.inv_freq, dtype=torch.float, device=positions.device)
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.scale = self.head_dim**-0.5
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            arch.hidden_size,
            {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size},
            bias=arch.attention_bias,
        )
        self.o_proj = Linear(self.q_size, arch.hidden_size, bias=arch.attention_bias)
        self.qk_norm = (
            HeadsRMSNorm(self.num_heads, self.num_kv_heads, self.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # The query and key heads side by side, normalized and turned together: each head is a row
        # of its own, so each op computes the same values as for q and k apart, in one call, not two.
        # A small model's layer is mostly such calls: the demo's forward of 7 decodes and a 40-token
        # prefill took 0.95x the time (1,000 calls alternated with the two-call forward, 3 runs).
        qk = qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm is not None:
            qk = self.qk_norm(qk)
        q, k = apply_rotary(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.view(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        size = arch.intermediate_size
        self.gate_up_proj = MergedLinear(arch.hidden_size, {"gate_proj": size, "up_proj": size}, bias=arch.mlp_bias)
        self.down_proj = Linear(size, arch.hidden_size, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.self_attn = Attention(arch)
        self.mlp = MLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.embed_tokens = Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary = RotaryEmbedding(arch.rope_inv_freq)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, k_cache, v_cache in zip(self.layers, kv_cache[0], kv_cache[1], strict=True):
            x = layer(x, cos, sin, meta, k_cache, v_cache)
        return self.norm(x)


class CausalLM(nn.Module):
    """A Qwen3 or Llama forward (`Architecture` holds their differences) over a flat, ragged batch
    whose KV lives in the paged pool.

    Parameter names follow the transformers checkpoints; q/k/v and gate/up are merged, and
    `packed_modules_mapping` tells the loader where their checkpoint tensors go.
    """

    packed_modules_mapping: ClassVar[dict[str, tuple[str, str]]] = {
        "q_proj": ("qkv_proj", "q_proj"),
        "k_proj": ("qkv_proj", "k_proj"),
        "v_proj": ("qkv_proj", "v_proj"),
        "gate_proj": ("gate_up_proj", "gate_proj"),
        "up_proj": ("gate_up_proj", "up_proj"),
        "q_norm": ("qk_norm", "q_norm"),
        "k_norm": ("qk_norm", "k_norm"),
    }

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.arch = arch
        self.model = DecoderModel(arch)
        self.lm_head = None if arch.tie_word_embeddings else Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.lm_head_mkl_max_rows = 0  # compute_logits' choice, as Linear.mkl_max_rows

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, kv_cache)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.lm_head_weight, mkl_max_rows=self.lm_head_mkl_max_rows)
