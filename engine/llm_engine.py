import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

from .architecture import Architecture
from .chat_format import ChatFormat
from .checkpoints import eos_token_ids, load_config, load_tokenizer, resolve_checkpoint
from .config import EngineConfig
from .core import EngineCore
from .cpu_claim import CpuClaim
from .metrics import EngineFigures, RequestFigures
from .outputs import FinishReason, RequestOutput, StreamDelta
from .request import InputProcessor, Request
from .streams import CallbackEngine
from .weights import build_model, resolve_device, resolve_dtype

logger = logging.getLogger(__name__)


class LLMEngine(CallbackEngine):
    """Serves requests to a Qwen3 or Llama model from one background thread that drives the EngineCore.

    `add_request`, `abort`, `stream` and `generate` may be called from any thread; they validate
    synchronously (ValueError) and hand requests to the loop, which batches everything in flight.
    `_lock` guards what both sides touch: the new requests, the aborted ids, the ids in flight and
    the stopped flag. The core and `_requests` belong to the loop thread alone.
    """

    def __init__(self, config: EngineConfig, cpu_claim: CpuClaim | None = None) -> None:
        """`cpu_claim`: the app's, when this engine runs in a process of its own (process_main.py)."""
        self.config = config
        checkpoint = resolve_checkpoint(config.model, Path(config.data_dir))
        if checkpoint.is_demo:
            logger.warning(
                "engine.model is the built-in demo model %s: random weights, it produces meaningless text. "
                "Point engine.model at a Qwen3 or Llama checkpoint directory or hub id for real answers.",
                checkpoint.name,
            )
        hf_config = load_config(checkpoint)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        arch = Architecture.from_config(hf_config)
        model = build_model(arch, checkpoint.path, device, dtype)
        self.tokenizer = load_tokenizer(Path(config.tokenizer) if config.tokenizer else checkpoint.path)
        self.core = EngineCore(model, config, eos_token_ids(checkpoint.path, hf_config, self.tokenizer))
        logger.info("loaded %s from %s on %s (%s)", checkpoint.name, checkpoint.path, device, dtype)
        self.model_name = checkpoint.name
        self.is_demo_model = checkpoint.is_demo
        self.device, self.dtype = device, dtype
        self.cpu_claim = cpu_claim or CpuClaim()
        self.num_parameters: int | None = sum(parameter.numel() for parameter in model.parameters())
        self.max_model_len = self.core.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.inputs = InputProcessor(self.tokenizer, arch.vocab_size, self.max_model_len)
        self._lock: threading.Condition = threading.Condition()
        self._new_requests: list[Request] = []
        self._aborted: set[str] = set()
        self._live: set[str] = set()
        self._stopped = False
        self._requests: dict[str, Request] = {}
        self._after_outputs: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run_loop, name="llm-engine", daemon=True)

    @classmethod
    def from_pretrained(cls, model: str = EngineConfig.model, **options: Any) -> Self:
        return cls(EngineConfig(model=model, **options))

    def chat_format(self, *, enable_thinking: bool = False) -> ChatFormat:
        """The checkpoint's chat framing; replies end on any of the ids this engine stops on."""
        return ChatFormat.for_tokenizer(
            self.tokenizer, enable_thinking=enable_thinking, eos_token_ids=self.core.eos_token_ids
        )

    def start(self, after_outputs: Callable[[], None] | None = None) -> Self:
        """Starts the step loop; requests are refused before. `after_outputs` runs on the loop's
        thread after each round of callbacks (a step's, or the aborted requests' last deltas):
        where the callbacks only gather what they are given, it sends a round's at once."""
        self._after_outputs = after_outputs
        self._thread.start()
        return self

    def claim_cpu(self) -> AbstractContextManager[None]:
        return self.cpu_claim.held()

    def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._live:
                self._aborted.add(request_id)
                self._lock.notify()

    @property
    def num_waiting_requests(self) -> int:
        """Requests not yet running: what admission control compares with its limit."""
        with self._lock:
            return len(self._new_requests) + len(self.core.scheduler.waiting)

    def figures(self) -> EngineFigures:
        """Read while the loop runs: each figure is current, the set is not one instant's."""
        scheduler = self.core.scheduler
        return EngineFigures(
            model=self.model_name,
            num_parameters=self.num_parameters,
            is_demo_model=self.is_demo_model,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            max_model_len=self.max_model_len,
            requests=RequestFigures(
                running=len(scheduler.running), waiting=self.num_waiting_requests, preemptions=scheduler.num_preemptions
            ),
            kv_cache=self.core.kv_pool.figures(),
            activity=self.core.metrics.figures(),
        )

    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stops the loop; requests still in flight finish with finish_reason "abort". Waits for
        the step in progress at most `timeout_s` (None: for ever); False if it is still running."""
        with self._lock:
            self._stopped = True
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _check_request_id(self, request_id: str) -> None:
        if self._stopped:
            raise RuntimeError("the engine is shut down")
        if not self._thread.is_alive():
            raise RuntimeError("the engine is not started: call start() or use it as a context manager")
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in flight")

    def _enqueue(self, requests: list[Request]) -> None:
        with self._lock:
            for request in requests:
                self._check_request_id(request.seq.request_id)
            for request in requests:
                self._live.add(request.seq.request_id)
            self._new_requests.extend(requests)
            self._lock.notify()

    def _run_loop(self) -> None:
        while True:
            with self._lock:
                while not (
                    self._stopped or self._new_requests or self._aborted or self.core.has_unfinished_sequences()
                ):
                    self._lock.wait()
                new_requests, self._new_requests = self._new_requests, []
                aborted, self._aborted = self._aborted, set()
                stopped = self._stopped
            for request in new_requests:
                self._requests[request.seq.request_id] = request
                self.core.add(request.seq)
            for request_id in aborted:
                if request_id in self._requests:
                    self._finish(self._requests[request_id], "abort")
            if stopped:
                break
            if self.core.has_unfinished_sequences():
                if self.device.type == "cpu":
                    self.cpu_claim.wait()
                try:
                    for seq, token_ids in self.core.step():
                        self._on_tokens(self._requests[seq.request_id], token_ids)
                except Exception:
                    logger.exception("engine step failed; the requests in flight end with finish_reason 'error'")
                    self._finish_all("error")
            self._outputs_done()
        self._finish_all("abort")
        self._outputs_done()
        self.core.runner.release()

    def _outputs_done(self) -> None:
        if self._after_outputs is None:
            return
        try:
            self._after_outputs()
        except Exception:
            logger.exception("after_outputs failed")

    def _on_tokens(self, request: Request, token_ids: list[int]) -> None:
        seq = request.seq
        for count, token_id in enumerate(token_ids, start=1):
            # EOS and stop token ids, always a step's last token, end the request without being
            # text; a stop string ends it once the text holds it.
            if (count == len(token_ids) and seq.finish_reason == "stop") or request.detokenizer.append(token_id):
                # tokens past a stop string are dropped, as if they had never been sampled
                del seq.output_token_ids[seq.num_output_tokens - len(token_ids) + count :]
                self._finish(request, "stop", token_ids[:count])
                return
        if seq.is_finished:
            assert seq.finish_reason is not None
            self._finish(request, seq.finish_reason, token_ids)
        else:
            self._emit(request, StreamDelta(token_ids, request.detokenizer.take_delta(finished=False)), None)

    def _finish(self, request: Request, reason: FinishReason, token_ids: list[int] | None = None) -> None:
        seq = request.seq
        if seq.request_id not in self._requests:
            return  # finished already, e.g. by its callback failing
        del self._requests[seq.request_id]
        if not seq.is_finished:
            self.core.finish(seq, reason)
        with self._lock:
            self._live.discard(seq.request_id)
        request.detokenizer.flush()
        output = RequestOutput(
            request_id=seq.request_id,
            token_ids=seq.output_token_ids,
            text=request.detokenizer.text,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            ttft_s=seq.ttft_s,
        )
        delta = StreamDelta(
            token_ids=token_ids or [],
            text=request.detokenizer.take_delta(finished=True),
            finished=True,
            finish_reason=reason,
            num_cached_tokens=seq.num_cached_tokens,
            num_prompt_tokens=seq.num_prompt_tokens,
        )
        self._emit(request, delta, output)

    def _finish_all(self, reason: FinishReason) -> None:
        with self._lock:
            new_requests, self._new_requests = self._new_requests, []
        for request in new_requests:
            self._requests[request.seq.request_id] = request
            self.core.add(request.seq)
        for request in list(self._requests.values()):
            self._finish(request, reason)

    def _emit(self, request: Request, delta: StreamDelta, output: RequestOutput | None) -> None:
        if request.callback is None:
            return
        try:
            request.callback(delta, output)
        except Exception:
            logger.exception("output callback of request %s failed; aborting it", request.seq.request_id)
            self._finish(request, "abort")
