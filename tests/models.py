"""Checkpoints whose greedy output is known, for tests that need a model to say exact words."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

QWEN3_VOCAB_SIZE = 151936
IM_END = 151645


def chained_model(chains: Sequence[Sequence[int]], *, hidden_size: int = 64) -> Qwen3ForCausalLM:
    """A real-vocabulary Qwen3 that follows `chains`: attention and MLP write nothing, so each
    position's logits depend on its own token only, and each token of a chain points at the next.
    A token may start one link only."""
    links = [link for chain in chains for link in itertools.pairwise(chain)]
    assert len({token for token, _ in links}) == len(links), "one next token each"
    assert len(links) <= hidden_size, "one dimension a link"
    config = Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=False,
        eos_token_id=IM_END,
        max_position_embeddings=1024,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for dimension, (token, following) in enumerate(links):
            model.model.embed_tokens.weight[token, dimension] = 1.0
            model.lm_head.weight[following, dimension] = 10.0
    return model
