from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config

from .attention import AttentionMetadata, paged_attention, store_kv


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


class MergedLinear(nn.Linear):
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


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [tokens, 1, head_dim], computed exactly as transformers' default RoPE."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float, device=positions.device) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Qwen3Attention(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = num_kv_heads(config)
        self.head_dim = head_dim(config)
        self.scale = self.head_dim**-0.5
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size},
            bias=config.attention_bias,
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

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
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim)), cos, sin)
        k = apply_rotary(self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim)), cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.view(num_tokens, -1))


class Qwen3MLP(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        assert config.hidden_act == "silu", f"unsupported activation {config.hidden_act}"
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, {"gate_proj": size, "up_proj": size}, bias=False)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

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


class Qwen3Model(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(head_dim(config), rope_theta(config))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, k_cache, v_cache in zip(self.layers, kv_cache[0], kv_cache[1], strict=True):
            x = layer(x, cos, sin, meta, k_cache, v_cache)
        return self.norm(x)


class Qwen3ForCausalLM(nn.Module):
    """The Qwen3 forward over a flat, ragged batch whose KV lives in the paged pool.

    Parameter names follow the transformers checkpoints; q/k/v and gate/up are merged, and
    `packed_modules_mapping` tells the loader where their checkpoint tensors go.
    """

    packed_modules_mapping: ClassVar[dict[str, tuple[str, str]]] = {
        "q_proj": ("qkv_proj", "q_proj"),
        "k_proj": ("qkv_proj", "k_proj"),
        "v_proj": ("qkv_proj", "v_proj"),
        "gate_proj": ("gate_up_proj", "gate_proj"),
        "up_proj": ("gate_up_proj", "up_proj"),
    }

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            raise ValueError("sliding-window attention layers are not supported")
        self.config = config
        self.head_dim = head_dim(config)
        self.num_kv_heads = num_kv_heads(config)
        self.model = Qwen3Model(config)
        self.tie_word_embeddings = bool(config.tie_word_embeddings)
        self.lm_head = (
            None if self.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, kv_cache)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)


def head_dim(config: Qwen3Config) -> int:
    return config.head_dim or config.hidden_size // config.num_attention_heads


def num_kv_heads(config: Qwen3Config) -> int:
    # Qwen3Config fills it in from num_attention_heads when a checkpoint leaves it out.
    assert config.num_key_value_heads is not None
    return config.num_key_value_heads


def rope_theta(config: Qwen3Config) -> float:
    """transformers 5 keeps RoPE settings under `rope_parameters`; older configs have `rope_theta`."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"RoPE type {rope_type!r} is not supported (only the default Qwen3 RoPE)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the model config names no rope_theta")
    return float(theta)
