"""A reply as it is built from the engine's deltas: what the user sees, what history keeps."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine import FinishReason, StreamDelta
from engine.chat_format import THINK_END


@dataclass
class Reply:
    """The visible text, the ids the model produced (think block included), the engine's facts."""

    text: str = ""
    generated_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_text_at: float | None = None

    async def visible(self, deltas: AsyncIterator[StreamDelta], think_end: int | None) -> AsyncIterator[str]:
        """Takes in `deltas`, yields the text a user may see: with thinking on (`think_end`, the
        id that closes the think block), nothing before the end of the think block."""
        thinking = think_end is not None
        async for delta in deltas:
            self.generated_ids += delta.token_ids
            if delta.finished:
                self.finish_reason = delta.finish_reason or "stop"
                self.prompt_tokens = delta.num_prompt_tokens or 0
                self.cached_tokens = delta.num_cached_tokens or 0
            text = delta.text
            if thinking:
                thinking = think_end not in delta.token_ids
                if thinking:
                    continue
                # the answer's first tokens may come in the same delta (accepted draft tokens)
                text = text.partition(THINK_END)[2]
            piece = text if self.text else text.lstrip()
            if not piece:
                continue
            if self.first_text_at is None:
                self.first_text_at = time.perf_counter()
            self.text += piece
            yield piece
        if self.finish_reason == "error":
            raise RuntimeError("the engine failed while generating this reply")
