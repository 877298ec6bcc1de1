"""OpenAI-compatible API: POST /v1/chat/completions (JSON or SSE) and GET /v1/models.

Served by the same ChatManager as Feishu: a conversation sent in full with every call continues
the session whose stored token ids it matches, so earlier turns come from the prefix cache.
Every completion carries `X-Cache-Status: miss | exact | semantic | merged` and OpenAI `usage`.
With `tools`, the model's calls (written in its chat template's format) come back as OpenAI
`tool_calls`; such requests never use the response cache and never share a generation."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from contextlib import aclosing
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import StreamingResponse

from cache.levels import CacheLevel
from chat import ChatMessage, InvalidMessage, Transcript, Turn, TurnResult
from chat.tool_calls import ToolCall, ToolCallStream, ToolUse, parse
from engine import SamplingParams
from engine.chat_format import NoToolSupport
from settings import GenerationSettings, LimitsSettings
from web.admission import admit
from web.deps import ChatManagerDep, RateLimiterDep, SettingsDep
from web.errors import WebError, WebErrorRoute
from web.openai_schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    DeltaToolCall,
    ErrorBody,
    FinishReason,
    FunctionCall,
    MessageToolCall,
    Model,
    ModelList,
    NamedToolChoice,
    PromptTokensDetails,
    RequestMessage,
    Usage,
)

log = logging.getLogger(__name__)

SYSTEM_ROLES = ("system", "developer")

T = TypeVar("T")


async def require_api_key(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    key = settings.api.key
    if not key:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
        raise WebError(
            401, "Missing or incorrect API key: send the header 'Authorization: Bearer KEY'.", code="invalid_api_key"
        )


router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    route_class=WebErrorRoute,
    dependencies=[Depends(require_api_key)],
    responses={status: {"model": ErrorBody} for status in (400, 401, 404, 413, 429, 503)},
)


def check_model(requested: str, served: str) -> None:
    if requested != served:
        raise WebError(
            404,
            f"The model '{requested}' does not exist; this server serves '{served}'.",
            param="model",
            code="model_not_found",
        )


@router.get("/models")
async def list_models(chat_manager: ChatManagerDep) -> ModelList:
    return ModelList(
        data=[Model(id=chat_manager.model_name, created=0, max_model_len=chat_manager.engine.max_model_len)]
    )


@router.post("/chat/completions", response_model=ChatCompletion, dependencies=[Depends(admit)])
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    response: Response,
    chat_manager: ChatManagerDep,
    settings: SettingsDep,
    rate_limiter: RateLimiterDep,
) -> ChatCompletion | StreamingResponse:
    rate_limiter.check_client(request, settings.api.key)
    model = chat_manager.model_name
    check_model(body.model, model)
    transcript = _transcript(body.messages, settings.limits, settings.context.system_prompt)
    tools = _tool_use(body)
    params = _sampling(body, chat_manager.sampling, settings.generation)
    # Independent random samples must not share one generation.
    merge = not (body.temperature and body.seed is None)
    try:
        turn = chat_manager.turn_for_transcript(transcript, params=params, merge=merge, tools=tools)
    except NoToolSupport as exc:
        param = "tools" if body.tools else "messages"
        raise WebError(400, f"Tools cannot be used: {exc}.", param=param, code="tools_unsupported") from None
    except InvalidMessage as exc:
        raise WebError(400, str(exc), param="messages") from None
    calling = tools is not None and bool(tools.offered)  # the reply may hold calls to parse out
    completion = _Completion(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model)

    if body.stream:
        deltas = aiter(turn)
        try:
            first = await anext(deltas, None)  # so that a failure before any text is an HTTP error
        except (ValueError, RuntimeError) as exc:
            raise _turn_failed(exc) from exc
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            completion.events(turn, deltas, first, include_usage, ToolCallStream() if calling else None),
            media_type="text/event-stream",
            headers={
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "X-Cache-Status": turn.cache_level or CacheLevel.MISS,
            },
        )

    try:
        result = await unless_disconnected(turn.collect(), request)
    except (ValueError, RuntimeError) as exc:
        raise _turn_failed(exc) from exc
    response.headers["X-Cache-Status"] = result.cache_level
    return ChatCompletion(
        id=completion.id,
        created=completion.created,
        model=model,
        choices=[_choice(result, calling)],
        usage=_usage(result),
    )


@dataclasses.dataclass(frozen=True)
class _Completion:
    id: str
    created: int
    model: str

    def chunk(self, choices: list[ChunkChoice], usage: Usage | None, include_usage: bool) -> str:
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)
        return f"data: {chunk.model_dump_json(exclude=None if include_usage else {'usage'})}\n\n"

    async def events(
        self,
        turn: Turn,
        deltas: AsyncGenerator[str],
        first: str | None,
        include_usage: bool,
        parser: ToolCallStream | None,
    ) -> AsyncIterator[str]:
        """OpenAI's SSE: the role, the text increments (and each tool call, whole, once `parser`
        has read it), the finish reason, usage if asked, [DONE]."""
        yield self.chunk([ChunkChoice(delta=Delta(role="assistant", content=""))], None, include_usage)
        calls = 0
        async with aclosing(deltas), aclosing(_parts(first, deltas, parser)) as parts:
            try:
                async for part in parts:
                    yield self.chunk([ChunkChoice(delta=_delta(part, calls))], None, include_usage)
                    calls += isinstance(part, ToolCall)
                assert turn.result is not None
                finish_reason = _finish_reason(turn.result, called=calls > 0)
            except (ValueError, RuntimeError) as exc:
                yield f"data: {_turn_failed(exc).body().model_dump_json()}\n\n"
                return
        yield self.chunk([ChunkChoice(delta=Delta(), finish_reason=finish_reason)], None, include_usage)
        if include_usage:
            yield self.chunk([], _usage(turn.result), include_usage)
        yield "data: [DONE]\n\n"


def _transcript(messages: Sequence[RequestMessage], limits: LimitsSettings, default_system_prompt: str) -> Transcript:
    """Leading system (or developer) messages make the system prompt; without one, the bot's own
    applies, so API turns share cache scope with the chat page and Feishu."""
    if len(messages) > limits.max_messages:
        raise WebError(
            400,
            f"Too many messages ({len(messages)}; at most {limits.max_messages}).",
            param="messages",
            code="too_many_messages",
        )
    for index, message in enumerate(messages):
        if len(message.text) > limits.max_message_chars:
            raise WebError(
                400,
                f"Message {index} is too long ({len(message.text)} characters; at most {limits.max_message_chars}).",
                param=f"messages[{index}].content",
                code="message_too_long",
            )
    leading = 0
    while leading < len(messages) and messages[leading].role in SYSTEM_ROLES:
        leading += 1
    conversation: list[ChatMessage] = []
    for index, message in enumerate(messages[leading:], start=leading):
        if message.role == "system" or message.role == "developer":
            raise WebError(400, "System messages must come before the conversation.", param=f"messages[{index}].role")
        _check_tool_fields(message, index)
        calls = tuple(ToolCall(c.function.name, c.function.arguments, c.id) for c in message.tool_calls or ())
        conversation.append(ChatMessage(message.role, message.text, calls, message.tool_call_id))
    system_prompt = "\n\n".join(m.text for m in messages[:leading]) if leading else default_system_prompt
    return Transcript(system_prompt, tuple(conversation))


def _check_tool_fields(message: RequestMessage, index: int) -> None:
    if message.tool_calls and message.role != "assistant":
        raise WebError(400, "Only an assistant's message can make tool calls.", param=f"messages[{index}].tool_calls")
    if message.role == "tool" and message.tool_call_id is None:
        raise WebError(
            400,
            "A tool's message must name the call it answers in 'tool_call_id'.",
            param=f"messages[{index}].tool_call_id",
        )
    if message.content is None and not message.tool_calls:
        raise WebError(400, f"Message {index} has no content.", param=f"messages[{index}].content")


def _tool_use(body: ChatCompletionRequest) -> ToolUse | None:
    """The request's tools and tool_choice, checked; None without tools."""
    choice = body.tool_choice
    if not body.tools:
        if choice in (None, "none", "auto"):
            return None
        raise WebError(400, "'tool_choice' requires 'tools'.", param="tool_choice")
    names = [tool.function.name for tool in body.tools]
    for index, name in enumerate(names):
        if names.index(name) != index:
            raise WebError(400, f"The function '{name}' is defined twice.", param=f"tools[{index}].function.name")
        parameters = body.tools[index].function.parameters or {}
        if parameters.get("type", "object") != "object":
            raise WebError(
                400,
                "A function's parameters must be a JSON Schema of type 'object'.",
                param=f"tools[{index}].function.parameters",
            )
    definitions = tuple(tool.model_dump(exclude_unset=True) for tool in body.tools)
    if not isinstance(choice, NamedToolChoice):
        return ToolUse(definitions, choice or "auto")
    if choice.function.name not in names:
        raise WebError(
            400,
            f"'tool_choice' names the function '{choice.function.name}', which 'tools' does not define.",
            param="tool_choice.function.name",
        )
    return ToolUse(definitions, "required", choice.function.name)


