"""The server's own limits, with raw sockets against the real app: half-sent requests are closed,
idle connections too, an endless request head is refused, a response nobody reads is aborted; the
API docs when turned on."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
import uvicorn

from tests.app_process import AppProcess
from tests.web.web_support import running_app
from web.http_protocol import DeadlineH11Protocol

READ_TIMEOUT_S = 1
KEEP_ALIVE_TIMEOUT_S = 1
MAX_HEADER_BYTES = 4096
# Without the deadline these connections stay open for good; the wait is that long only so a
# loaded machine is not mistaken for a failure.
PATIENCE_S = 20.0


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    overrides: dict[str, dict[str, Any]] = {
        "server": {
            "request_read_timeout_s": READ_TIMEOUT_S,
            "keep_alive_timeout_s": KEEP_ALIVE_TIMEOUT_S,
            "max_header_bytes": MAX_HEADER_BYTES,
        },
        "api": {"docs": True},
    }
    with running_app(tmp_path_factory, overrides) as running:
        yield running


def _connect(app: AppProcess, timeout_s: float = PATIENCE_S) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", app.port))
    sock.settimeout(timeout_s)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes the connection; socket.timeout if it never does."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


HALF_SENT = [
    b"",  # connected, silent
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # the head never ends
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",  # nor the body
]


def test_half_sent_requests_are_closed(app: AppProcess) -> None:
    with ExitStack() as stack:
        sockets = []
        for i in range(60):
            sock = stack.enter_context(_connect(app))
            sock.sendall(HALF_SENT[i % len(HALF_SENT)])
            sockets.append(sock)
        for sock in sockets:
            received = _read_until_closed(sock)
            assert b"200 OK" not in received
    assert httpx.get(f"{app.base_url}/healthz").status_code == 200  # the server still serves


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(app: AppProcess) -> None:
    # uvicorn's default is 5 s: a wait shorter than that shows the setting is applied.
    with _connect(app, timeout_s=4.0) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 200 OK")


def test_a_request_head_past_the_limit_is_refused(app: AppProcess) -> None:
    with _connect(app) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * MAX_HEADER_BYTES)
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 400 Bad Request")


def test_a_slow_reply_is_not_cut_by_the_read_deadline(app: AppProcess) -> None:
    # The deadline is for reading the request: a reply that streams for longer still arrives whole.
    body = {
        "model": "builtin:tiny-qwen3",
        "stream": True,
        "max_tokens": 150,
        "messages": [{"role": "user", "content": "Write a long story."}],
    }
    with httpx.stream("POST", f"{app.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        text = response.read().decode()
    assert text.rstrip().endswith("data: [DONE]")


def test_the_api_docs_when_turned_on(app: AppProcess) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{app.base_url}{path}").status_code == 200, path


def test_a_response_the_client_stops_reading_is_aborted() -> None:
    """uvicorn with our protocol, serving an endless stream to a client that reads none of it: the
    app sees the client leave once the buffers have been full for the write deadline. (The real
    app would need megabytes of reply to fill the sockets' buffers; the protocol is the same.)"""
    left = threading.Event()

    async def endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def until_disconnected() -> None:
            message = await receive()
            while message["type"] != "http.disconnect":  # the request's body: nothing to do with it
                message = await receive()
            left.set()

        watching = asyncio.create_task(until_disconnected())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        while not left.is_set():
            await send({"type": "http.response.body", "body": b"x" * 1_000_000, "more_body": True})
        await watching

    config = uvicorn.Config(
        endless,
        lifespan="off",
        log_level="warning",
        http=DeadlineH11Protocol.with_timeouts(read_timeout_s=5, write_timeout_s=1),
    )
    server = uvicorn.Server(config)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        serving = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
        serving.start()
        try:
            with socket.socket() as client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.connect(("127.0.0.1", port))
                client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert left.wait(PATIENCE_S), "the server kept writing to a client that reads nothing"
        finally:
            server.should_exit = True
            serving.join(PATIENCE_S)
