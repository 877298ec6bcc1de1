"""Request limits: body size (an ASGI middleware, so nothing oversized is parsed), a request rate
per client, and a back-off for failed logins per client.

A client is its address, never something it chooses: OpenAI's `user` field or a cookie would give
a flooder a fresh bucket per request (300 `user` values went through a limit of 60)."""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chat.rate_limits import TokenBuckets
from web.errors import WebError

MAX_TRACKED_CLIENTS = 10_000
FREE_LOGIN_FAILURES = 5
MAX_LOGIN_BACKOFF_S = 900.0
# A client without a failed login for this long starts again with its free failures.
FORGET_LOGIN_FAILURES_S = 3600.0
# One IPv6 subscriber usually holds a whole /64: 2**64 addresses, one per request if it likes.
IPV6_CLIENT_PREFIX = 64


def client_address(request: Request) -> str:
    """The client's address (behind a proxy on this host, uvicorn's proxy_headers give the real
    one); an IPv6 client's /64 network."""
    host = request.client.host if request.client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(address)


def client_key(request: Request, api_key: str) -> str:
    """A client's rate bucket: its address and, when a key is set, the key's identity (a hash: the
    key itself is never kept)."""
    address = client_address(request)
    if not api_key:
        return address
    return f"{hashlib.sha256(api_key.encode()).hexdigest()[:16]}@{address}"


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


class RateLimiter(TokenBuckets):
    """A token bucket per client (chat/rate_limits.py). The API and the chat page share a
    client's bucket."""

    def check_client(self, request: Request, api_key: str) -> None:
        self.check(client_key(request, api_key))

    def check(self, user: str) -> None:
        """Take one request from `user`'s bucket, or raise 429 saying when the next one is allowed."""
        wait_s = self.take(user)
        if not wait_s:
            return
        raise WebError(
            429,
            f"Too many requests: at most {self.per_minute} a minute per client. Retry in {wait_s} s.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(wait_s)},
        )


@dataclass
class _Failures:
    count: int
    last: float


class LoginThrottle:
    """Failed logins per client: the first FREE_LOGIN_FAILURES are free, then each failure makes
    the client wait twice as long as the last (1 s, 2 s, 4 s, ... up to 15 min). While it waits,
    every login is refused, the right one too, so guessing meanwhile gains nothing. A success
    forgets the client."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, _Failures] = {}  # ordered by last failure, oldest first

    def wait_s(self, client: str) -> int:
        """Seconds until `client` may try again; 0: now."""
        failures = self._failures.get(client)
        if failures is None:
            return 0
        return max(0, math.ceil(failures.last + self._backoff_s(failures.count) - self._clock()))

    def failed(self, client: str) -> None:
        now = self._clock()
        self._forget_idle(now)
        failures = self._failures.pop(client, _Failures(0, now))
        self._failures[client] = _Failures(failures.count + 1, now)
        while len(self._failures) > MAX_TRACKED_CLIENTS:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)

    @staticmethod
    def _backoff_s(count: int) -> float:
        if count < FREE_LOGIN_FAILURES:
            return 0.0
        return min(MAX_LOGIN_BACKOFF_S, 2.0 ** (count - FREE_LOGIN_FAILURES))

    def _forget_idle(self, now: float) -> None:
        while self._failures:
            oldest = next(iter(self._failures))
            if now - self._failures[oldest].last < FORGET_LOGIN_FAILURES_S:
                return
            del self._failures[oldest]
