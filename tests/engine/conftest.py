import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tests.models import IM_END, chained_model

# The parity configs: GQA 1:1 and 4:1, tied and untied embeddings, head_dim != hidden/heads; Qwen3
# and Llama (no q/k norm; biases; llama3 RoPE scaling, its original length short enough to matter).
PARITY_CONFIGS: dict[str, dict[str, Any]] = {
    "gqa1-tied": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        tie_word_embeddings=True,
    ),
    "gqa4-untied-hd32": dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
    ),
    "gqa4-tied-hd48-bias": dict(
        vocab_size=777,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=48,
        tie_word_embeddings=True,
        attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "llama-gqa3-tied": dict(
        model_type="llama",
        vocab_size=600,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    ),
    "llama3-rope-untied-bias": dict(
        model_type="llama",
        vocab_size=700,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}

# What the bigram checkpoint emits after its trigger token, then <|im_end|>.
BIGRAM_TEXT = "你好，世界！流式输出测试：龘𠀀😀完毕。"


CausalLM = Qwen3ForCausalLM | LlamaForCausalLM


def tiny_model(seed: int = 0, model_type: str = "qwen3", **overrides: Any) -> CausalLM:
    """A seeded transformers model of `model_type` (qwen3 or llama)."""
    options: dict[str, Any] = dict(max_position_embeddings=1024, initializer_range=0.1, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = (
            LlamaForCausalLM(LlamaConfig(**options))
            if model_type == "llama"
            else Qwen3ForCausalLM(Qwen3Config(**options))
        )
        # transformers starts every RMSNorm at ones: weights of their own show each in its place
        # (Qwen3's q_norm and k_norm share one parameter in our model)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(torch.randn_like(param), alpha=0.3)
        return model.eval()


@dataclass
class Checkpoint:
    path: Path
    hf_model: CausalLM

    def on(self, device: str) -> "Checkpoint":
        """The reference on `device` (a copy: the session's checkpoints stay on the CPU)."""
        if device == "cpu":
            return self
        model = copy.deepcopy(self.hf_model)
        torch.nn.Module.to(model, device)  # in place (transformers' typed wrapper of it trips mypy)
        return Checkpoint(self.path, model)

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """transformers' own greedy generate(), one prompt at a time: the reference."""
        input_ids = torch.tensor([prompt], device=self.hf_model.device)
        with torch.inference_mode():
            output = self.hf_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return output[0, len(prompt) :].tolist()


def save_checkpoint(path: Path, model: CausalLM, **save_options: Any) -> Checkpoint:
    model.save_pretrained(path, **save_options)
    return Checkpoint(path, model)


class MakeCheckpoint(Protocol):
    def __call__(self, config: str, seed: int = 0, **save_options: Any) -> Checkpoint: ...


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> MakeCheckpoint:
    """Saves a tiny seeded model of one of the parity configs; `save_options` go to save_pretrained."""

    def make(config: str, seed: int = 0, **save_options: Any) -> Checkpoint:
        return save_checkpoint(tmp_path, tiny_model(seed, **PARITY_CONFIGS[config]), **save_options)

    return make


@pytest.fixture(scope="session")
def bigram_text() -> str:
    return BIGRAM_TEXT


@pytest.fixture(scope="session")
def im_end() -> int:
    return IM_END


@pytest.fixture(scope="session", params=list(PARITY_CONFIGS))
def parity_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return save_checkpoint(tmp_path_factory.mktemp(request.param), tiny_model(**PARITY_CONFIGS[request.param]))


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return save_checkpoint(tmp_path_factory.mktemp("small"), tiny_model(**PARITY_CONFIGS["gqa4-untied-hd32"]))


@pytest.fixture(scope="session")
def bigram_checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerBase) -> Checkpoint:
    """A real-vocabulary Qwen3 whose greedy output is known: attention and MLP write nothing, so
    each position's logits depend on its own token only, and each token of the chain
    trigger -> BIGRAM_TEXT -> <|im_end|> points at the next one."""
    chain = [tokenizer.encode("Q")[0], *tokenizer.encode(BIGRAM_TEXT), IM_END]
    assert len(set(chain)) == len(chain)
    model = chained_model([chain])
    path = tmp_path_factory.mktemp("bigram")
    checkpoint = save_checkpoint(path, model)
    tokenizer.save_pretrained(path)
    return checkpoint
