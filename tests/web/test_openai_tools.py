"""Function calling through the official `openai` package, against the running app on loopback.

The demo model's random weights never mean a call, so this app serves a scripted model: a
real-vocabulary Qwen3 whose greedy replies are known. Started with a named call's opening it
closes the call (no arguments); after the generation prompt it answers in words. Every call
below is one the model wrote, parsed out of its reply."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from transformers import PreTrainedTokenizerBase

from storage import Database, Message, MessageRepository
from tests.app_process import AppProcess
from tests.models import IM_END, chained_model
from tests.web.web_support import running_app

API_KEY = "sk-test-key"
PING_OPENING = '<tool_call>\n{"name": "ping", "arguments": '
ANSWER = "It is sunny in Paris."
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "Is the server up?",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
PING: Any = {"type": "function", "function": {"name": "ping"}}
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Is the server up? And the weather?"}]


def scripted_checkpoint(path: Path, tokenizer: PreTrainedTokenizerBase) -> Path:
    """A model that, after the named call's prefill, writes `{}}` and closes the call; after a
    plain generation prompt, answers ANSWER."""
    generation_prompt_end = tokenizer.encode("</think>\n\n")[-1]
    chains = [
        [tokenizer.encode(PING_OPENING)[-1], *tokenizer.encode("{}}\n</tool_call>"), IM_END],
        [generation_prompt_end, *tokenizer.encode(ANSWER), IM_END],
    ]
    model = chained_model(chains)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerBase) -> Iterator[AppProcess]:
    checkpoint = scripted_checkpoint(tmp_path_factory.mktemp("scripted"), tokenizer)
    overrides: dict[str, dict[str, Any]] = {"api": {"key": API_KEY}, "engine": {"model": str(checkpoint)}}
    with running_app(tmp_path_factory, overrides) as running:
        yield running


@pytest.fixture
def client(app: AppProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{app.base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


def model_of(client: OpenAI) -> str:
    return client.models.list().data[0].id


def stored_sessions(app: AppProcess) -> dict[int, list[str]]:
    """The text of every stored message, by session."""
    database = Database(f"sqlite:///{app.workdir / 'bot.db'}")
    try:
        with database.session() as session:
            ids = sorted(row.session_id for row in session.query(Message.session_id).distinct())
            messages = MessageRepository(session)
            return {session_id: [m.text for m in messages.of_session(session_id)] for session_id in ids}
    finally:
        database.close()


def test_a_call_then_its_result_then_the_answer(client: OpenAI, app: AppProcess) -> None:
    model = model_of(client)
    first = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice=PING)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert (call.function.name, json.loads(call.function.arguments)) == ("ping", {})

    conversation: list[ChatCompletionMessageParam] = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "pong"},
    ]
    second = client.chat.completions.create(model=model, messages=conversation, tools=TOOLS)
    assert second.choices[0].message.content == ANSWER and second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    # The same session: the call is stored as the model wrote it, so the prefix cache hits.
    assert first.usage is not None and second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= first.usage.prompt_tokens // 16 * 16 > 0
    sessions = stored_sessions(app)
    [texts] = [texts for texts in sessions.values() if texts[0] == QUESTION[0]["content"]]
    assert texts == [
        QUESTION[0]["content"],
        f"{PING_OPENING}{{}}}}\n</tool_call>",
        "<tool_response>\npong\n</tool_response>",
        ANSWER,
    ]


def test_streamed_calls_are_assembled_by_the_client(client: OpenAI) -> None:
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Ping the server, streamed."}]
    with client.chat.completions.stream(
        model=model_of(client), messages=question, tools=TOOLS, tool_choice=PING
    ) as stream:
        for _ in stream:
            continue
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls or []
    assert (call.function.name, call.function.arguments, call.id[:5]) == ("ping", "{}", "call_")


def test_streamed_chunks_are_openai_deltas(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model_of(client),
            messages=[{"role": "user", "content": "Ping it, raw chunks."}],
            tools=TOOLS,
            tool_choice=PING,
            stream=True,
        )
    )
    deltas = [chunk.choices[0].delta for chunk in chunks]
    [called] = [delta.tool_calls for delta in deltas if delta.tool_calls]
    assert [(c.index, c.type, c.function and (c.function.name, c.function.arguments)) for c in called] == [
        (0, "function", ("ping", "{}"))
    ]
    assert "".join(delta.content or "" for delta in deltas) == ""
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_with_tools_on_offer_a_reply_without_calls_is_content(client: OpenAI, stream: bool) -> None:
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"Weather? ({stream})"}]
    model = model_of(client)
    if not stream:
        choice = client.chat.completions.create(model=model, messages=question, tools=TOOLS).choices[0]
        assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (ANSWER, None, "stop")
        return
    chunks = list(client.chat.completions.create(model=model, messages=question, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_requests_with_tools_never_use_the_response_cache(client: OpenAI) -> None:
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Is it sunny in Paris today?"}]
    model = model_of(client)
    statuses = [
        client.chat.completions.with_raw_response.create(model=model, messages=question, tools=TOOLS).headers[
            "x-cache-status"
        ]
        for _ in range(2)
    ]
    assert statuses == ["miss", "miss"]


def _bad(body: dict[str, Any]) -> dict[str, Any]:
    return {"messages": QUESTION, "tools": TOOLS} | body


_CALLED: Any = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}],
}
# param -> body (merged into a valid request with tools)
_INVALID: dict[str, dict[str, Any]] = {
    "tools[0].function.name": _bad({"tools": [{"type": "function", "function": {"name": "get weather"}}]}),
    "tools": _bad({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}),
    "tools[0].type": _bad({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
    "tools[0].function.parameters": _bad(
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}
    ),
    "tools[1].function.parameters (type)": _bad(
        {"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}
    ),
    "tools[1].function.name (twice)": _bad({"tools": [TOOLS[1], TOOLS[1]]}),
    "tools[0].function.description": _bad(
        {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}
    ),
    "tools[0].function.parameters (surrogate)": _bad(
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"\ud800": {}}}}]}
    ),
    "tool_choice.function.name": _bad({"tool_choice": {"type": "function", "function": {"name": "nowhere"}}}),
    "tool_choice": _bad({"tool_choice": "sometimes"}),
    "tool_choice (no tools)": {"messages": QUESTION, "tool_choice": "required"},
    "messages[2].tool_call_id": _bad({"messages": [*QUESTION, _CALLED, {"role": "tool", "content": "pong"}]}),
    "messages (unknown call)": _bad(
        {"messages": [*QUESTION, _CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "pong"}]}
    ),
    "messages (unanswered)": _bad({"messages": [*QUESTION, _CALLED, *QUESTION]}),
    "messages[0].content": _bad({"messages": [{"role": "user", "content": None}]}),
    "messages[0].tool_calls": _bad({"messages": [{**QUESTION[0], "tool_calls": _CALLED["tool_calls"]}]}),
    "messages[1].tool_calls[0].function.arguments": _bad(
        {
            "messages": [
                *QUESTION,
                {
                    **_CALLED,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "ping", "arguments": "\udfff"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "pong"},
            ]
        }
    ),
}


@pytest.mark.parametrize(("param", "body"), _INVALID.items(), ids=_INVALID.keys())
def test_bad_tools_and_tool_messages_are_400_naming_the_field(
    app: AppProcess, param: str, body: dict[str, Any]
) -> None:
    model = httpx.get(f"{app.base_url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"][0]
    response = httpx.post(
        f"{app.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        content=json.dumps({"model": model["id"]} | body).encode(),
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param.split(" ")[0]


@pytest.mark.downloads_model
def test_smollm2s_template_has_no_tool_support_so_tools_are_400(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
) -> None:
    """SmolLM2-135M-Instruct's template renders neither a tool list, nor calls, nor results."""
    overrides: dict[str, dict[str, Any]] = {"engine": {"model": str(smollm2_dir)}}
    with running_app(tmp_path_factory, overrides) as app, OpenAI(base_url=f"{app.base_url}/v1", api_key="-") as client:
        model = model_of(client)
        for tool_choice in ("auto", "required", PING):
            with pytest.raises(openai.BadRequestError) as excinfo:
                client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice)
            assert excinfo.value.param == "tools" and excinfo.value.code == "tools_unsupported"
            assert "this model's chat template has no tool support" in excinfo.value.message
        with pytest.raises(openai.BadRequestError) as excinfo:
            client.chat.completions.create(
                model=model,
                messages=[*QUESTION, _CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "pong"}],
            )
        assert excinfo.value.param == "messages" and excinfo.value.code == "tools_unsupported"
        # Offered none, tools change nothing: the model answers as without them.
        answer = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice="none")
        assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
