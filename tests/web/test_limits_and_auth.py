"""The pieces without a model: rate limiter, login throttle, body limit, signed cookies, the chat
page's switch, masked config."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from settings import Settings
from web import signing
from web.admin import auth
from web.admin.api import MASK, masked
from web.chat_page import serves_chat_page, warn_if_open
from web.errors import WebError
from web.limits import (
    FREE_LOGIN_FAILURES,
    MAX_LOGIN_BACKOFF_S,
    MAX_TRACKED_CLIENTS,
    BodySizeLimit,
    LoginThrottle,
    RateLimiter,
    client_key,
)


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


def _request(host: str, user_agent: str = "") -> Request:
    return Request({"type": "http", "client": (host, 40000), "headers": [(b"user-agent", user_agent.encode())]})


def test_rate_limit_buckets_are_the_client_address_and_the_key() -> None:
    limiter = RateLimiter(per_minute=2, clock=Clock())
    for _ in range(2):
        limiter.check_client(_request("203.0.113.7"), api_key="sk-one")
    with pytest.raises(WebError):  # nothing the client sends picks another bucket
        limiter.check_client(_request("203.0.113.7", user_agent="someone else"), api_key="sk-one")
    limiter.check_client(_request("203.0.113.8"), api_key="sk-one")
    limiter.check_client(_request("203.0.113.7"), api_key="sk-two")
    assert "sk-one" not in client_key(_request("203.0.113.7"), "sk-one")
    # One IPv6 subscriber holds a /64; an IPv4 client may arrive IPv4-mapped.
    assert client_key(_request("2001:db8:1:2::1"), "") == client_key(_request("2001:db8:1:2:ffff::9"), "")
    assert client_key(_request("2001:db8:1:2::1"), "") != client_key(_request("2001:db8:1:3::1"), "")
    assert client_key(_request("::ffff:203.0.113.7"), "") == client_key(_request("203.0.113.7"), "")


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


@pytest.mark.parametrize("expires", ["9" * 5000, "²", "١٧٠٠٠٠٠٠٠٠", "", "-1", " 1700000000"])
def test_a_malformed_cookie_expiry_is_not_a_login(expires: str) -> None:
    # Correctly signed, so only the expiry's parsing decides: isdigit() took "²" (int() refuses
    # it) and 5,000 digits passed int()'s 4,300-digit limit; both were 500s.
    cookie = signing.sign(expires, "token-a", auth.LOGIN.purpose)
    assert not auth.verify(cookie, "token-a", now=1000)
    assert not auth.verify(f"{expires}.not-hex-²", "token-a", now=1000)


def test_a_cookie_signed_for_one_purpose_does_not_pass_for_another() -> None:
    chat_login = signing.issue("same-secret", "clawdbot-chat-login", ttl_s=60, now=1000)
    assert signing.verify(chat_login, "same-secret", "clawdbot-chat-login", now=1000)
    assert not auth.verify(chat_login, "same-secret", now=1000)


def test_the_stored_secret_is_created_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "secret"
    first = signing.stored_secret(path)
    signing.stored_secret.cache_clear()  # as a restarted process would
    assert signing.stored_secret(path) == first
    assert len(first) >= signing.MIN_SECRET_CHARS
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]


def test_logins_back_off_after_free_failures_and_a_success_resets() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(FREE_LOGIN_FAILURES - 1):
        assert throttle.wait_s("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 1  # the login form answers 429 with Retry-After: 1
    assert throttle.wait_s("10.0.0.2") == 0  # per client
    clock.now = 1.0
    assert throttle.wait_s("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 2  # doubling
    for _ in range(30):
        clock.now += throttle.wait_s("10.0.0.1")
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == MAX_LOGIN_BACKOFF_S
    throttle.succeeded("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0
    for _ in range(FREE_LOGIN_FAILURES - 1):  # the free failures are back
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0


def test_login_failures_are_forgotten_when_idle_and_bounded() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(FREE_LOGIN_FAILURES):
        throttle.failed("10.0.0.1")
    clock.now = 3600.0
    throttle.failed("10.0.0.2")  # forgets 10.0.0.1: an hour without a failure
    for _ in range(FREE_LOGIN_FAILURES - 1):
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0
    for i in range(MAX_TRACKED_CLIENTS + 100):
        throttle.failed(f"client-{i}")
    assert len(throttle._failures) == MAX_TRACKED_CLIENTS


@pytest.mark.parametrize(
    ("host", "chat_page", "served"),
    [
        ("127.0.0.1", "auto", True),
        ("::1", "auto", True),
        ("localhost", "auto", True),
        ("0.0.0.0", "auto", False),
        ("192.168.1.20", "auto", False),
        ("0.0.0.0", True, True),
        ("127.0.0.1", False, False),
    ],
)
def test_the_chat_page_is_served_by_default_only_on_loopback(host: str, chat_page: str | bool, served: bool) -> None:
    settings = Settings.model_validate({"server": {"host": host}, "api": {"chat_page": chat_page}})
    assert serves_chat_page(settings) is served


def test_a_chat_page_forced_open_to_other_hosts_without_a_key_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="web.chat_page")
    for server, api in (
        ({"host": "0.0.0.0"}, {"chat_page": "auto"}),
        ({"host": "0.0.0.0"}, {"chat_page": True, "key": "sk-set"}),
        ({"host": "127.0.0.1"}, {"chat_page": True}),
    ):
        warn_if_open(Settings.model_validate({"server": server, "api": api}))
    assert caplog.records == []
    warn_if_open(Settings.model_validate({"server": {"host": "0.0.0.0"}, "api": {"chat_page": True}}))
    assert "api.key is empty" in caplog.text


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
