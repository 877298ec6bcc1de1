"""`add_request`, `stream` and `generate` over requests whose deltas come back through a callback
on another thread: what LLMEngine (its loop a thread here) and EngineProcess (a process of its
own) share. Each supplies how a request is checked and queued, and how one is aborted."""

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, Self

from .outputs import RequestOutput, StreamDelta
from .request import InputProcessor, OutputCallback, Request
from .sampling_params import SamplingParams
from .token_ids import PromptIds


class CallbackEngine(ABC):
    inputs: InputProcessor
    _lock: AbstractContextManager[Any]  # guards what `_check_request_id` reads

    @abstractmethod
    def _check_request_id(self, request_id: str) -> None:
        """Under `_lock`: RuntimeError where no request is taken now, ValueError for an id in flight."""

    @abstractmethod
    def _enqueue(self, requests: list[Request]) -> None:
        """Queues the requests, all or none (RuntimeError, ValueError)."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Ends the request with finish_reason "abort" if it is still in flight."""

    @abstractmethod
    def start(self) -> Self:
        """Starts taking requests; they are refused before."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @abstractmethod
    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stops serving; requests in flight end with finish_reason "abort". Waits for the step in
        progress at most `timeout_s` (None: for ever); False if it is still running."""

    async def close(self, timeout_s: float) -> bool:
        """`shutdown` off the event loop: the step in progress may take seconds to end."""
        return await asyncio.to_thread(self.shutdown, timeout_s)

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

    def _make_request(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None,
        request_id: str | None,
        priority: int | None,
        callback: OutputCallback | None,
    ) -> Request:
        """The request checked in the caller's thread (ValueError, RuntimeError), not yet queued."""
        request = self.inputs.process(prompt_token_ids, params, request_id, priority, callback)
        with self._lock:
            self._check_request_id(request.seq.request_id)
        return request

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
