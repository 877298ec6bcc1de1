"""Admission: the requests in flight, wherever they wait, are what a 429 counts; every way a
request ends gives its place back. The real app, in-process, on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from settings import Settings
from tests.support import SHARED_DATA_DIR, free_port, until
from web.admission import Admission
from wiring import build_app

MODEL = "builtin:tiny-qwen3"
LONG = 12_000  # tokens: the demo model rarely stops by itself, so a reply this long holds its place


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    settings = Settings.model_validate(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'bot.db'}"},
            "engine": {"model": MODEL, "data_dir": str(SHARED_DATA_DIR), "max_num_seqs": 1},
            # In flight at most max_queued_requests + max_num_seqs = 2.
            "api": {"max_queued_requests": 1},
            "generation": {"temperature": 0, "max_reply_tokens": LONG, "max_tokens": LONG},
            "limits": {"requests_per_minute": 0},
            "logging": {"level": "WARNING"},
        }
    )
    app = build_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await until(lambda: server.started)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=120) as http:
        yield app, http
    server.should_exit = True
    await serving


async def opened(response: Awaitable[httpx.Response]) -> tuple[httpx.Response, AsyncIterator[str]]:
    """The response once its first line of body has arrived, and its lines to come (kept: a
    dropped line iterator closes the response)."""
    started = await response
    assert started.status_code == 200, await started.aread()
    lines = started.aiter_lines()
    await anext(lines)
    return started, lines


async def test_beyond_the_limit_in_flight_is_429_at_once_and_every_ending_releases_its_place(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, http = served
    admission: Admission = app.state.admission
    engine = app.state.chat_manager.engine
    await http.get("/")  # the chat page's conversation cookie
    page = {"text": "Write a very long story."}

    # One turn generates; the next turn of the same conversation waits for the session's lock,
    # not in the engine's queue, and still takes a place.
    generating, _generating_lines = await opened(
        http.send(http.build_request("POST", "/chat/api/messages", json=page), stream=True)
    )
    waiting = asyncio.create_task(http.send(http.build_request("POST", "/chat/api/messages", json=page), stream=True))
    await until(lambda: admission.in_flight == 2)
    assert engine.num_waiting_requests == 0

    refused = await http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    assert "api.max_queued_requests" in refused.json()["error"]["message"]
    assert admission.in_flight == 2  # a refused request takes no place

    await generating.aclose()  # the page is closed mid-stream
    second, _second_lines = await opened(waiting)
    await until(lambda: admission.in_flight == 1)
    await second.aclose()
    await until(lambda: admission.in_flight == 0)

    # A completed answer, a stream read to its end and a request refused after admission.
    answered = await http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert answered.status_code == 200, answered.text
    streamed = await http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True},
    )
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    unknown = await http.post(
        "/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert unknown.status_code == 404
    assert admission.in_flight == 0
