"""Property-based fuzzing of every door a client can knock on: the OpenAI API (schemathesis, from
the app's own OpenAPI schema, plus hand-written strategies for what the schema cannot express:
lone surrogates, NaN, wrong types), the Feishu webhook (signed and unsigned, encrypted and not),
the console's cookie and the chat page. The property: no answer is a 5xx, a refused webhook
event is indistinguishable from any other refusal, and the app is healthy after each run.

The examples are derandomized, so a run is repeatable; `--hypothesis-seed` explores further.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.case import Case

from settings import Settings
from tests.bot.bot_support import AppServer, app_settings
from tests.fakes.events import encrypt, message_event, signature_headers, url_verification
from tests.fakes.feishu import FakeFeishu
from tests.support import free_port
from web.admin import auth

API_KEY = "fuzz-api-key"
ADMIN_TOKEN = "fuzz-admin-token"
ENCRYPT_KEY = "fuzz-encrypt-key"
VERIFICATION_TOKEN = "fuzz-verification-token"
AUTHORIZED = {"Authorization": f"Bearer {API_KEY}"}

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Every code point a JSON string can carry, lone surrogates included (json.dumps escapes them).
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
# A number past Python's 4,300-digit int limit cannot be built in Python, so `_json` writes it.
HUGE = "\x00huge\x00"
HUGE_NUMBER = "9" * 5000
odd_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(HUGE),
)
json_scalars = st.one_of(st.none(), st.booleans(), odd_numbers, any_text)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=8
)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeFeishu]:
    server = FakeFeishu(free_port()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    base = app_settings(
        tmp_path_factory.mktemp("fuzz"),
        fake,
        mode="webhook",
        encrypt_key=ENCRYPT_KEY,
        verification_token=VERIFICATION_TOKEN,
    )
    config = base.model_dump()
    config["admin"]["token"] = ADMIN_TOKEN
    config["api"].update(key=API_KEY, chat_page=True, docs=True)
    config["limits"]["requests_per_minute"] = 0
    config["generation"].update(temperature=0, max_tokens=4, max_reply_tokens=16)
    server = AppServer(Settings.model_validate(config)).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def healthy_after(app: AppServer) -> Iterator[None]:
    yield
    assert httpx.get(f"{app.base_url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{app.base_url}/readyz", timeout=10).status_code == 200
    answer = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers=AUTHORIZED,
        json={"model": _model(app), "messages": [{"role": "user", "content": "Still there?"}]},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


def _model(app: AppServer) -> str:
    model: str = httpx.get(f"{app.base_url}/v1/models", headers=AUTHORIZED, timeout=10).json()["data"][0]["id"]
    return model


def _admin_cookie() -> dict[str, str]:
    return {auth.COOKIE: auth.issue(ADMIN_TOKEN, 3600)}


def _json(value: Any) -> bytes:
    """JSON text, NaN and Infinity spelled as JavaScript does (a 400, not a crash), HUGE as 5,000 digits."""
    return json.dumps(value).replace(json.dumps(HUGE), HUGE_NUMBER).encode()


def _raw(headers: dict[str, str]) -> dict[bytes, bytes]:
    """Headers as a client may send them: any bytes but the three HTTP's framing forbids."""
    framing = {ord("\r"): None, ord("\n"): None, 0: None}
    return {
        name.encode(): value.translate(framing).encode("utf-8", "backslashreplace") for name, value in headers.items()
    }


def _no_server_error(response: httpx.Response) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"


# --- every operation of the app's own OpenAPI schema -------------------------------------------


@pytest.fixture(scope="module")
def api_schema(app: AppServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_dict(app.app.openapi())


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@FUZZ
def test_no_operation_of_the_schema_answers_5xx(case: Case, app: AppServer) -> None:
    response = case.call(base_url=app.base_url, headers=AUTHORIZED, cookies=_admin_cookie(), timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path}: {response.status_code}: {response.text[:500]}"


# --- the OpenAI API, with what the schema cannot say ---------------------------------------------

roles = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), any_text)
contents = st.one_of(
    any_text,
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": any_text}), max_size=2),
    json_values,
)
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": contents}), min_size=0, max_size=3)
completion_bodies = st.fixed_dictionaries(
    {"messages": messages},
    optional={
        "model": any_text,
        "stream": st.one_of(st.booleans(), json_scalars),
        "max_tokens": odd_numbers,
        "max_completion_tokens": odd_numbers,
        "temperature": odd_numbers,
        "top_p": odd_numbers,
        "seed": odd_numbers,
        "n": odd_numbers,
        "stop": st.one_of(any_text, st.lists(any_text, max_size=5), json_scalars),
        "user": st.one_of(any_text, json_scalars),
        "stream_options": json_values,
    },
)


