from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class RequestOutput:
    """A finished request. `token_ids` are the generated ids, a final stop token included (it is
    what the model emitted); `text` leaves out that token and any matched stop string."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_cached_tokens: int
    ttft_s: float | None


@dataclass
class StreamDelta:
    """What a request produced since the last delta. The last one has `finished` set."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None
    num_prompt_tokens: int | None = None
