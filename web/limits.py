"""Request limits: body size (an ASGI middleware, so nothing oversized is parsed) and a per-user
request rate."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from web.errors import WebError

MAX_TRACKED_USERS = 10_000


class BodySizeLimit:
    """413 for a body over `max_bytes`, by its Content-Length or, for a chunked body, as it
    arrives. The body is buffered (it is small by then) and replayed to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body = bytearray()
        more_body = True
        while more_body:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            more_body = message.get("more_body", False)

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = WebError(413, f"The request body is larger than {self.max_bytes} bytes.", code="request_too_large")
        await error.response()(scope, receive, send)


class RateLimiter:
    """A token bucket per user: `per_minute` requests a minute on average, bursts of as many.
    0 turns the limit off."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, updated)

    def check(self, user: str) -> None:
        """Take one request from `user`'s bucket, or raise 429 saying when the next one is allowed."""
        if not self.per_minute:
            return
        now = self._clock()
        rate = self.per_minute / 60.0
        tokens, updated = self._buckets.get(user, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - updated) * rate)
        if tokens < 1.0:
            self._buckets[user] = (tokens, now)
            wait_s = math.ceil((1.0 - tokens) / rate)
            raise WebError(
                429,
                f"Too many requests: at most {self.per_minute} a minute per user. Retry in {wait_s} s.",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(wait_s)},
            )
        self._buckets[user] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_TRACKED_USERS:
            self._forget_idle(now)

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that have refilled: forgetting them changes nothing."""
        full_after_s = 60.0
        self._buckets = {user: b for user, b in self._buckets.items() if now - b[1] < full_after_s}