@FUZZ
@given(body=completion_bodies, real_model=st.booleans())
def test_chat_completions_never_answer_5xx(app: AppServer, body: dict[str, Any], real_model: bool) -> None:
    if real_model:
        body["model"] = _model(app)
    with httpx.stream(
        "POST", f"{app.base_url}/v1/chat/completions", content=_json(body), headers=AUTHORIZED, timeout=60
    ) as response:
        text = response.read().decode("utf-8", errors="replace")
    _no_server_error(response)
    if response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream"):
        assert text.rstrip().endswith("data: [DONE]") or '"error"' in text, text[-300:]


# --- the Feishu webhook ------------------------------------------------------------------------

timestamps = st.one_of(
    st.integers(min_value=0, max_value=2**40).map(str),
    st.text(string.digits + "²³¹٣۳०", min_size=1, max_size=12),
    st.just("9" * 5000),
    any_text,
)
events = st.one_of(
    st.builds(lambda text: message_event(chat_id="oc_fuzz", text=text, token=VERIFICATION_TOKEN), any_text),
    st.builds(lambda challenge: url_verification(VERIFICATION_TOKEN, challenge), any_text),
    st.dictionaries(any_text, json_values, max_size=4),
)
bodies = st.one_of(
    st.builds(lambda event: encrypt(event, ENCRYPT_KEY), events),
    st.builds(_json, events),
    st.builds(lambda sealed: json.dumps({"encrypt": sealed}).encode(), any_text),
    st.binary(max_size=200),
)


@FUZZ
@given(body=bodies, signed=st.booleans(), timestamp=st.none() | timestamps)
def test_webhook_never_answers_5xx_and_refusals_look_alike(
    app: AppServer, body: bytes, signed: bool, timestamp: str | None
) -> None:
    headers = signature_headers(body, ENCRYPT_KEY) if signed else {"Content-Type": "application/json"}
    if timestamp is not None:
        headers["X-Lark-Request-Timestamp"] = timestamp
    response = httpx.post(f"{app.base_url}/feishu/events", content=body, headers=_raw(headers), timeout=30)
    _no_server_error(response)
    if response.status_code != 200:
        assert (response.status_code, response.content) == _refusal(app)


def _refusal(app: AppServer) -> tuple[int, bytes]:
    """What the webhook answers a forged signature: every refusal must read the same."""
    body = encrypt(url_verification(VERIFICATION_TOKEN), ENCRYPT_KEY)
    headers = {**signature_headers(body, ENCRYPT_KEY), "X-Lark-Signature": "0" * 64}
    response = httpx.post(f"{app.base_url}/feishu/events", content=body, headers=headers, timeout=30)
    return response.status_code, response.content


# --- the console's cookie and the chat page ----------------------------------------------------

cookie_values = st.one_of(
    st.text(string.printable.strip(), max_size=60),
    st.builds(lambda digits, sig: f"{digits}.{sig}", st.text(string.digits + "²³¹٣", max_size=20), any_text),
    st.just("9" * 5000 + ".x"),
)


@FUZZ
@given(cookie=cookie_values)
def test_a_forged_console_cookie_is_refused_never_crashes(app: AppServer, cookie: str) -> None:
    response = httpx.get(
        f"{app.base_url}/admin/api/stats", headers=_raw({"Cookie": f"{auth.COOKIE}={cookie}"}), timeout=30
    )
    _no_server_error(response)
    assert response.status_code in (400, 401, 429), response.text


@FUZZ
@given(body=st.one_of(json_values, st.fixed_dictionaries({"text": any_text})), cookie=cookie_values)
def test_the_chat_page_never_answers_5xx(app: AppServer, body: Any, cookie: str) -> None:
    for authorized in ({}, AUTHORIZED):
        response = httpx.post(
            f"{app.base_url}/chat/api/messages",
            content=_json(body),
            headers=_raw({"Cookie": f"clawdbot_chat={cookie}", "Content-Type": "application/json", **authorized}),
            timeout=60,
        )
        _no_server_error(response)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/api/sessions?offset=100000000000000000000"),
        ("GET", "/admin/api/sessions/100000000000000000000"),
        ("DELETE", "/admin/api/cache/entries/100000000000000000000"),
    ],
)
def test_row_numbers_past_what_the_database_holds_are_the_clients_mistake(
    app: AppServer, method: str, path: str
) -> None:
    """Found by the schema fuzzing: SQLite cannot bind an integer past 2**63 - 1."""
    response = httpx.request(method, f"{app.base_url}{path}", cookies=_admin_cookie(), timeout=30)
    assert response.status_code == 422, response.text
