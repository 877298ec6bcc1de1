import asyncio
import itertools
import logging
import operator
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future

import torch

from . import loader
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .kv_pool import KVPool
from .metrics import EngineMetrics
from .model_runner import ModelRunner
from .outputs import RequestOutput, StreamDelta
from .sampling import SamplingParams, sample
from .scheduler import Scheduler
from .sequence import OutputCallback, Sequence, SequenceStatus

logger = logging.getLogger(__name__)

SEED_MASK = (1 << 63) - 1


class LLMEngine:
    """Serves Qwen3 requests from one background thread that runs the step loop.

    `add_request`, `abort`, `stream` and `generate` may be called from any thread; they validate
    synchronously (ValueError) and hand requests to the loop, which batches everything in flight.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        loaded = loader.load(config)
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.checkpoint.name
        self.is_demo_model = loaded.checkpoint.is_demo
        self.eos_token_ids = loaded.eos_token_ids
        self.vocab_size = loaded.config.vocab_size
        self.device, self.dtype = loaded.device, loaded.dtype
        self.runner = ModelRunner(loaded, config)
        self.kv_pool = KVPool(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.kv_pool)
        max_positions = loaded.config.max_position_embeddings
        self.max_model_len = min(
            config.max_model_len or max_positions, max_positions, self.kv_pool.num_blocks * config.block_size
        )
        self.metrics = EngineMetrics()
        self._lock = threading.Condition()
        self._new_seqs: list[Sequence] = []
        self._aborted: set[str] = set()
        self._live: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._stopped = False
        self._num_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run_loop, name="llm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(cls, model: str = "auto", **options) -> "LLMEngine":
        return cls(EngineConfig(model=model, **options))

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        priority: int | None = None,
        callback: OutputCallback | None = None,
    ) -> str:
        """Queues one request; `callback(delta, output)` runs on the engine thread for every
        increment, with the RequestOutput on the last one."""
        seq = self._make_sequence(prompt_token_ids, params, request_id, priority, callback)
        self._enqueue([seq])
        return seq.request_id

    def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._live:
                self._aborted.add(request_id)
                self._lock.notify()

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Runs the prompts together and blocks until all are done; outputs in prompt order."""
        params_list = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        if len(params_list) != len(prompt_token_ids):
            raise ValueError(f"{len(params_list)} SamplingParams for {len(prompt_token_ids)} prompts")
        futures: list[Future[RequestOutput]] = [Future() for _ in prompt_token_ids]
        seqs = [
            self._make_sequence(prompt, p, None, None, _resolve_on_finish(future))
            for prompt, p, future in zip(prompt_token_ids, params_list, futures)
        ]
        self._enqueue(seqs)
        try:
            return [future.result() for future in futures]
        finally:
            for seq in seqs:
                self.abort(seq.request_id)

    def stream(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """Yields StreamDeltas as tokens arrive; closing or cancelling the consumer aborts the
        request. Bad input raises ValueError here, before the first iteration."""
        seq = self._make_sequence(prompt_token_ids, params, request_id, priority, None)
        return self._stream(seq)

    async def _stream(self, seq: Sequence) -> AsyncIterator[StreamDelta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamDelta] = asyncio.Queue()
        seq.callback = lambda delta, output: loop.call_soon_threadsafe(queue.put_nowait, delta)
        self._enqueue([seq])
        try:
            while True:
                delta = await queue.get()
                yield delta
                if delta.finished:
                    return
        finally:
            self.abort(seq.request_id)

    def stats(self) -> dict:
        return {
            "model": self.model_name,
            "is_demo_model": self.is_demo_model,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "max_model_len": self.max_model_len,
            "requests": {
                "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting),
                "preemptions": self.scheduler.num_preemptions,
            },
            "kv_cache": self.kv_pool.stats(),
            **self.metrics.as_dict(),
        }

    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def shutdown(self) -> None:
        """Stops the loop; requests still in flight finish with finish_reason "abort"."""
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join()

    def _make_sequence(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None,
        request_id: str | None,
        priority: int | None,
        callback: OutputCallback | None,
    ) -> Sequence:
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate()
        token_ids = self._validate_prompt(prompt_token_ids)
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        request_id = uuid.uuid4().hex if request_id is None else str(request_id)
        with self._lock:
            self._check_request_id(request_id)
        return Sequence(
            request_id=request_id,
            token_ids=token_ids,
            params=params,
            priority=params.priority if priority is None else priority,
            arrival=next(self._arrivals),
            seed=(random.getrandbits(63) if params.seed is None else params.seed) & SEED_MASK,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.stop),
            callback=callback,
        )

    def _validate_prompt(self, prompt_token_ids: list[int]) -> list[int]:
        try:
            token_ids = [operator.index(t) for t in prompt_token_ids]
        except TypeError:
            raise ValueError("prompt_token_ids must be a list of integer token ids") from None
        if not token_ids:
            raise ValueError("prompt_token_ids is empty: a prompt needs at least one token")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; this engine takes at most {self.max_model_len - 1} "
                f"(max_model_len {self.max_model_len}, leaving room for one generated token)"
            )
        bad = next((i for i, t in enumerate(token_ids) if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"token id {token_ids[bad]} at position {bad} is outside the vocabulary [0, {self.vocab_size})"
            )
        return token_ids

    def _check_request_id(self, request_id: str) -> None:
        if self._stopped:
            raise RuntimeError("the engine is shut down")
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in flight")

    def _enqueue(self, seqs: list[Sequence]) -> None:
        with self._lock:
            for seq in seqs:
                self._check_request_id(seq.request_id)
            for seq in seqs:
                self._live[seq.request_id] = seq
            self._new_seqs.extend(seqs)
            self._lock.notify()

    def _run_loop(self) -> None:
        # a new thread starts with OpenMP's default team size, not the one the process chose
        torch.set_num_threads(self._num_threads)
        while True:
            with self._lock:
                while not (self._stopped or self._new_seqs or self._aborted or not self.scheduler.is_finished()):
                    self._lock.wait()
                new_seqs, self._new_seqs = self._new_seqs, []
                aborted = [self._live[request_id] for request_id in self._aborted if request_id in self._live]
                self._aborted = set()
                stopped = self._stopped
            for seq in new_seqs:
                self.scheduler.add(seq)
            for seq in aborted:
                self._finish(seq, "abort")
            if stopped:
                break
            if self.scheduler.is_finished():
                continue
            try:
                self._step()
            except Exception:
                logger.exception("engine step failed; the requests in flight end with finish_reason 'error'")
                self._finish_all("error")
        self._finish_all("abort")

    def _step(self) -> None:
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        assert scheduled, "a scheduler with work must schedule something"
        seqs, logits = self.runner.run(scheduled)
        token_ids = sample(
            logits, [s.params for s in seqs], [s.seed for s in seqs], [s.num_output_tokens for s in seqs]
        )
        self.scheduler.postprocess(scheduled)
        for seq, token_id in zip(seqs, token_ids.tolist()):
            self._process_token(seq, token_id)
        self.metrics.record_step(time.perf_counter() - start, len(scheduled), sum(n for _, n in scheduled), len(seqs))

    def _process_token(self, seq: Sequence, token_id: int) -> None:
        seq.append_token(token_id)
        params = seq.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            self._finish(seq, "stop", [token_id])
        elif seq.detokenizer.append(token_id):
            self._finish(seq, "stop", [token_id])
        elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            self._finish(seq, "length", [token_id])
        else:
            self._emit(seq, StreamDelta([token_id], seq.detokenizer.take_delta(finished=False)), None)

    def _finish(self, seq: Sequence, reason: str, token_ids: list[int] | None = None) -> None:
        if seq.status == SequenceStatus.FINISHED:
            return
        self.scheduler.finish(seq)
        seq.finish_reason = reason
        seq.detokenizer.flush()
        with self._lock:
            self._live.pop(seq.request_id, None)
        output = seq.to_output()
        self.metrics.record_finished(output)
        delta = StreamDelta(
            token_ids=token_ids or [],
            text=seq.detokenizer.take_delta(finished=True),
            finished=True,
            finish_reason=reason,
            num_cached_tokens=seq.num_cached_tokens,
            num_prompt_tokens=seq.num_prompt_tokens,
        )
        self._emit(seq, delta, output)

    def _finish_all(self, reason: str) -> None:
        with self._lock:
            new_seqs, self._new_seqs = self._new_seqs, []
        for seq in new_seqs:
            self.scheduler.add(seq)
        for seq in self.scheduler.running + self.scheduler.waiting:
            self._finish(seq, reason)

    def _emit(self, seq: Sequence, delta: StreamDelta, output: RequestOutput | None) -> None:
        if seq.callback is None:
            return
        try:
            seq.callback(delta, output)
        except Exception:
            logger.exception("output callback of request %s failed; aborting it", seq.request_id)
            self._finish(seq, "abort")


def _resolve_on_finish(future: "Future[RequestOutput]") -> OutputCallback:
    def callback(delta: StreamDelta, output: RequestOutput | None) -> None:
        if output is not None:
            future.set_result(output)

    return callback
