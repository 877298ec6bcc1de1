"""EngineProcess: an LLMEngine in a process of its own, behind the same interface. The app runs this.

torch lets go of the GIL around every op, and a step of a small model is a few hundred short ops:
sharing a process with the app, the engine waits at each of them for the event loop (SSE framing,
JSON, the turn pipeline) to hand the GIL back. Among 8 streams a step that prefilled a turn of the
demo model took 21 ms in the app and 10 ms alone; its layers took 13.5 ms beside a Python thread
busy half the time, 5.9 ms beside a process as busy (Intel Xeon, 2 cores). vLLM runs its engine
core in a process of its own for the same reason.

Requests cross a pipe to the process (`process_main.py`), which feeds them to its LLMEngine; a
step's deltas come back the same way in one message, and each is handed to its callback on this
side's reader thread. Prompts
are checked here first, so bad input raises ValueError at once, as with LLMEngine. The process's
log records are handled by this process's logging. If the process dies, the requests in flight end
with finish_reason "error" and `is_running()` turns False.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

from .chat_format import ChatFormat
from .checkpoints import load_tokenizer
from .config import EngineConfig
from .metrics import EngineFigures
from .outputs import FinishReason, RequestOutput, StreamDelta
from .process_main import Loaded, Spawned, ended, spawn
from .request import InputProcessor, OutputCallback, Request
from .streams import CallbackEngine

logger = logging.getLogger(__name__)

# The process answers between two of its engine's ops, a millisecond or so: longer means it is
# stuck or gone, and the last figures it sent are the best there are.
FIGURES_TIMEOUT_S = 2.0
# What the process needs past the engine's own shutdown timeout to say it has stopped and exit
# (it answers at once); a process still there by then is killed.
EXIT_GRACE_S = 1.0


class EngineProcess(CallbackEngine):
    """An engine process, taken from `spawn` once its model is loaded (the constructor waits, and
    raises what loading raised); it serves requests once started.

    `_send_lock` orders what goes to the process: a request is registered and sent under it, so
    its abort can never overtake it. `_lock` guards the requests in flight and the figures asked
    for; the reader thread takes only `_lock`, so a send stuck on a full pipe never stops it from
    draining the other way.
    """

    def __init__(self, spawned: Spawned) -> None:
        """Takes the process `spawn` started and waits for its model."""
        self._process, self._conn, self._cpu_claim = spawned.process, spawned.conn, spawned.cpu_claim
        loaded = self._receive_loaded()
        logger.info("the engine runs in process %d", self._process.pid)
        self.model_name = loaded.model_name
        self.is_demo_model = loaded.is_demo_model
        self.num_parameters = loaded.num_parameters
        self.max_model_len = loaded.max_model_len
        self.max_num_seqs = loaded.max_num_seqs
        self.tokenizer = load_tokenizer(Path(loaded.tokenizer_path))
        self.inputs = InputProcessor(self.tokenizer, loaded.vocab_size, loaded.max_model_len)
        self._eos_token_ids = loaded.eos_token_ids
        self._last_figures = loaded.figures
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._live: dict[str, OutputCallback | None] = {}
        self._waiting: set[str] = set()  # in flight, no token yet
        self._figures_asked: dict[int, Future[EngineFigures]] = {}
        self._figures_tokens = itertools.count()
        self._started = self._stopped = False
        self._stopped_in_time = False
        self._reader = threading.Thread(target=self._read, name="llm-engine-output", daemon=True)
        self._reader.start()
        _running.add(self)

    @classmethod
    def from_pretrained(cls, model: str = EngineConfig.model, **options: Any) -> Self:
        return cls(spawn(EngineConfig(model=model, **options)))

    def chat_format(self, *, enable_thinking: bool = False) -> ChatFormat:
        return ChatFormat.for_tokenizer(
            self.tokenizer, enable_thinking=enable_thinking, eos_token_ids=self._eos_token_ids
        )

    def start(self) -> Self:
        """Starts taking requests; they are refused before."""
        self._started = True
        return self

    def claim_cpu(self) -> AbstractContextManager[None]:
        return self._cpu_claim.held()

    def abort(self, request_id: str) -> None:
        with self._send_lock:
            with self._lock:
                if request_id not in self._live or self._stopped:
                    return
            self._send(("abort", request_id))

    @property
    def num_waiting_requests(self) -> int:
        """Requests sent that have no token yet: queued in the process, or prefilling."""
        with self._lock:
            return len(self._waiting)

    def figures(self) -> EngineFigures:
        """The process's figures now; the last it sent where it cannot answer (stopped, stuck)."""
        reply: Future[EngineFigures] = Future()
        with self._send_lock:
            with self._lock:
                if not self.is_running():
                    return self._last_figures
                token = next(self._figures_tokens)
                self._figures_asked[token] = reply
            self._send(("figures", token))
        try:
            return reply.result(FIGURES_TIMEOUT_S)
        except FutureTimeout:
            return self._last_figures
        finally:
            with self._lock:
                self._figures_asked.pop(token, None)

    @property
    def pid(self) -> int | None:
        """The engine process's id."""
        return self._process.pid

    def is_running(self) -> bool:
        return self._started and not self._stopped and self._reader.is_alive()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stops the process; requests in flight finish with finish_reason "abort". Waits for the
        step in progress at most `timeout_s` (None: for ever); False if it was still running."""
        with self._send_lock:
            with self._lock:
                already, self._stopped = self._stopped, True
            if not already:
                self._send(("shutdown", timeout_s))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s + EXIT_GRACE_S
        self._reader.join(_left(deadline))
        # Once it has said it stopped, nothing of it is left to lose: it is not waited for twice.
        self._process.join(_left(deadline))
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        return self._stopped_in_time

    # --- requests -------------------------------------------------------------------------------

    def _check_request_id(self, request_id: str) -> None:
        if self._stopped:
            raise RuntimeError("the engine is shut down")
        if not self._started:
            raise RuntimeError("the engine is not started: call start() or use it as a context manager")
        if not self._reader.is_alive():
            raise RuntimeError("the engine process has exited")
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in flight")

    def _enqueue(self, requests: list[Request]) -> None:
        with self._send_lock:
            with self._lock:
                for request in requests:
                    self._check_request_id(request.seq.request_id)
                for request in requests:
                    self._live[request.seq.request_id] = request.callback
                    self._waiting.add(request.seq.request_id)
            for request in requests:
                seq = request.seq
                self._send(("add", seq.request_id, seq.prompt_token_ids, seq.params, seq.priority))

    def _send(self, message: tuple[Any, ...]) -> None:
        """Under `_send_lock`. A process that is gone drops it: the reader ends its requests."""
        with contextlib.suppress(OSError):
            self._conn.send(message)

    # --- what comes back, on the reader thread --------------------------------------------------

    def _receive_loaded(self) -> Loaded:
        while True:
            try:
                message = self._conn.recv()
            except EOFError:
                self._process.join()
                raise RuntimeError(
                    f"the engine process exited while loading the model (exit code {self._process.exitcode})"
                ) from None
            if message[0] == "log":
                _handle(message[1])
            elif message[0] == "failed":
                self._process.join()
                raise message[1]
            else:
                assert message[0] == "ready"
                loaded: Loaded = message[1]
                return loaded

    def _read(self) -> None:
        reason: FinishReason = "abort"
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "deltas":
                    for request_id, delta, output in message[1]:
                        self._deliver(request_id, delta, output)
                elif kind == "figures":
                    self._answer_figures(message[1], message[2])
                elif kind == "log":
                    _handle(message[1])
                else:
                    assert kind == "stopped"
                    self._stopped_in_time = message[1]
                    return
        except (EOFError, OSError):
            if not self._stopped:
                reason = "error"
                self._process.join(EXIT_GRACE_S)  # for its exit code
                logger.error(
                    "the engine process exited (exit code %s); the requests in flight end with finish_reason 'error'",
                    self._process.exitcode,
                )
        finally:
            self._end_all(reason)

    def _deliver(self, request_id: str, delta: StreamDelta, output: RequestOutput | None) -> None:
        with self._lock:
            if request_id not in self._live:
                return
            callback = self._live.pop(request_id) if delta.finished else self._live[request_id]
            self._waiting.discard(request_id)
        if callback is None:
            return
        try:
            callback(delta, output)
        except Exception:
            logger.exception("output callback of request %s failed; aborting it", request_id)
            self.abort(request_id)

    def _answer_figures(self, token: int, figures: EngineFigures) -> None:
        self._last_figures = figures
        with self._lock:
            reply = self._figures_asked.get(token)
        if reply is not None:
            reply.set_result(figures)

    def _end_all(self, reason: FinishReason) -> None:
        """The process is gone: every request still in flight ends with `reason`."""
        with self._lock:
            self._stopped = True
            live, self._live = self._live, {}
            self._waiting.clear()
        for request_id, callback in live.items():
            if callback is None:
                continue
            try:
                callback(*ended(request_id, reason))
            except Exception:
                logger.exception("output callback of request %s failed", request_id)


# Engines not shut down when the interpreter exits are shut down then, before multiprocessing
# terminates their processes (its exit hook, registered at its import, runs after this one).
_running: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


@atexit.register
def _shut_down_at_exit() -> None:
    for engine in list(_running):
        engine.shutdown(EXIT_GRACE_S)


def _left(deadline: float | None) -> float | None:
    """The seconds until `deadline` (time.monotonic), none below zero; None: no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _handle(record: logging.LogRecord) -> None:
    """A record the process logged, handled here as if logged here."""
    logging.getLogger(record.name).handle(record)
