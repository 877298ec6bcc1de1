from dataclasses import dataclass
from typing import Literal, get_args

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class EngineConfig:
    """Everything the engine needs to start; `LLMEngine.from_pretrained(model, **options)` fills it.

    These defaults are the only copy: the app's `engine` settings take theirs from here. The KV
    pool is sized once: from `kv_cache_tokens` on CPU, from `gpu_memory_fraction` of the GPU on
    CUDA. `max_model_len` (None: the model's own) is capped at the model's
    `max_position_embeddings` and at the pool's capacity, so a single request always fits.
    """

    model: str = "auto"
    data_dir: str = "data"
    device: Device = "auto"
    dtype: DType = "auto"
    block_size: int = 16
    # On CPU: 16k tokens of Qwen3-0.6B in fp32 take 3.7 GB, what a laptop can spare.
    kv_cache_tokens: int = 16384
    gpu_memory_fraction: float = 0.85
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    # draft tokens a decode may verify in one step (speculation.py); 0 decodes one token a step
    num_speculative_tokens: int = 4
    # prompt tokens a step computes for work no user waits for (BACKGROUND_PRIORITY: a summary, a
    # prefill ahead of a turn), in steps that prefill no user's prompt (scheduler.py)
    max_background_prefill_tokens: int = 256
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.device not in get_args(Device):
            raise ValueError(f"device must be one of {get_args(Device)}, got {self.device!r}")
        if self.dtype not in get_args(DType):
            raise ValueError(f"dtype must be one of {get_args(DType)}, got {self.dtype!r}")
        for name in (
            "block_size",
            "kv_cache_tokens",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_background_prefill_tokens",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {self.num_speculative_tokens!r}")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")


@dataclass
class RemoteConfig:
    """Everything a RemoteEngine needs; the app's `engine` settings with `backend: remote` fill it."""

    url: str
    tokenizer: str  # the served model's: a checkpoint folder, a hub id, builtin:..., or qwen3 (bundled)
    data_dir: str = "data"
    model: str | None = None  # the served model's id; None: the one the server lists
    api_key: str = ""
    max_num_seqs: int = 64  # requests this replica has in flight at once; more wait here
    max_model_len: int | None = None  # None: what the server reports
    connect_timeout_s: float = 5.0
    timeout_s: float = 120.0  # longest silence in a stream (a long prompt's prefill comes first)
    send_priority: bool = False  # vLLM refuses priorities unless started with --scheduling-policy priority
