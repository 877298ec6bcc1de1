"""Contract tests: the official `openai` package against the running app on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2  # the HTTP client of the openai package
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam

from storage import Database, Message
from tests.app_process import AppProcess
from tests.web.web_support import running_app

API_KEY = "sk-test-key"
MODEL = "builtin:tiny-qwen3"
ADMIN_TOKEN = "console-test-token"
MAX_MESSAGES = 8
# High enough that the module's other tests, all from 127.0.0.1, never meet it.
RATE_PER_MINUTE = 300


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    overrides: dict[str, dict[str, Any]] = {
        "api": {"key": API_KEY, "max_queued_requests": 1},
        "admin": {"token": ADMIN_TOKEN},  # to see what the cache holds
        # One sequence at a time, so the queue test can fill the waiting queue with two requests.
        "engine": {"max_num_seqs": 1},
        "limits": {"max_messages": MAX_MESSAGES, "requests_per_minute": RATE_PER_MINUTE},
        # a paraphrase must be embedded, however busy the machine and however soon the model begins
        "cache": {"lookup_budget_ms": 60_000, "race_model": False},
    }
    with running_app(tmp_path_factory, overrides) as running:
        yield running


@pytest.fixture
def client(app: AppProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{app.base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


def ask(client: OpenAI, *messages: str) -> tuple[str, openai.types.chat.ChatCompletion]:
    """(X-Cache-Status, completion) for a conversation of alternating user/assistant texts."""
    conversation: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": text} if i % 2 == 0 else {"role": "assistant", "content": text}
        for i, text in enumerate(messages)
    ]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=conversation)
    return raw.headers["x-cache-status"], raw.parse()


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


def test_non_streamed_completion(client: OpenAI) -> None:
    status, completion = ask(client, "Name three rivers in Europe.")
    assert status == "miss"
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_completion(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a sunrise over the sea."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished in (["stop"], ["length"])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens > 0


def test_streamed_body_is_openai_sse(app: AppProcess) -> None:
    response = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Count to three."}]},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert all(re.fullmatch(r"data: .+", event) for event in events if event)
    assert events[-2] == "data: [DONE]"
    assert '"usage"' not in response.text  # only with stream_options.include_usage, as OpenAI does
    assert response.headers["x-cache-status"] == "miss"
    app.until_cached("Count to three.", ADMIN_TOKEN)
    repeat = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "count to three"}]},
    )
    assert repeat.headers["x-cache-status"] == "exact"  # known before the first chunk is sent


def test_second_turn_reuses_the_first_turns_tokens(client: OpenAI) -> None:
    question = "Plan a three-day trip to Hangzhou for a family of four."
    _, first = ask(client, question)
    reply = first.choices[0].message.content
    assert reply is not None
    _, second = ask(client, question, reply, "And what should we eat there?")
    assert first.usage is not None and second.usage is not None
    first_details, second_details = first.usage.prompt_tokens_details, second.usage.prompt_tokens_details
    assert first_details is not None and second_details is not None
    cached, cached_before = second_details.cached_tokens, first_details.cached_tokens
    assert cached is not None and cached_before is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # Every full KV block of the first turn (16 tokens each) is reused.
    assert cached >= first.usage.prompt_tokens // 16 * 16
    assert cached > cached_before


def test_repeat_is_exact_and_paraphrase_is_semantic(app: AppProcess, client: OpenAI) -> None:
    status, first = ask(client, "How do I reset my password?")
    assert status == "miss"
    app.until_cached("How do I reset my password?", ADMIN_TOKEN)
    status, again = ask(client, "How do I reset my password?")
    assert status == "exact"
    status, paraphrase = ask(client, "How can I reset my password?")
    assert status == "semantic"
    assert paraphrase.choices[0].message.content == first.choices[0].message.content == again.choices[0].message.content


@pytest.mark.parametrize("api_key", ["", "sk-wrong"])
def test_missing_or_wrong_api_key_is_401(app: AppProcess, api_key: str) -> None:
    with (
        OpenAI(
            base_url=f"{app.base_url}/v1",
            api_key=api_key or "unused",
            max_retries=0,
            default_headers={"Authorization": f"Bearer {api_key}"} if api_key else {"Authorization": ""},
        ) as client,
        pytest.raises(openai.AuthenticationError) as excinfo,
    ):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert excinfo.value.status_code == 401
    assert excinfo.value.code == "invalid_api_key"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "robot", "content": "hi"}], "messages[0].role"),
        ([{"role": "assistant", "content": "hi"}], "messages"),
        ([{"role": "user", "content": "x" * 8001}], "messages[0].content"),
        (
            [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(MAX_MESSAGES + 1)],
            "messages",
        ),
    ],
    ids=["unknown-role", "last-not-user", "message-too-long", "too-many-messages"],
)
def test_invalid_body_is_400(client: OpenAI, messages: list[dict[str, str]], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert excinfo.value.status_code == 400
    assert excinfo.value.param == param
    assert excinfo.value.message


def test_malformed_json_is_400(app: AppProcess) -> None:
    response = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_oversized_body_is_413(app: AppProcess) -> None:
    response = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_100_000}]},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_unknown_model_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as excinfo:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert excinfo.value.code == "model_not_found"


def test_the_rate_limit_is_429_per_client(app: AppProcess) -> None:
    # A client address of its own (any 127.x is loopback), so its bucket is this test's alone; an
    # unknown model keeps each request cheap: the limit is checked first.
    transport = httpx2.HTTPTransport(local_address="127.0.0.9")
    with OpenAI(
        base_url=f"{app.base_url}/v1", api_key=API_KEY, max_retries=0, http_client=httpx2.Client(transport=transport)
    ) as flooder:
        # The bucket refills while the burst runs (5 a second), so a few more than the limit pass.
        refused: openai.RateLimitError | None = None
        sent = 0
        while refused is None and sent < 2 * RATE_PER_MINUTE:
            sent += 1
            try:
                flooder.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "ping"}])
            except openai.NotFoundError:
                continue
            except openai.RateLimitError as exc:
                refused = exc
    assert refused is not None and sent > RATE_PER_MINUTE
    assert refused.code == "rate_limit_exceeded"
    assert int(refused.response.headers["retry-after"]) >= 1


async def test_full_engine_queue_is_429(app: AppProcess) -> None:
    async with AsyncOpenAI(base_url=f"{app.base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        # A long reply holds the only running slot; the next request waits; the one after is refused.
        running = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a very long story."}],
            max_tokens=2000,
            stream=True,
        )
        await anext(aiter(running))
        waiting = asyncio.create_task(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Then a poem."}])
        )
        try:
            await _until_engine(app, "waiting", 1)
            with pytest.raises(openai.RateLimitError) as excinfo:
                await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "And a song."}])
            assert excinfo.value.code == "queue_full"
            assert excinfo.value.response.headers["retry-after"] == "1"
        finally:
            await running.close()
            await waiting


async def _until_engine(app: AppProcess, state: str, count: int) -> None:
    """Until the engine has `count` requests in `state` (running, waiting); at most 10 s."""
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            metrics = (await http.get(f"{app.base_url}/metrics")).text
            if f'clawdbot_engine_requests{{state="{state}"}} {float(count)}' in metrics:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the engine never had {count} request(s) {state}")


async def test_a_client_that_disconnects_from_a_non_streamed_completion_aborts_it(app: AppProcess) -> None:
    question = "Write the longest story you can."
    body = json.dumps(
        {"model": MODEL, "max_tokens": 2000, "user": "leaver", "messages": [{"role": "user", "content": question}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", app.port)) as connection:
        connection.sendall(head.encode() + body)
        await _until_engine(app, "running", 1)
    # 2000 tokens take the demo model over a minute here; the disconnect stops them at once.
    await _until_engine(app, "running", 0)
    database = Database(f"sqlite:///{app.workdir / 'bot.db'}")
    try:
        with database.session() as session:
            assert session.query(Message).filter(Message.text == question).count() == 0
    finally:
        database.close()


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_servers_cap_is_400(client: OpenAI, field: str) -> None:
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], user="greedy", extra_body={field: 2049}
        )
    assert excinfo.value.param == field
    assert "2048" in excinfo.value.message


# Lone surrogates, which JSON carries as escapes (json.dumps writes "\\ud800"): every client string
# is checked before anything else.
_HI = {"role": "user", "content": "hi"}
_TEXT_THAT_IS_NOT_UNICODE: dict[str, dict[str, Any]] = {
    "messages[2].content": {
        "messages": [_HI, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "a \ud800 b"}]
    },
    "messages[0].content (streamed)": {"stream": True, "messages": [{"role": "user", "content": "\udfff"}]},
    "messages[0].content[0].text": {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
    "messages[0].content (system)": {"messages": [{"role": "system", "content": "\ud800"}, _HI]},
    "model": {"model": "\ud800", "messages": [_HI]},
    "stop": {"stop": "\ud800", "messages": [_HI]},
    "stop[1]": {"stop": ["a", "\ud800"], "messages": [_HI]},
    "user": {"user": "\ud800", "messages": [_HI]},
}


@pytest.mark.parametrize(("param", "body"), _TEXT_THAT_IS_NOT_UNICODE.items(), ids=_TEXT_THAT_IS_NOT_UNICODE.keys())
def test_text_that_is_not_unicode_is_400_naming_the_field(app: AppProcess, param: str, body: dict[str, Any]) -> None:
    response = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        content=json.dumps({"model": MODEL} | body).encode(),
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param.split(" ")[0]
    assert "not valid Unicode" in error["message"]


def test_metrics_expose_requests_cache_levels_and_histograms(app: AppProcess, client: OpenAI) -> None:
    ask(client, "What is the tallest mountain?")
    app.until_cached("What is the tallest mountain?", ADMIN_TOKEN)
    ask(client, "What is the tallest mountain?")
    metrics = httpx.get(f"{app.base_url}/metrics").text
    assert 'clawdbot_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in metrics
    assert re.search(r'clawdbot_turns_total\{cache_level="exact"\} [1-9]', metrics)
    assert 'clawdbot_ttft_seconds_bucket{cache_level="exact",channel="api"' in metrics
    assert 'clawdbot_turn_tokens_count{channel="api",kind="completion"}' in metrics
    assert "clawdbot_kv_pool_usage_ratio" in metrics
    assert 'clawdbot_engine_draft_tokens_total{outcome="accepted"}' in metrics
