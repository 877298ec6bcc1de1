"""The model on its device, in its dtype, with every checkpoint tensor in place."""

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from .architecture import Architecture
from .model import MERGED_MODULES, CausalLM

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def build_model(arch: Architecture, path: Path, device: torch.device, dtype: torch.dtype) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(arch)
    # Each parameter allocated anew, not by to_empty: its empty_like on the meta device imports
    # torch's symbolic shapes and sympy, 0.85 s of every engine's start on 2 cores. Without
    # gradients: what is computed from a weight outside the steps' inference mode would hold its
    # autograd graph (the greedy head's screen of SmolLM2's LM head kept 1.7 GB an engine).
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            empty = torch.empty(param.shape, dtype=dtype, device=device)
            setattr(module, name, nn.Parameter(empty, requires_grad=False))
    load_weights(model, path)
    return model.eval()


def load_weights(model: CausalLM, path: Path) -> None:
    """Copies every checkpoint tensor into its parameter; sharded checkpoints are all the
    `*.safetensors` files of the directory. Fails if any parameter (or merged shard) is left unloaded."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights")
    params = dict(model.named_parameters())
    unloaded = {(name, shard) for name in params for shard in parameter_shards(model, name)}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - a safetensors file handle, not a dict
                if model.arch.tie_word_embeddings and name == "lm_head.weight":
                    continue
                target, shard = packed_target(model, name)
                if target not in params:
                    logger.warning("%s: ignoring unexpected weight %s", path, name)
                    continue
                weight = tensors.get_tensor(name)
                if shard is None:
                    assert params[target].shape == weight.shape, f"{name}: shape {tuple(weight.shape)}"
                    params[target].data.copy_(weight)
                else:
                    merged = model.get_submodule(target.rsplit(".", 1)[0])
                    assert isinstance(merged, MERGED_MODULES)
                    merged.load_shard(params[target], shard, weight)
                unloaded.discard((target, shard))
    if unloaded:
        raise ValueError(f"{path}: checkpoint lacks weights for {sorted(n for n, _ in unloaded)}")


def parameter_shards(model: CausalLM, name: str) -> list[str | None]:
    module = model.get_submodule(name.rsplit(".", 1)[0])
    return list(module.shards) if isinstance(module, MERGED_MODULES) else [None]


def packed_target(model: CausalLM, name: str) -> tuple[str, str | None]:
    for checkpoint_name, (packed_name, shard) in model.packed_modules_mapping.items():
        if f".{checkpoint_name}." in name:
            return name.replace(f".{checkpoint_name}.", f".{packed_name}."), shard
    return name, None
