"""The pieces without a model: rate limiter, body limit, console cookies, masked config."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from settings import Settings
from web.admin import auth
from web.admin.api import MASK, masked
from web.errors import WebError
from web.limits import BodySizeLimit, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_allows_a_burst_then_refills() -> None:
    clock = Clock()
    limiter = RateLimiter(per_minute=3, clock=clock)
    for _ in range(3):
        limiter.check("ann")
    with pytest.raises(WebError) as excinfo:
        limiter.check("ann")
    assert excinfo.value.status_code == 429
    assert excinfo.value.headers["Retry-After"] == "20"
    limiter.check("bob")  # users have their own buckets
    clock.now = 20.0
    limiter.check("ann")


def test_rate_limit_zero_is_off() -> None:
    limiter = RateLimiter(per_minute=0)
    for _ in range(1000):
        limiter.check("ann")


@pytest.fixture
def echo() -> TestClient:
    app = FastAPI()

    @app.post("/echo")
    async def echo_body(request: Request) -> dict[str, int]:
        return {"received": len(await request.body())}

    app.add_middleware(BodySizeLimit, max_bytes=1000)
    return TestClient(app)


def test_body_limit_by_content_length(echo: TestClient) -> None:
    assert echo.post("/echo", content=b"x" * 1000).json() == {"received": 1000}
    refused = echo.post("/echo", content=b"x" * 1001)
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "request_too_large"


def test_body_limit_for_chunked_bodies(echo: TestClient) -> None:
    def chunks(count: int) -> Iterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(count):
            yield b"x" * 300

    assert echo.post("/echo", content=chunks(3)).json() == {"received": 900}
    assert echo.post("/echo", content=chunks(4)).status_code == 413


def test_console_cookie_expires_and_is_bound_to_the_token() -> None:
    cookie = auth.issue("token-a", ttl_s=60, now=1000)
    assert auth.verify(cookie, "token-a", now=1059)
    assert not auth.verify(cookie, "token-a", now=1061)
    assert not auth.verify(cookie, "token-b", now=1000)
    expires, _, signature = cookie.partition(".")
    assert not auth.verify(f"{int(expires) + 3600}.{signature}", "token-a", now=1000)
    assert not auth.verify("garbage", "token-a", now=1000)


def test_config_masks_secrets() -> None:
    settings = Settings.model_validate(
        {
            "admin": {"token": "admin-secret"},
            "api": {"key": "sk-secret"},
            "feishu": {"app_id": "cli_1", "app_secret": "feishu-secret"},
            "storage": {"url": "postgresql+psycopg://bot:db-secret@db/clawdbot"},
        }
    )
    values = masked(settings)
    text = repr(values)
    for secret in ("admin-secret", "sk-secret", "feishu-secret", "db-secret"):
        assert secret not in text
    assert values["admin"]["token"] == values["api"]["key"] == MASK
    assert values["feishu"]["app_id"] == "cli_1"
    assert values["feishu"]["encrypt_key"] == ""
