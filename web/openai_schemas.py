"""OpenAI chat-completions bodies: the request as clients send it, the responses as they expect.

Unknown request fields are ignored, as OpenAI-compatible servers do: SDKs send many."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import PydanticCustomError

from chat.turns import lone_surrogate_at

Role = Literal["system", "developer", "user", "assistant"]
FinishReason = Literal["stop", "length"]


def _unicode(text: str) -> str:
    if (position := lone_surrogate_at(text)) is not None:
        raise PydanticCustomError(
            "invalid_unicode", "not valid Unicode: a lone surrogate at character {position}", {"position": position}
        )
    return text


# Every string a client sends: JSON's "\ud800" decodes to a lone surrogate, which no encoder takes.
ClientStr = Annotated[str, AfterValidator(_unicode)]


class TextPart(BaseModel):
    type: Literal["text"]
    text: ClientStr


class RequestMessage(BaseModel):
    role: Role
    content: ClientStr | list[TextPart]
    name: ClientStr | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
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


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


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


class Delta(BaseModel):
    """OpenAI sends only what a chunk adds: the role once, then content, then nothing."""

    role: Literal["assistant"] | None = None
    content: str | None = None

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
