"""The engine's process, EngineProcess's other side: `spawn` starts it, and it loads an LLMEngine
and serves what comes down the pipe. Nothing heavy is imported here, so that the app can start it
before it loads its own libraries: the process imports torch and loads the model meanwhile
(`/readyz` 15.0 s against 19.7 s when the app started it after its own imports, alternated runs)."""

from __future__ import annotations

import contextlib
import gc
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from .config import EngineConfig
from .cpu_claim import CpuClaim
from .metrics import EngineFigures
from .outputs import FinishReason, RequestOutput, StreamDelta
from .sampling_params import SamplingParams
from .token_ids import PromptIds

if TYPE_CHECKING:
    from .llm_engine import LLMEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spawned:
    """An engine process started, its model loading; `EngineProcess(spawned)` waits for it."""

    process: BaseProcess
    conn: Connection
    cpu_claim: CpuClaim


def spawn(config: EngineConfig, cpu_claim: CpuClaim | None = None) -> Spawned:
    """Starts the engine's process. Spawned, not forked: a fork would copy the locks of the app's
    threads. Its log records come at this process's logging level as it is now."""
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    cpu_claim = cpu_claim or CpuClaim()
    process = context.Process(
        target=serve,
        args=(config, child_conn, logging.getLogger().getEffectiveLevel(), cpu_claim),
        name="llm-engine",
        daemon=True,
    )
    process.start()
    child_conn.close()
    return Spawned(process, conn, cpu_claim)


@dataclass(frozen=True)
class Loaded:
    """What the process tells about its engine once the model is loaded."""

    model_name: str
    is_demo_model: bool
    num_parameters: int | None
    max_model_len: int
    max_num_seqs: int
    vocab_size: int
    eos_token_ids: list[int]
    tokenizer_path: str
    figures: EngineFigures


def ended(request_id: str, reason: FinishReason) -> tuple[StreamDelta, RequestOutput]:
    """The last delta and the output of a request ended without a token from the engine."""
    return StreamDelta(finished=True, finish_reason=reason), RequestOutput(request_id, [], "", reason, 0, 0, None)


class _PipeHandler(logging.handlers.QueueHandler):
    """Sends each record, its message and traceback formatted, to the app's process."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # enqueue() is ours: no queue
        self._send_message = send

    def enqueue(self, record: logging.LogRecord) -> None:
        self._send_message(("log", record))


def serve(config: EngineConfig, conn: Connection, log_level: int, cpu_claim: CpuClaim) -> None:
    """The process: loads the engine, then runs what the app sends until it says stop or goes."""
    # Before torch's OpenMP loads: its workers sleep between ops, which the engine's thread counts
    # were chosen under (model_runner.py), and a worker spinning would take the core the app needs.
    # The app's spin count (app.configure_process) comes with the environment, and libgomp takes a
    # spin count over the policy: left here, it kept these workers spinning too.
    os.environ.pop("GOMP_SPINCOUNT", None)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from .llm_engine import LLMEngine  # torch and transformers: imported by the process, not by spawn's caller

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the app, which stops this through the pipe
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    root = logging.getLogger()
    root.handlers = [_PipeHandler(send)]
    root.setLevel(log_level)
    try:
        engine = LLMEngine(config, cpu_claim)
    except Exception as exc:  # noqa: BLE001 - raised again in the app's process
        with contextlib.suppress(OSError):  # unless the app is gone
            send(("failed", _sendable(exc)))
        return
    # The loaded libraries' objects live as long as the process: a full collection walking them
    # would stall a step for hundreds of milliseconds (web/starting.py freezes the app's alike).
    gc.collect()
    gc.freeze()
    outbox = _Outbox(send)
    engine.start(after_outputs=outbox.send)
    try:
        send(("ready", _loaded(engine)))
        _serve_requests(engine, conn, outbox, send)
    except (EOFError, OSError):  # the app's process is gone
        engine.shutdown(0)


# what the app's callback of a request is called with, and for which request
_Delivery = tuple[str, StreamDelta, RequestOutput | None]


class _Outbox:
    """The deltas of one round of the engine's loop, sent to the app as one message: a pipe write,
    and the app's reader woken, once a step rather than once a stream. Under the peer workload's 8
    streams the sends were 7.8% of the step thread's samples one delta a message and 6.1% one
    message a step (py-spy): most of a send is the wake-up, which is now once a step."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        self._send = send
        self._lock = threading.Lock()  # the engine's thread puts and sends; a refused request, the main thread
        self._deltas: list[_Delivery] = []

    def put(self, request_id: str, delta: StreamDelta, output: RequestOutput | None) -> None:
        with self._lock:
            self._deltas.append((request_id, delta, output))

    def send(self) -> None:
        with self._lock:
            deltas, self._deltas = self._deltas, []
        if deltas:
            self._send(("deltas", deltas))


def _serve_requests(
    engine: LLMEngine, conn: Connection, outbox: _Outbox, send: Callable[[tuple[Any, ...]], None]
) -> None:
    """What the app sends, until it says stop."""

    def add(request_id: str, prompt: PromptIds, params: SamplingParams, priority: int) -> None:
        def deliver(delta: StreamDelta, output: RequestOutput | None) -> None:
            outbox.put(request_id, delta, output)

        try:
            engine.add_request(prompt, params, request_id, priority=priority, callback=deliver)
        except (ValueError, RuntimeError) as exc:  # checked in the app already: only a race with shutdown
            logger.error("request %s refused: %s", request_id, exc)
            deliver(*ended(request_id, "error"))
            outbox.send()

    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "add":
            add(*message[1:])
        elif kind == "abort":
            engine.abort(message[1])
        elif kind == "figures":
            send(("figures", message[1], engine.figures()))
        else:
            assert kind == "shutdown"
            stopped = engine.shutdown(message[1])
            send(("stopped", stopped))
            return


def _loaded(engine: LLMEngine) -> Loaded:
    return Loaded(
        model_name=engine.model_name,
        is_demo_model=engine.is_demo_model,
        num_parameters=engine.num_parameters,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        vocab_size=engine.inputs.vocab_size,
        eos_token_ids=sorted(engine.core.eos_token_ids),
        tokenizer_path=str(engine.tokenizer.name_or_path),
        figures=engine.figures(),
    )


def _sendable(exc: Exception) -> Exception:
    """`exc` if it survives the pipe, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any exception type may fail to pickle its own way
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
