from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    """Everything the engine needs to start; `LLMEngine.from_pretrained(model, **options)` fills it.

    The KV pool is sized once: from `kv_cache_tokens` on CPU, from `gpu_memory_fraction` of the
    GPU on CUDA. `max_model_len` is capped at the model's `max_position_embeddings` and at the
    pool's capacity, so a single request always fits.
    """

    model: str = "auto"
    data_dir: str = "data"
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    kv_cache_tokens: int = 65536
    gpu_memory_fraction: float = 0.85
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("block_size", "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")
