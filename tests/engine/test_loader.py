import json
import logging
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from safetensors.torch import load_file, save_file

from engine import LLMEngine, SamplingParams
from engine.checkpoints import DEMO_MODEL, Checkpoint, demo_model_dir, resolve_checkpoint
from tests.engine.conftest import Checkpoint as SavedCheckpoint
from tests.engine.conftest import MakeCheckpoint


@pytest.fixture
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_demo_model_is_created_once_and_loaded_like_any_checkpoint(
    tmp_path: Path, empty_hub_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.llm_engine")
    with LLMEngine.from_pretrained("auto", data_dir=str(tmp_path), kv_cache_tokens=512) as engine:
        assert engine.is_demo_model and engine.model_name == DEMO_MODEL
        assert "meaningless text" in caplog.text
        assert len(engine.tokenizer) > 150000 and engine.core.eos_token_ids == {151645, 151643}
        chat = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "你好"}], add_generation_prompt=True, tokenize=False
        )
        prompt = engine.tokenizer.encode(chat)
        output = engine.generate([prompt], SamplingParams(max_tokens=8))[0]
        assert len(output.token_ids) == 8 or output.finish_reason == "stop"
    path = demo_model_dir(tmp_path)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    created = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_checkpoint(DEMO_MODEL, tmp_path) == Checkpoint(DEMO_MODEL, path, True)
    assert (path / "model.safetensors").stat().st_mtime_ns == created


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
    with pytest.raises(ValueError, match="builtin:tiny-qwen3"):
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
    shutil.copytree(small_checkpoint.path, tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ValueError, match="qwen3"):
        LLMEngine.from_pretrained(str(tmp_path / "llama"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        LLMEngine.from_pretrained(str(tmp_path))
