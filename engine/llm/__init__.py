"""The project's own Qwen3 inference engine: paged KV pool with prefix caching, continuous
batching, batched sampling with dynamic top-k, streaming. Knows nothing of chats or Feishu."""

from .config import EngineConfig
from .engine import LLMEngine
from .outputs import RequestOutput, StreamDelta
from .sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "StreamDelta"]