async def _parts(
    first: str | None, rest: AsyncIterator[str], parser: ToolCallStream | None
) -> AsyncGenerator[str | ToolCall]:
    """The reply's text as it streams, from its first piece; with a parser, its calls parsed out."""
    text = first
    while text is not None:
        for part in parser.feed(text) if parser else (text,):
            yield part
        text = await anext(rest, None)
    for part in parser.finish() if parser else ():
        yield part


def _delta(part: str | ToolCall, index: int) -> Delta:
    """A chunk's delta: text, or the call numbered `index` in the reply."""
    if isinstance(part, str):
        return Delta(content=part)
    function = FunctionCall(name=part.name, arguments=part.arguments)
    return Delta(tool_calls=[DeltaToolCall(index=index, id=part.id, function=function)])


def _choice(result: TurnResult, calling: bool) -> Choice:
    """The whole reply; when `calling`, its tool calls parsed out."""
    if not calling:
        return Choice(message=AssistantMessage(content=result.reply), finish_reason=_finish_reason(result))
    reply = parse(result.reply)
    if not reply.calls:
        return Choice(message=AssistantMessage(content=reply.content), finish_reason=_finish_reason(result))
    calls = [MessageToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in reply.calls]
    message = AssistantMessage(content=reply.content or None, tool_calls=calls)
    return Choice(message=message, finish_reason=_finish_reason(result, called=True))


