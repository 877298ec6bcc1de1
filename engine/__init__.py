"""Our own Qwen3 inference engine: a paged KV pool with prefix caching, continuous batching,
batched sampling with dynamic top-k, streaming; or, behind the same `Engine` interface, a model
server over HTTP (`engine.remote`). Imports nothing from the rest of the project.

    from engine import LLMEngine, SamplingParams
"""

from typing import TYPE_CHECKING

from .chat_format import ChatFormat
from .config import EngineConfig
from .interface import Engine
from .metrics import EngineFigures
from .outputs import FinishReason, RequestOutput, StreamDelta
from .sampling_params import BACKGROUND_PRIORITY, SamplingParams
from .token_ids import PromptIds, TokenArray

if TYPE_CHECKING:
    from .llm_engine import LLMEngine

__all__ = [
    "BACKGROUND_PRIORITY",
    "ChatFormat",
    "Engine",
    "EngineConfig",
    "EngineFigures",
    "FinishReason",
    "LLMEngine",
    "PromptIds",
    "RequestOutput",
    "SamplingParams",
    "StreamDelta",
    "TokenArray",
]


def __getattr__(name: str) -> object:
    # LLMEngine loads torch, whose OpenMP reads its settings once, as it loads; the settings take
    # EngineConfig's defaults before the process is set up, so they must not load it.
    if name == "LLMEngine":
        from .llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
