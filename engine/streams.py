"""`add_request`, `stream` and `generate` over requests whose deltas come back through a callback
on another thread: what LLMEngine (its loop a thread here) and EngineProcess (a process of its
own) share. Each supplies how a request is checked and queued, and how one is aborted."""

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import Future

from .outputs import RequestOutput, StreamDelta
from .request import OutputCallback, Request
from .sampling_params import SamplingParams
from .token_ids import PromptIds


class CallbackEngine(ABC):
    @abstractmethod
    def _make_request(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None,
        request_id: str | None,
        priority: int | None,
        callback: OutputCallback | None,
    ) -> Request:
        """The request checked (ValueError, RuntimeError) in the caller's thread, not yet queued."""

    @abstractmethod
    def _enqueue(self, requests: list[Request]) -> None:
        """Queues the requests, all or none (RuntimeError, ValueError)."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Ends the request with finish_reason "abort" if it is still in flight."""

    def add_request(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        priority: int | None = None,
        callback: OutputCallback | None = None,
    ) -> str:
        """Queues one request; `callback(delta, output)` runs on the engine's thread for every
        increment, with the RequestOutput on the last one."""
        request = self._make_request(prompt_token_ids, params, request_id, priority, callback)
        self._enqueue([request])
        return request.seq.request_id

    def generate(
        self, prompt_token_ids: Sequence[PromptIds], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Runs the prompts together and blocks until all are done; outputs in prompt order."""
        params_list = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        if len(params_list) != len(prompt_token_ids):
            raise ValueError(f"{len(params_list)} SamplingParams for {len(prompt_token_ids)} prompts")
        futures: list[Future[RequestOutput]] = [Future() for _ in prompt_token_ids]
        requests = [
            self._make_request(prompt, p, None, None, _resolve_on_finish(future))
            for prompt, p, future in zip(prompt_token_ids, params_list, futures, strict=True)
        ]
        self._enqueue(requests)
        try:
            return [future.result() for future in futures]
        finally:
            for request in requests:
                self.abort(request.seq.request_id)

    def stream(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> AsyncGenerator[StreamDelta]:
        """Yields StreamDeltas as tokens arrive; closing or cancelling the consumer aborts the
        request. Bad input raises ValueError here, before the first iteration."""
        request = self._make_request(prompt_token_ids, params, request_id, priority, None)
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncGenerator[StreamDelta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamDelta] = asyncio.Queue()

        def deliver(delta: StreamDelta, output: RequestOutput | None) -> None:  # on the engine's thread
            loop.call_soon_threadsafe(queue.put_nowait, delta)

        request.callback = deliver
        self._enqueue([request])
        try:
            while True:
                delta = await queue.get()
                yield delta
                if delta.finished:
                    return
        finally:
            self.abort(request.seq.request_id)


def _resolve_on_finish(future: Future[RequestOutput]) -> OutputCallback:
    def callback(delta: StreamDelta, output: RequestOutput | None) -> None:
        if output is not None:
            future.set_result(output)

    return callback
