"""The benchmark's side of the wire: OpenAI-style streaming chat completions, and the admin
console's counters, read over HTTP as any client or operator would."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import astuple, dataclass
from typing import Any, Self

import aiohttp

Message = dict[str, str]


class RequestFailed(Exception):
    """The app answered with an error status or an error event in the stream."""


@dataclass(frozen=True)
class Target:
    url: str
    api_key: str = ""
    admin_token: str = ""


@dataclass(frozen=True)
class Reply:
    text: str
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Counters:
    """The app's cumulative counters (GET /admin/api/stats); a run's figures are the difference."""

    engine_requests: int
    prompt_tokens: int  # prompts of engine requests, in tokens
    reused_tokens: int  # of those, taken from the prefix cache instead of computed
    generated: int  # turns answered by a generation of their own
    exact: int
    semantic: int
    merged: int
    compressions: int

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> Counters:
        turns, engine = stats["turns"], stats["engine"]
        levels = turns["by_level"]
        return cls(
            engine_requests=sum(engine["activity"]["finish_reasons"].values()),
            prompt_tokens=engine["activity"]["prompt_tokens"],
            reused_tokens=engine["kv_cache"]["prefix_hit_tokens"],
            generated=levels["miss"],
            exact=levels["exact"],
            semantic=levels["semantic"],
            merged=levels["merged"],
            compressions=turns["compressions"],
        )

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(mine - theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))


class ApiClient:
    """One HTTP connection pool for a whole run; `async with` finds the model and logs in to the
    console when an admin token is given.

    On aiohttp, not httpx: the client shares the two cores with the server it measures, and what it
    spends is counted in every TTFT it reports, ours and the peer's alike. On the peer workload, at
    p50, from a request's start to the app reading it: httpx 4.9-6.4 ms (4.5 of them before its
    last byte was sent), aiohttp 1.0; from the first SSE chunk written to its text read: 1.3-1.6
    against 0.5 ms (instrumented runs, stamps on the shared monotonic clock)."""

    def __init__(self, target: Target, max_tokens: int) -> None:
        self.target = target
        self.max_tokens = max_tokens
        self.model = ""
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "use ApiClient with `async with`"
        return self._http

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else None,
            timeout=aiohttp.ClientTimeout(total=600.0, connect=10.0),
            connector=aiohttp.TCPConnector(limit=0),
            # the console's session cookie comes from 127.0.0.1, which the default jar refuses
            cookie_jar=aiohttp.CookieJar(unsafe=True),
        )
        models = await self.get_json("/v1/models")
        self.model = models["data"][0]["id"]
        if self.target.admin_token:
            token = {"token": self.target.admin_token}
            async with self.http.post(self.url("/admin/login"), data=token, allow_redirects=False) as response:
                if response.status != 303:
                    raise RequestFailed(f"admin login refused (HTTP {response.status}): check the admin token")
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.http.close()

    def url(self, path: str) -> str:
        return f"{self.target.url}{path}"

    async def chat(self, messages: list[Message]) -> Reply:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        first_text_at: float | None = None
        pieces: list[str] = []
        usage: dict[str, Any] | None = None
        async with self.http.post(self.url("/v1/chat/completions"), json=body) as response:
            if response.status != 200:
                raise RequestFailed(f"HTTP {response.status}: {(await response.text())[:300]}")
            async for chunk in _events(response):
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    if piece := choice["delta"].get("content"):
                        first_text_at = first_text_at or time.perf_counter()
                        pieces.append(piece)
        finished = time.perf_counter()
        if usage is None:
            raise RequestFailed("the stream ended without usage")
        return Reply(
            text="".join(pieces),
            ttft_s=(first_text_at or finished) - started,
            latency_s=finished - started,
            prompt_tokens=usage["prompt_tokens"],
            # Servers that do not report prefix reuse leave the details out.
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            completion_tokens=usage["completion_tokens"],
        )

    async def counters(self) -> Counters | None:
        if not self.target.admin_token:
            return None
        return Counters.from_stats(await self.get_json("/admin/api/stats"))

    async def get_json(self, path: str) -> Any:
        async with self.http.get(self.url(path)) as response:
            if response.status != 200:
                raise RequestFailed(f"GET {path}: HTTP {response.status}: {(await response.text())[:300]}")
            return await response.json()


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI server-sent event stream, up to [DONE]."""
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        data = line.removeprefix(b"data: ").rstrip(b"\r\n")
        if data == b"[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise RequestFailed(chunk["error"]["message"])
        yield chunk
