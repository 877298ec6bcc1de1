from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from settings import ConfigError, Settings, anchored, load_settings

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_config_equals_defaults() -> None:
    assert load_settings(ROOT / "config.yaml") == Settings()


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_setting_is_in_config_yaml_with_a_comment() -> None:
    lines = (ROOT / "config.yaml").read_text(encoding="utf-8").splitlines()
    for dotted in _keys(Settings):
        key = dotted.rsplit(".", 1)[-1]
        matching = [line for line in lines if re.match(rf"\s+{key}:", line)]
        assert matching, f"{dotted} missing from config.yaml"
        assert all("#" in line for line in matching), f"{dotted} has no comment in config.yaml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('server:\n  port: "abc"\n', 'config.yaml: server.port: expected an integer 1-65535, got "abc"'),
        ("server:\n  port: 70000\n", "config.yaml: server.port: expected an integer 1-65535, got 70000"),
        ("server:\n  colour: red\n", "config.yaml: server.colour: unknown key"),
        ("serve:\n  port: 1\n", "config.yaml: serve: unknown key"),
        ("logging:\n  level: LOUD\n", "config.yaml: logging.level: expected one of"),
        ("storage:\n  echo_sql: maybe\n", "config.yaml: storage.echo_sql: expected true or false"),
        (
            "generation:\n  max_tokens: 4096\n",
            "config.yaml: generation.max_tokens: expected at most generation.max_reply_tokens (2048), got 4096",
        ),
        (
            "feishu:\n  mode: webhook\n  app_id: cli_1\n  app_secret: s\n",
            "config.yaml: feishu.verification_token: required in webhook mode",
        ),
        (
            "engine:\n  backend: remote\n",
            "config.yaml: engine.tokenizer: required with engine.backend remote (the served model's tokenizer",
        ),
        (
            "engine:\n  backend: remote\n  tokenizer: qwen3\n  remote_url: gpu-box:8000\n",
            "config.yaml: engine.remote_url: required with engine.backend remote: the model server's base URL",
        ),
        ("engine:\n  backend: vllm\n", "config.yaml: engine.backend: expected one of"),
        ("server: [1\n", "config.yaml: not valid YAML"),
        ("- a\n- b\n", "config.yaml: expected a mapping"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_settings(write(tmp_path, text))
    assert str(excinfo.value).startswith(f"{tmp_path}/{message}")  # the file's whole path
    assert "\n" not in str(excinfo.value)


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "")) == Settings()


def test_values_are_typed(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "server:\n  port: 9001\nstorage:\n  url: sqlite:///x.db\n"))
    assert settings.server.port == 9001
    assert settings.storage.url == "sqlite:///x.db"


def test_cli_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'server:\n  port: "abc"\n')
    result = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    expected = f'{path.resolve()}: server.port: expected an integer 1-65535, got "abc"'
    assert result.stderr.strip().splitlines() == [expected]


def test_secrets_come_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "feishu:\n  app_id: cli_file\n  app_secret: from-file\n")
    environ = {"FEISHU_APP_SECRET": "from-env", "FEISHU_ENCRYPT_KEY": "ek", "CLAWDBOT_ADMIN_TOKEN": "adm"}
    settings = load_settings(path, environ=environ)
    assert settings.feishu.app_id == "cli_file"
    assert settings.feishu.app_secret == "from-env"
    assert settings.feishu.encrypt_key == "ek"
    assert settings.admin.token == "adm"
    assert settings.feishu.enabled
    assert not load_settings(None, environ={}).feishu.enabled


def test_the_remote_backend_takes_engine_model_as_its_tokenizer_and_its_key_from_the_environment(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "engine:\n  backend: remote\n  model: Qwen/Qwen3-8B\n  remote_url: http://gpu:8000\n")
    remote = load_settings(path, environ={"CLAWDBOT_ENGINE_API_KEY": "k"}).engine.remote()
    assert (remote.url, remote.tokenizer, remote.api_key, remote.max_num_seqs) == (
        "http://gpu:8000",
        "Qwen/Qwen3-8B",
        "k",
        64,
    )


def test_relative_paths_are_taken_from_the_config_files_folder(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "storage:\n  url: sqlite:///data/bot.db\n"))
    folder = tmp_path / "conf"
    here = anchored(settings, folder)
    assert here.storage.url == f"sqlite:///{folder}/data/bot.db" and here.engine.data_dir == f"{folder}/data"
    absolute = load_settings(
        write(tmp_path, f"storage:\n  url: sqlite:///{tmp_path}/x.db\nengine:\n  data_dir: /srv\n")
    )
    assert anchored(absolute, folder).storage.url == f"sqlite:///{tmp_path}/x.db"
    assert anchored(absolute, folder).engine.data_dir == "/srv"
    postgres = "postgresql+psycopg://u:p@db/clawdbot"
    assert anchored(Settings(storage={"url": postgres}), folder).storage.url == postgres


def test_dedup_ttl_is_at_least_a_day(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"feishu.dedup_ttl_s: expected an integer >= 86400, got 60"):
        load_settings(write(tmp_path, "feishu:\n  dedup_ttl_s: 60\n"))