async def unless_disconnected(work: Coroutine[Any, Any, T], request: Request) -> T:
    """`work`'s result. A client that disconnects first cancels it, as a closed stream does: a turn
    stores nothing, and the engine stops generating for no one."""
    working = asyncio.ensure_future(work)
    leaving = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((working, leaving), return_when=asyncio.FIRST_COMPLETED)
    finally:
        working.cancel()  # nothing once the work is done: a complete turn is stored regardless
        leaving.cancel()
    if working in done:
        return working.result()
    log.info("a client disconnected before its reply was complete; the request is aborted")
    # 499 (nginx's "client closed request"): no one reads it, but the request metrics count it.
    raise WebError(499, "The client closed the connection before the reply was complete.", code="client_disconnected")


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects; the body is read by now, so that is all that comes."""
    message = await request.receive()
    while message["type"] != "http.disconnect":
        message = await request.receive()


def _sampling(body: ChatCompletionRequest, defaults: SamplingParams, generation: GenerationSettings) -> SamplingParams:
    cap = generation.max_reply_tokens
    for field, value in (("max_completion_tokens", body.max_completion_tokens), ("max_tokens", body.max_tokens)):
        if value is not None and value > cap:
            raise WebError(
                400,
                f"'{field}' is {value}; this server allows at most {cap} tokens in a reply.",
                param=field,
                code="max_tokens_too_large",
            )
    requested: dict[str, Any] = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_tokens": body.max_completion_tokens or body.max_tokens,
        "seed": body.seed,
        "stop": body.stop,
    }
    try:
        return dataclasses.replace(defaults, **{key: value for key, value in requested.items() if value is not None})
    except ValueError as exc:
        raise WebError(400, f"Invalid sampling parameters: {exc}.") from None


def _finish_reason(result: TurnResult, called: bool = False) -> FinishReason:
    """`called`: the reply made tool calls. One cut at max_tokens stays "length": the calls may be
    fewer than the model meant."""
    if result.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"the engine ended the reply early ({result.finish_reason})")
    return "tool_calls" if called and result.finish_reason == "stop" else result.finish_reason


def _turn_failed(exc: ValueError | RuntimeError) -> WebError:
    """ValueError: the engine refused the prompt (too long for the model); RuntimeError: it stopped
    or failed while generating."""
    if isinstance(exc, ValueError):
        return WebError(
            400, f"The conversation does not fit the model: {exc}.", param="messages", code="context_length_exceeded"
        )
    return WebError(
        503,
        f"The engine could not finish this reply: {exc}.",
        type="server_error",
        code="engine_error",
        headers={"Retry-After": "10"},
    )


def _usage(result: TurnResult) -> Usage:
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_tokens),
    )
