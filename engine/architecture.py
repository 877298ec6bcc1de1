"""The network a checkpoint describes, read once from its config.json: the one place where the
model families the engine runs (Qwen3, Llama) differ."""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

MODEL_TYPES = ("qwen3", "llama")
# Both keep their frequencies fixed; "dynamic" and "longrope" change them with the sequence length.
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    # Qwen3 RMS-normalizes each head's query and key before RoPE; Llama does not.
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    # RoPE's inverse frequencies as float32 values, exactly as transformers computes them
    rope_inv_freq: tuple[float, ...]

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "Architecture":
        """Raises ValueError, naming the setting, for anything the engine cannot run exactly."""
        if config.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type is {config.model_type!r}; this engine runs {' and '.join(MODEL_TYPES)}")
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            raise ValueError("sliding-window attention layers are not supported")
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
        # transformers' configs fill these in when a checkpoint leaves them out
        assert config.num_key_value_heads is not None and config.vocab_size is not None
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings,
            qk_norm=config.model_type == "qwen3",
            attention_bias=bool(config.attention_bias),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            tie_word_embeddings=bool(config.tie_word_embeddings),
            rope_inv_freq=tuple(rope_inv_freq(config, head_dim).tolist()),
        )


def rope_inv_freq(config: PretrainedConfig, head_dim: int) -> torch.Tensor:
    """transformers 5 keeps RoPE settings under `rope_parameters`; older configs have `rope_theta`."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"RoPE type {rope_type!r} is not supported (only {', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    if rope_type != "default":
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        assert attention_scaling == 1.0, f"{rope_type} RoPE scales attention by {attention_scaling}"
        return inv_freq.float()
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the model config names no rope_theta")
    return 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
