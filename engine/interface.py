"""What the app asks of an engine: `LLMEngine` runs the model in this process, `EngineProcess` in
a process of its own (the app's choice), `RemoteEngine` sends the same token ids to a model server
(vLLM, SGLang, or another Clawdbot) over HTTP."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, Self

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .chat_format import ChatFormat
    from .metrics import EngineFigures
    from .outputs import StreamDelta
    from .sampling_params import SamplingParams
    from .token_ids import PromptIds


class Engine(Protocol):
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    is_demo_model: bool
    num_parameters: int | None  # None: not known here (a remote server's model)
    max_model_len: int
    max_num_seqs: int  # requests generated at once; more wait

    def chat_format(self, *, enable_thinking: bool = False) -> ChatFormat: ...

    def stream(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> AsyncGenerator[StreamDelta]:
        """Deltas as tokens arrive, the last with `finished` set; closing the generator aborts the
        request. Bad input raises ValueError at once, before the first iteration."""
        ...

    @property
    def num_waiting_requests(self) -> int: ...

    def figures(self) -> EngineFigures: ...

    def claim_cpu(self) -> AbstractContextManager[None]:
        """Held while the caller does work on this machine's CPU that a user waits for: an engine
        computing on the CPU starts no step meanwhile, for at most tens of milliseconds
        (cpu_claim.py)."""
        ...

    def is_running(self) -> bool:
        """Whether a request sent now can be served."""
        ...

    def start(self) -> Self: ...

    async def close(self, timeout_s: float) -> bool:
        """Stops serving; requests in flight end with finish_reason "abort". False if part of it
        is still running after `timeout_s`."""
        ...
