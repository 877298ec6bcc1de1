"""`/v1/completions` bodies, shaped as vLLM's in every field a remote backend reads: a prompt of
token ids, `return_token_ids`, `priority`, `usage.prompt_tokens_details.cached_tokens`.

Unknown request fields are ignored, as vLLM does. `dynamic_top_k`, `min_top_k`, `max_top_k` and
`confidence` are this engine's own (SamplingParams); other servers ignore them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from web.openai_schemas import ClientStr, StreamOptions, Usage

FinishReason = Literal["stop", "length"]


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: ClientStr
    prompt: ClientStr | list[int] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1)  # OpenAI's and vLLM's default
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's -1 (and 0): the whole vocabulary
    seed: int | None = None
    stop: ClientStr | list[ClientStr] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    priority: int = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    dynamic_top_k: bool | None = None
    min_top_k: int | None = None
    max_top_k: int | None = None
    confidence: float | None = None
    n: Literal[1] = 1
    echo: Literal[False] = False


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _omit_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """As vLLM: token ids only when asked for, the prompt's once."""
        body: dict[str, Any] = handler(self)
        for key in ("token_ids", "prompt_token_ids"):
            if body[key] is None:
                del body[key]
        return body


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: ClientStr | None = None
    prompt: ClientStr
    add_special_tokens: bool = True


class Tokenized(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
