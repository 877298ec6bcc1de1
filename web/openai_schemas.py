"""OpenAI chat-completions bodies: the request as clients send it, the responses as they expect.

Unknown request fields are ignored, as OpenAI-compatible servers do: SDKs send many."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from chat.turns import lone_surrogate_at

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls"]
MAX_TOOLS = 128


def _unicode(text: str) -> str:
    if (position := lone_surrogate_at(text)) is not None:
        raise PydanticCustomError(
            "invalid_unicode", "not valid Unicode: a lone surrogate at character {position}", {"position": position}
        )
    return text


# Every string a client sends: JSON's "\ud800" decodes to a lone surrogate, which no encoder takes.
ClientStr = Annotated[str, AfterValidator(_unicode)]


def _unicode_json(value: JsonValue) -> JsonValue:
    """Every string in a JSON value, keys included, is Unicode (`_unicode`)."""
    if isinstance(value, str):
        return _unicode(value)
    if isinstance(value, list):
        for item in value:
            _unicode_json(item)
    if isinstance(value, dict):
        for key, item in value.items():
            _unicode(key)
            _unicode_json(item)
    return value


class FunctionDefinition(BaseModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: ClientStr | None = None
    parameters: Annotated[dict[str, JsonValue], AfterValidator(_unicode_json)] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: ClientStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    name: ClientStr
    arguments: ClientStr  # a JSON object, as a string


class MessageToolCall(BaseModel):
    id: ClientStr
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    type: Literal["text"]
    text: ClientStr


class RequestMessage(BaseModel):
    role: Role
    content: ClientStr | list[TextPart] | None = None  # None only for an assistant's message with tool calls
    name: ClientStr | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's
    tool_call_id: ClientStr | None = None  # a tool's: the call it answers

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: ClientStr
    messages: list[RequestMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: ClientStr | list[ClientStr] | None = None
    seed: int | None = None
    user: ClientStr | None = Field(None, max_length=256)
    n: Literal[1] = 1
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # accepted; the model may make several calls either way


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the reply is tool calls alone
    refusal: None = None
    tool_calls: list[MessageToolCall] | None = None

    @model_serializer(mode="wrap")
    def _omit_no_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """As OpenAI: `tool_calls` only when there are some."""
        body: dict[str, Any] = handler(self)
        if self.tool_calls is None:
            del body["tool_calls"]
        return body


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[Choice]
    usage: Usage


class DeltaToolCall(BaseModel):
    """A call, whole: as OpenAI streams a call's first part (index, id, type, name) and its arguments."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Delta(BaseModel):
    """OpenAI sends only what a chunk adds: the role once, then content or tool calls, then nothing."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "clawdbot"
    max_model_len: int  # as vLLM reports it: what a remote backend may send


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail
