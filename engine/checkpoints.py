"""Which checkpoint to serve: a folder, a hub id, or a built-in model; its config, tokenizer and
EOS ids."""

import contextlib
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

from .architecture import MODEL_TYPES
from .builtin_models import (
    BUILTIN_MODELS,
    DEMO_MODEL,
    SMOLLM2_MODEL,
    ModelFetchError,
    bundled_tokenizer_dir,
    is_builtin_model_dir,
)

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "tokenizer*"]


@dataclass
class Checkpoint:
    name: str
    path: Path
    is_demo: bool


def resolve_checkpoint(model: str, data_dir: Path) -> Checkpoint:
    """`auto`: a checkpoint under `<data_dir>/models/`, else the smallest Qwen3 in the hub cache, else
    SmolLM2 (fetched once), else, only when it cannot be fetched, the random demo model."""
    if model == "auto":
        return find_real_checkpoint(data_dir) or smollm2_or_demo(data_dir)
    if model in BUILTIN_MODELS:
        return builtin_checkpoint(model, data_dir)
    if model.startswith("builtin:"):
        raise ValueError(f"unknown built-in model {model!r}; the built-in models are {', '.join(BUILTIN_MODELS)}")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{model}: not a Hugging Face checkpoint directory (no config.json)")
        return Checkpoint(model, path, False)
    return Checkpoint(model, download(model), False)


def download(repo_id: str) -> Path:
    """The local Hugging Face cache first, then the hub."""
    from huggingface_hub import constants, snapshot_download

    def fetch(local_files_only: bool) -> Path:
        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=CHECKPOINT_PATTERNS,
                cache_dir=constants.HF_HUB_CACHE,
                local_files_only=local_files_only,
            )
        )

    with contextlib.suppress(Exception):  # not in the cache, in any of the ways the hub client says so
        return fetch(local_files_only=True)
    try:
        return fetch(local_files_only=False)
    except Exception as error:
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a checkpoint directory nor in the Hugging Face cache, "
            f"and downloading it failed: {type(error).__name__}: {error}"
        ) from error


def builtin_checkpoint(name: str, data_dir: Path) -> Checkpoint:
    return Checkpoint(name, BUILTIN_MODELS[name](data_dir), is_demo=name == DEMO_MODEL)


def smollm2_or_demo(data_dir: Path) -> Checkpoint:
    try:
        return builtin_checkpoint(SMOLLM2_MODEL, data_dir)
    except ModelFetchError as error:
        logger.warning("engine.model auto: %s; serving the demo model %s instead", error, DEMO_MODEL)
        return builtin_checkpoint(DEMO_MODEL, data_dir)


def find_real_checkpoint(data_dir: Path) -> Checkpoint | None:
    """A Qwen3 or Llama checkpoint under `<data_dir>/models/` (not a built-in one), else the smallest
    Qwen3 in the hub cache."""
    for config_file in sorted((data_dir / "models").glob("*/config.json")):
        if not is_builtin_model_dir(config_file.parent) and has_model_type(config_file.parent, MODEL_TYPES):
            return Checkpoint(str(config_file.parent), config_file.parent, False)
    from huggingface_hub import constants, scan_cache_dir

    try:
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except Exception:  # noqa: BLE001 - no cache, or one that cannot be read: there is nothing in it to run
        return None
    candidates = []
    for repo in repos:
        for revision in repo.revisions:
            if repo.repo_type == "model" and has_model_type(revision.snapshot_path, ("qwen3",)):
                candidates.append((revision.size_on_disk, repo.repo_id, revision.snapshot_path))
    if not candidates:
        return None
    _, repo_id, path = min(candidates)
    return Checkpoint(repo_id, Path(path), False)


def has_model_type(path: Path, model_types: Collection[str]) -> bool:
    """A checkpoint folder with safetensors whose config.json names one of `model_types`."""
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return model_type in model_types and any(path.glob("*.safetensors"))


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    if any((path / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        return AutoTokenizer.from_pretrained(path)
    logger.warning("%s has no tokenizer files; using the bundled Qwen3 tokenizer", path)
    return AutoTokenizer.from_pretrained(bundled_tokenizer_dir())


def load_named_tokenizer(name: str, data_dir: Path) -> PreTrainedTokenizerBase:
    """A served model's tokenizer without its weights: `qwen3` (the bundled Qwen3 tokenizer, which
    every Qwen3 size shares), a built-in model, a checkpoint folder, or a hub id (from the local
    Hugging Face cache, else the hub)."""
    if name == "qwen3":
        return AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    if name in BUILTIN_MODELS:
        return load_tokenizer(builtin_checkpoint(name, data_dir).path)
    path = Path(name).expanduser()
    if path.is_dir():
        return load_tokenizer(path)
    return AutoTokenizer.from_pretrained(name)


def load_config(checkpoint: Checkpoint) -> PretrainedConfig:
    config: PretrainedConfig = AutoConfig.from_pretrained(checkpoint.path)
    if config.model_type not in MODEL_TYPES:
        raise ValueError(
            f"{checkpoint.name}: model_type is {config.model_type!r}, this engine runs {' and '.join(MODEL_TYPES)}"
        )
    return config


def eos_token_ids(path: Path, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """generation_config.json's EOS ids (what transformers' generate() stops on), else config.json's,
    else the tokenizer's."""
    eos = None
    if (path / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    if eos is None:
        eos = config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
