"""`/v1/completions` and `/tokenize`, the engine served to other bot replicas: the official `openai`
package and raw HTTP against the running app, in vLLM's shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.app_process import AppProcess
from tests.web.web_support import running_app

API_KEY = "sk-engine"
MODEL = "builtin:tiny-qwen3"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    # The per-client rate limit does not apply here: 2 a minute would stop this module otherwise.
    overrides: dict[str, dict[str, Any]] = {"api": {"key": API_KEY}, "limits": {"requests_per_minute": 2}}
    with running_app(tmp_path_factory, overrides) as running:
        yield running


@pytest.fixture
def client(app: AppProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{app.base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


def prompt_ids(app: AppProcess, text: str) -> list[int]:
    response = httpx.post(
        f"{app.base_url}/tokenize", json={"prompt": text, "add_special_tokens": False}, headers=HEADERS
    )
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 16384
    tokens: list[int] = body["tokens"]
    return tokens


def events(app: AppProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE stream's JSON events; asserts it ends with [DONE]."""
    with httpx.stream("POST", f"{app.base_url}/v1/completions", json=body, headers=HEADERS) as response:
        assert response.status_code == 200, response.read()
        data = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_models_report_the_max_model_len_a_remote_backend_reads(client: OpenAI) -> None:
    [model] = client.models.list().data
    assert model.id == MODEL and model.model_extra == {"max_model_len": 16384}


def test_a_token_id_prompt_streams_token_ids_and_text_then_usage_with_cached_tokens(app: AppProcess) -> None:
    prompt = prompt_ids(app, "A prompt long enough to fill a few blocks of the KV pool, " * 4)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    first_run = events(app, body)
    *chunks, usage = first_run
    assert chunks[0]["object"] == "text_completion" and chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in chunk["choices"][0] for chunk in chunks[1:])
    assert sum(len(chunk["choices"][0]["token_ids"]) for chunk in chunks) == 12
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-1] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["prompt_tokens"] == len(prompt)
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    *again, usage = events(app, body)  # the same prompt: its full blocks come from the prefix cache
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) // 16 * 16
    ids = [[t for c in run[:-1] for t in c["choices"][0]["token_ids"]] for run in (first_run, [*again, usage])]
    assert ids[0] == ids[1]  # greedy


def test_a_whole_completion_from_text_with_the_openai_package(client: OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.choices[0].model_extra == {}  # token ids only when asked for
    with_ids = client.completions.create(
        model=MODEL,
        prompt=[9707],
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    extra = with_ids.choices[0].model_extra or {}
    assert len(extra["token_ids"]) == 5 and extra["prompt_token_ids"] == [9707]


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"model": "gpt-4"}, 404, "does not exist"),
        ({"prompt": [10**9]}, 400, "outside the vocabulary"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": "\ud800"}, 400, "lone surrogate"),
        ({"max_tokens": 100_000}, 400, "at most 2048 tokens"),
        ({"temperature": -1}, 400, "temperature"),
        ({"top_k": -2}, 400, "top_k"),
        ({"min_top_k": 5, "max_top_k": 2, "dynamic_top_k": True}, 400, "max_top_k"),
        ({"n": 2}, 400, "n"),
        ({"echo": True}, 400, "echo"),
    ],
)
def test_bad_requests_are_400_or_404_naming_the_problem(
    app: AppProcess, change: dict[str, Any], status: int, message: str
) -> None:
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4} | change
    # json.dumps escapes a lone surrogate as "\ud800", as a careless client would send it
    headers = HEADERS | {"Content-Type": "application/json"}
    response = httpx.post(f"{app.base_url}/v1/completions", content=json.dumps(body), headers=headers)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_the_engine_endpoints_need_the_api_key(app: AppProcess) -> None:
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": [1]}), ("/tokenize", {"prompt": "hi"})):
        response = httpx.post(f"{app.base_url}{path}", json=body)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
