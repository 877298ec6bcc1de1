"""POST /v1/completions and POST /tokenize: the engine itself, for bot replicas on other machines
(their `engine.backend: remote`), vLLM-compatible in the fields those read.

No session, response cache or request merging here: the replica that calls owns them. A prompt of
token ids goes to the engine as it is, so the prefix cache hits turn after turn; the reply comes
back as token ids (`return_token_ids`) and text, with `usage.prompt_tokens_details.cached_tokens`.
A client that disconnects aborts its request. Admission control applies (429 beyond the queue
limit), the per-client rate limit does not: the clients are a handful of replicas, each serving
many people, and `api.key` keeps everyone else out."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from engine import Engine, SamplingParams, StreamDelta
from settings import GenerationSettings
from web.admission import admit
from web.completions_schemas import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReason,
    Tokenized,
    TokenizeRequest,
)
from web.deps import ChatManagerDep, SettingsDep
from web.errors import WebError, WebErrorRoute
from web.openai_api import check_model, require_api_key, unless_disconnected
from web.openai_schemas import ErrorBody, PromptTokensDetails, Usage

T = TypeVar("T")

router = APIRouter(
    tags=["engine"],
    route_class=WebErrorRoute,
    dependencies=[Depends(require_api_key)],
    responses={status: {"model": ErrorBody} for status in (400, 401, 404, 413, 429, 503)},
)


@router.post("/v1/completions", response_model=Completion, dependencies=[Depends(admit)])
async def create_completion(
    body: CompletionRequest, request: Request, chat_manager: ChatManagerDep, settings: SettingsDep
) -> Completion | StreamingResponse:
    check_model(body.model, chat_manager.model_name)
    engine = chat_manager.engine
    prompt = body.prompt if isinstance(body.prompt, list) else engine.tokenizer.encode(body.prompt)
    params = _sampling(body, settings.generation)
    completion = _Completion(f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.model, body.return_token_ids)
    if not body.stream:
        return await unless_disconnected(_refusing(completion.whole(_deltas(engine, prompt, params), prompt)), request)
    deltas = _deltas(engine, prompt, params)
    first = await _refusing(anext(deltas))  # a refusal before any token is an HTTP error, not a broken stream
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(
        completion.events(first, deltas, prompt, include_usage),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _deltas(engine: Engine, prompt: list[int], params: SamplingParams) -> AsyncGenerator[StreamDelta]:
    try:
        return engine.stream(prompt, params)
    except ValueError as exc:
        raise _refusal(exc) from None


async def _refusing(work: Awaitable[T]) -> T:
    """`work`, with an engine's refusal as an HTTP error (a remote engine refuses as it streams)."""
    try:
        return await work
    except (ValueError, RuntimeError) as exc:
        raise _refusal(exc) from None


def _refusal(exc: ValueError | RuntimeError) -> WebError:
    """ValueError: the prompt (400); RuntimeError: a remote engine's server cannot be reached (503)."""
    if isinstance(exc, ValueError):
        return WebError(400, f"The prompt cannot be served: {exc}.", param="prompt")
    return WebError(503, f"The engine cannot serve now: {exc}.", type="server_error", code="engine_error")


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, chat_manager: ChatManagerDep) -> Tokenized:
    if body.model is not None:
        check_model(body.model, chat_manager.model_name)
    engine = chat_manager.engine
    tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return Tokenized(count=len(tokens), max_model_len=engine.max_model_len, tokens=tokens)


def _sampling(body: CompletionRequest, generation: GenerationSettings) -> SamplingParams:
    if body.max_tokens > generation.max_reply_tokens:
        raise WebError(
            400,
            f"'max_tokens' is {body.max_tokens}; this server allows at most {generation.max_reply_tokens} tokens.",
            param="max_tokens",
            code="max_tokens_too_large",
        )
    requested: dict[str, Any] = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": None if body.top_k is None else max(body.top_k, 0),
        "seed": body.seed,
        "max_tokens": body.max_tokens,
        "stop": body.stop,
        "stop_token_ids": body.stop_token_ids,
        "ignore_eos": body.ignore_eos,
        "priority": body.priority,
        "dynamic_top_k": body.dynamic_top_k,
        "min_top_k": body.min_top_k,
        "max_top_k": body.max_top_k,
        "confidence": body.confidence,
    }
    try:
        return SamplingParams(**{key: value for key, value in requested.items() if value is not None})
    except ValueError as exc:
        raise WebError(400, f"Invalid sampling parameters: {exc}.") from None


@dataclasses.dataclass(frozen=True)
class _Completion:
    id: str
    created: int
    model: str
    return_token_ids: bool

    def body(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def choice(self, delta: StreamDelta, prompt: list[int] | None) -> CompletionChoice:
        ids = self.return_token_ids
        return CompletionChoice(
            text=delta.text,
            finish_reason=_finish_reason(delta),
            token_ids=delta.token_ids if ids else None,
            prompt_token_ids=prompt if ids else None,
        )

    async def whole(self, deltas: AsyncGenerator[StreamDelta], prompt: list[int]) -> Completion:
        async with aclosing(deltas):
            pieces = [delta async for delta in deltas]
        last = pieces[-1]
        if (failure := _failure(last)) is not None:
            raise failure
        token_ids = [token_id for piece in pieces for token_id in piece.token_ids]
        merged = dataclasses.replace(last, token_ids=token_ids, text="".join(piece.text for piece in pieces))
        return self.body([self.choice(merged, prompt)], _usage(last, len(token_ids)))

    async def events(
        self, first: StreamDelta, rest: AsyncGenerator[StreamDelta], prompt: list[int], include_usage: bool
    ) -> AsyncIterator[str]:
        """vLLM's SSE: a chunk per delta (the prompt's ids with the first), usage if asked, [DONE].
        A request the engine aborts or fails ends with an error event and no [DONE]."""
        generated = 0
        prompt_ids: list[int] | None = prompt
        async with aclosing(rest):
            async for delta in _chained(first, rest):
                if (failure := _failure(delta)) is not None:
                    yield f"data: {failure.body().model_dump_json()}\n\n"
                    return
                generated += len(delta.token_ids)
                yield f"data: {self.body([self.choice(delta, prompt_ids)]).model_dump_json()}\n\n"
                prompt_ids = None
                if delta.finished and include_usage:
                    yield f"data: {self.body([], _usage(delta, generated)).model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"


async def _chained(first: StreamDelta, rest: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
    yield first
    async for delta in rest:
        yield delta


def _finish_reason(delta: StreamDelta) -> FinishReason | None:
    if not delta.finished:
        return None
    assert delta.finish_reason in ("stop", "length")  # _failure() took the others
    return delta.finish_reason


def _failure(delta: StreamDelta) -> WebError | None:
    """The engine aborted the request (shutting down) or failed in a step."""
    if not delta.finished or delta.finish_reason in ("stop", "length"):
        return None
    return WebError(
        503,
        f"The engine ended the request early ({delta.finish_reason}).",
        type="server_error",
        code="engine_error",
        headers={"Retry-After": "10"},
    )


def _usage(last: StreamDelta, completion_tokens: int) -> Usage:
    prompt_tokens = last.num_prompt_tokens or 0
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=last.num_cached_tokens or 0),
    )
