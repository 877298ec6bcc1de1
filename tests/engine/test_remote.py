"""The remote backend against a second app process serving `/v1/completions`: what the bot does
with `engine.backend: remote`, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.responses import JSONResponse
from transformers import PreTrainedTokenizerBase

from cache.embeddings import Embedder
from chat import Conversation
from engine import LLMEngine, SamplingParams, StreamDelta
from engine.config import RemoteConfig
from engine.remote import EngineUnavailable, RemoteEngine, RemoteEngineError
from storage import Database, MessageRepository
from tests.app_process import AppProcess
from tests.chat.chat_support import ManagerFactory, ask, session_of
from tests.fakes.model_server import FakeModelServer, chunk, usage
from tests.support import SHARED_DATA_DIR, free_port
from tests.web.web_support import running_app

MODEL = "builtin:tiny-qwen3"
API_KEY = "engine-box-key"
SERVER_CONFIG: dict[str, dict[str, Any]] = {"api": {"key": API_KEY}, "cache": {"enabled": False}}
ALICE = Conversation(channel="web", chat_id="alice")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    with running_app(tmp_path_factory, SERVER_CONFIG) as running:
        yield running


@pytest.fixture(scope="module")
def local_engine() -> Iterator[LLMEngine]:
    with LLMEngine.from_pretrained(MODEL, data_dir=str(SHARED_DATA_DIR)) as llm:
        yield llm


def remote_config(url: str, **overrides: object) -> RemoteConfig:
    options: dict[str, object] = {"tokenizer": MODEL, "data_dir": str(SHARED_DATA_DIR), "api_key": API_KEY}
    return RemoteConfig(url=url, **(options | overrides))  # type: ignore[arg-type]


@pytest.fixture
async def remote(server: AppProcess) -> AsyncIterator[RemoteEngine]:
    backend = RemoteEngine(remote_config(server.base_url)).start()
    yield backend
    await backend.close(1.0)


def stored_messages(db: Database, session_id: int) -> list[tuple[str, str]]:
    with db.session() as session:
        return [(m.role, m.text) for m in MessageRepository(session).of_session(session_id)]


async def collect(backend: RemoteEngine, prompt: list[int], params: SamplingParams) -> list[StreamDelta]:
    return [delta async for delta in backend.stream(prompt, params)]


def server_running_requests(server: AppProcess) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    line = next(line for line in text.splitlines() if line.startswith('clawdbot_engine_requests{state="running"}'))
    return float(line.split()[-1])


async def test_greedy_output_over_http_equals_the_local_engine_token_for_token(
    remote: RemoteEngine, local_engine: LLMEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode("The paged KV pool keeps each conversation's prefix")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    [local] = local_engine.generate([prompt], params)
    deltas = await collect(remote, prompt, params)
    assert [t for delta in deltas for t in delta.token_ids] == local.token_ids
    assert "".join(delta.text for delta in deltas) == local.text
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert deltas[-1].num_prompt_tokens == len(prompt)
    assert len(deltas) > 2  # streamed, not sent whole at the end


async def test_a_conversation_through_the_chat_manager_hits_the_servers_prefix_cache(
    remote: RemoteEngine, embedder: Embedder, db: Database
) -> None:
    manager = await ManagerFactory(remote, embedder, db)()
    first = await ask(manager, ALICE, "What does a paged KV pool do?")
    after_first = session_of(manager, ALICE).history.token_ids.tolist()
    second = await ask(manager, ALICE, "And why does prefix caching help a long chat?")
    third = await ask(manager, ALICE, "Say it once more, shorter.")
    await manager.close()

    assert first.cached_tokens == 0
    # The second prompt starts with the whole first turn, so every full block of it is cached.
    assert second.prompt_tokens > len(after_first)
    assert second.cached_tokens >= (len(after_first) // 16 - 1) * 16 > 0
    assert third.cached_tokens > second.cached_tokens
    assert [role for role, _ in stored_messages(db, first.session_id)] == ["user", "assistant"] * 3
    figures = remote.figures()
    assert figures.kv_cache.prefix_hit_tokens >= second.cached_tokens + third.cached_tokens
    assert figures.device == f"remote {remote.url}" and figures.activity.finish_reasons


async def test_closing_the_stream_aborts_the_request_on_the_server(remote: RemoteEngine, server: AppProcess) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
    stream = remote.stream(remote.tokenizer.encode("Count to a thousand:"), params)
    async with aclosing(stream):
        for _ in range(3):
            await anext(stream)
        assert server_running_requests(server) == 1
    for _ in range(100):
        if server_running_requests(server) == 0:
            break
        await asyncio.sleep(0.05)
    assert server_running_requests(server) == 0
    assert remote.figures().requests.running == 0


async def test_a_prompt_the_server_refuses_is_a_value_error(remote: RemoteEngine) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        remote.stream([len(remote.tokenizer) + 5])  # refused here, before any request
    too_long = SamplingParams(max_tokens=5000)  # above the server's generation.max_reply_tokens (2048)
    with pytest.raises(ValueError, match="at most 2048 tokens"):
        await collect(remote, [1, 2, 3], too_long)
    assert remote.is_running()  # a refused request says nothing about the server's health


def test_start_up_checks_fail_with_one_line_naming_the_setting(server: AppProcess, smollm2_dir: Path) -> None:
    with pytest.raises(RemoteEngineError, match=r"engine.tokenizer .* does not match the tokenizer of builtin"):
        RemoteEngine(remote_config(server.base_url, tokenizer=str(smollm2_dir)))
    with pytest.raises(RemoteEngineError, match=r"engine.remote_model: the server .* serves builtin:tiny-qwen3, not"):
        RemoteEngine(remote_config(server.base_url, model="Qwen/Qwen3-8B"))
    with pytest.raises(RemoteEngineError, match="401"):
        RemoteEngine(remote_config(server.base_url, api_key="wrong"))
    with pytest.raises(RemoteEngineError, match="cannot reach the model server"):
        RemoteEngine(remote_config(f"http://127.0.0.1:{free_port()}"))


async def test_a_server_killed_mid_stream_fails_the_turn_stores_nothing_and_is_retried_with_backoff(
    tmp_path: Path, embedder: Embedder, db: Database
) -> None:
    port = free_port()
    (tmp_path / "killed").mkdir()
    (tmp_path / "restarted").mkdir()
    server = AppProcess(tmp_path / "killed", port, SERVER_CONFIG).start()
    remote = RemoteEngine(remote_config(server.base_url)).start()
    manager = await ManagerFactory(remote, embedder, db)()
    try:
        done = await ask(manager, ALICE, "Hello there")
        stored = stored_messages(db, done.session_id)

        # A long reply, cut by the server's death after its first pieces.
        turn = manager.turn(ALICE, "Tell me a long story", params=SamplingParams(max_tokens=2000, ignore_eos=True))
        pieces = aiter(turn)
        await anext(pieces)
        server.stop(signal.SIGKILL)
        shown: list[str] = []
        with pytest.raises(RuntimeError, match="the engine failed"):
            async for piece in pieces:
                shown.append(piece)
        assert len(remote.tokenizer.encode("".join(shown))) < 2000  # cut, not finished
        assert stored_messages(db, done.session_id) == stored  # nothing half-written

        # The server is gone: a turn fails at once, and the ones after it wait out a backoff.
        with pytest.raises(EngineUnavailable, match="unreachable"):
            await ask(manager, ALICE, "Are you there?")
        assert not remote.is_running()
        with pytest.raises(EngineUnavailable, match="trying again in"):
            await ask(manager, ALICE, "Are you there now?")
        assert stored_messages(db, done.session_id) == stored

        # Back on the same address: the first turn after the backoff is served, the history whole.
        server = AppProcess(tmp_path / "restarted", port, SERVER_CONFIG).start()
        for _ in range(100):  # the backoff after one failure: half a second
            if remote.is_running():
                break
            await asyncio.sleep(0.05)
        back = await ask(manager, ALICE, "Are you back?")
        assert back.session_id == done.session_id
        assert stored_messages(db, done.session_id)[:2] == stored and len(stored_messages(db, done.session_id)) == 4
    finally:
        await manager.close()
        await remote.close(1.0)
        server.stop()


# --- vLLM's and SGLang's shapes, from a fake at the network edge --------------------------------


@pytest.fixture
async def vllm(tokenizer: PreTrainedTokenizerBase) -> AsyncIterator[tuple[FakeModelServer, RemoteEngine]]:
    fake = FakeModelServer(free_port(), model="Qwen/Qwen3-8B").start()
    backend = RemoteEngine(remote_config(fake.base_url, tokenizer="qwen3")).start()
    yield fake, backend
    await backend.close(1.0)
    fake.stop()


async def test_a_vllm_shaped_stream_with_its_cached_tokens_and_its_own_finish_reason(
    vllm: tuple[FakeModelServer, RemoteEngine],
) -> None:
    fake, backend = vllm
    fake.replies.append(
        [chunk("Hel", [9707]), chunk("", [11]), chunk("lo", [385], finish_reason="repetition"), usage(40, 3, 32)]
    )
    params = SamplingParams(temperature=0.7, top_k=20, dynamic_top_k=True, max_top_k=30, seed=7, max_tokens=8)
    deltas = await collect(backend, list(range(40)), params)
    assert [(d.token_ids, d.text) for d in deltas] == [([9707], "Hel"), ([11], ""), ([385], "lo")]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].num_cached_tokens == 32
    [sent] = fake.requests
    assert sent["prompt"] == list(range(40)) and sent["return_token_ids"] is True
    assert sent["stream_options"] == {"include_usage": True}
    # vLLM has no dynamic top-k: it samples from the wider choice, and hears nothing of ours.
    assert sent["top_k"] == 30 and sent["seed"] == 7 and "dynamic_top_k" not in sent
    assert "priority" not in sent  # engine.remote_priority is off
    assert backend.figures().kv_cache.prefix_hit_tokens == 32


async def test_broken_streams_end_the_reply_with_an_error_and_refusals_say_why(
    vllm: tuple[FakeModelServer, RemoteEngine],
) -> None:
    fake, backend = vllm
    fake.replies += [
        [chunk("Hel", [9707]), {"error": {"message": "CUDA out of memory", "type": "InternalServerError"}}],
        [chunk("Hel", None)],  # a server that does not return token ids
        # SGLang's flat error body
        JSONResponse({"object": "error", "message": "The input (5000 tokens) is longer ..."}, status_code=400),
        JSONResponse({"error": {"message": "busy"}}, status_code=503),
    ]
    for _ in range(2):
        deltas = await collect(backend, [1, 2, 3], SamplingParams())
        assert deltas[-1].finished and deltas[-1].finish_reason == "error"
    with pytest.raises(ValueError, match=r"The input \(5000 tokens\) is longer"):
        await collect(backend, [1, 2, 3], SamplingParams())
    with pytest.raises(EngineUnavailable, match="answered 503: busy"):
        await collect(backend, [1, 2, 3], SamplingParams())
    assert backend.is_running()  # the server answered: no backoff


async def test_a_server_without_tokenize_is_used_with_a_warning_and_priorities_are_sent_when_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeModelServer(free_port(), model="Qwen/Qwen3-8B").start()
    try:
        backend = RemoteEngine(remote_config(fake.base_url, tokenizer="qwen3", send_priority=True)).start()
        assert "has no /tokenize" in caplog.text
        fake.replies.append([chunk("a", [64], finish_reason="length"), usage(3, 1, 0)])
        await collect(backend, [1, 2, 3], SamplingParams(priority=5))
        assert fake.requests[-1]["priority"] == 5
        await backend.close(1.0)
        fake.tokenize = [1, 2, 3]  # not what the bundled Qwen3 tokenizer gives
        with pytest.raises(RemoteEngineError, match=r"engine\.tokenizer 'qwen3' does not match"):
            RemoteEngine(remote_config(fake.base_url, tokenizer="qwen3"))
    finally:
        fake.stop()
