"""Logins, rate limits and /metrics labels against the running app. Each test talks from a
loopback address of its own (127.0.0.x), so their per-client limits never meet."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.app_process import AppProcess
from tests.web.web_support import running_app
from web.admin import auth

API_KEY = "sk-chat-and-api"
ADMIN_TOKEN = "console-token"
RATE_PER_MINUTE = 10


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    overrides: dict[str, dict[str, Any]] = {
        "api": {"key": API_KEY},
        "admin": {"token": ADMIN_TOKEN},
        "limits": {"requests_per_minute": RATE_PER_MINUTE},
    }
    with running_app(tmp_path_factory, overrides) as running:
        yield running


def client_from(app: AppProcess, address: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=app.base_url, transport=transport, timeout=60, follow_redirects=False)


def test_the_api_docs_are_off_by_default(app: AppProcess) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{app.base_url}{path}").status_code == 404, path


@pytest.mark.parametrize("expires", [b"9" * 5000, b"\xb2", b"\xd9\xa1\xd9\xa7"])
def test_a_console_cookie_with_a_malformed_expiry_is_not_logged_in(app: AppProcess, expires: bytes) -> None:
    # Sent as raw header bytes: a browser may send any, and the server reads them as latin-1.
    cookie = f"{auth.COOKIE}=".encode() + expires + b".0123abcd"
    with httpx.Client(base_url=app.base_url) as client:
        console = client.get("/admin", headers={b"Cookie": cookie})
        assert console.status_code == 303
        assert console.headers["location"] == "/admin/login"
        stats = client.get("/admin/api/stats", headers={b"Cookie": cookie})
        assert stats.status_code == 401


def test_wrong_console_logins_back_off_per_client(app: AppProcess) -> None:
    with client_from(app, "127.0.0.2") as client:
        answers = [client.post("/admin/login", data={"token": f"guess-{i}"}) for i in range(50)]
        statuses = [answer.status_code for answer in answers]
        assert statuses[:5] == [401] * 5
        # Every failure past the fifth doubles the wait (1 s, 2 s, ...): within 50 fast tries only a
        # few waits can run out, and every refusal says how long to wait.
        assert statuses.count(401) <= 12
        refused = [answer for answer in answers if answer.status_code == 429]
        assert len(refused) == 50 - statuses.count(401)
        assert all(int(answer.headers["retry-after"]) >= 1 for answer in refused)
        assert "Too many failed logins" in refused[-1].text
    with client_from(app, "127.0.0.6") as other:  # another client is not held back
        login = other.post("/admin/login", data={"token": ADMIN_TOKEN})
        assert login.status_code == 303
        assert other.get("/admin/api/stats").status_code == 200  # the client keeps the login cookie


def _log_in_to_the_chat_page(client: httpx.Client) -> None:
    login = client.post("/login", data={"token": API_KEY})
    assert login.status_code == 303
    client.cookies.update(login.cookies)
    page = client.get("/")
    assert page.status_code == 200
    assert "chat.js" in page.text
    # the page names the model that answers, and warns that the demo model's text is meaningless
    assert re.search(r'id="model" class="badge model demo"[^>]*>builtin:tiny-qwen3<', page.text)
    assert 'id="demo-warning"' in page.text
    client.cookies.update(page.cookies)


def test_the_chat_page_needs_the_api_key_and_a_conversation_the_server_issued(app: AppProcess) -> None:
    with client_from(app, "127.0.0.5") as client:
        page = client.get("/")
        assert page.status_code == 200
        assert 'action="/login"' in page.text
        assert "clawdbot_chat" not in page.cookies
        invented = {"Cookie": "clawdbot_chat=invented-by-the-client"}
        refused = client.post("/chat/api/messages", json={"text": "hi"}, headers=invented)
        assert refused.status_code == 401
        assert "/login" in refused.json()["error"]["message"]
        wrong = client.post("/login", data={"token": "sk-wrong"})
        assert wrong.status_code == 401
        assert "Wrong API key." in wrong.text

        _log_in_to_the_chat_page(client)
        login_cookie = client.cookies["clawdbot_chat_login"]
        issued = client.cookies["clawdbot_chat"]
        for forged in ("invented-by-the-client", issued.rpartition(".")[0] + "x." + issued.rpartition(".")[2]):
            client.cookies.set("clawdbot_chat", forged)
            answer = client.post("/chat/api/messages", json={"text": "hi"})
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "no_session"
        client.cookies.set("clawdbot_chat", issued)
        with client.stream("POST", "/chat/api/messages", json={"text": "Say hello."}) as stream:
            assert stream.status_code == 200
            assert "event: done" in stream.read().decode()
        history = client.get("/chat/api/history").json()["messages"]
        assert [line["role"] for line in history] == ["user", "assistant"]
        # The login cookie is HttpOnly and bound to the key: it is not the key, nor the admin login.
        assert API_KEY not in login_cookie
        assert httpx.get(f"{app.base_url}/admin/api/stats", cookies={auth.COOKIE: login_cookie}).status_code == 401


def test_the_rate_limit_is_per_client_whatever_user_it_names(app: AppProcess) -> None:
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with client_from(app, "127.0.0.3") as client:
        statuses = [
            client.post("/v1/chat/completions", json={**body, "user": f"user-{i}"}, headers=headers).status_code
            for i in range(3 * RATE_PER_MINUTE)
        ]
        first_refusal = statuses.index(429)
        # A full bucket, plus whatever refilled (one every 6 s) while the requests ran.
        assert RATE_PER_MINUTE <= first_refusal < RATE_PER_MINUTE + 5
        assert set(statuses[:first_refusal]) == {404}
        # The chat page shares the client's bucket: a fresh conversation cookie does not help.
        _log_in_to_the_chat_page(client)
        answer = client.post("/chat/api/messages", json={"text": "hi"})
        assert answer.status_code == 429
        assert int(answer.headers["retry-after"]) >= 1
    with client_from(app, "127.0.0.4") as other:
        assert other.post("/v1/chat/completions", json=body, headers=headers).status_code == 404


def test_metrics_labels_stay_bounded_under_invented_methods(app: AppProcess) -> None:
    rng = random.Random(13)
    with httpx.Client(base_url=app.base_url) as client:
        for _ in range(300):
            method = "".join(rng.choices(string.ascii_uppercase, k=8))
            assert client.request(method, "/healthz").status_code == 405
        exposition = client.get("/metrics").text
    series = [line for line in exposition.splitlines() if line.startswith("clawdbot_http_requests_total{")]
    healthz = [line for line in series if 'route="/healthz"' in line]
    assert len(healthz) <= 2, healthz  # GET 200 (the start-up probe), other 405
    assert any('method="other"' in line and 'status="405"' in line and line.endswith(" 300.0") for line in healthz)


def test_static_files_are_counted_under_their_mount(app: AppProcess) -> None:
    with httpx.Client(base_url=app.base_url) as client:
        assert client.get("/static/style.css").status_code == 200
        assert client.get("/static/no-such-file.css").status_code == 404
        exposition = client.get("/metrics").text
    assert 'clawdbot_http_requests_total{method="GET",route="/static",status="200"}' in exposition
    assert 'clawdbot_http_requests_total{method="GET",route="/static",status="404"}' in exposition
