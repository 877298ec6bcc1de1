"""A turn as its caller sees it: the reply's text as it streams, then the result."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from cache.levels import CacheLevel
from engine import FinishReason

log = logging.getLogger(__name__)


class InvalidMessage(ValueError):
    """A message the bot will not take; the text is meant for the user."""


def lone_surrogate_at(text: str) -> int | None:
    """Where `text` holds a lone surrogate (JSON's "\\ud800" decodes to one), or None. Such text is
    not Unicode: the tokenizer, the digests and the database all fail to encode it."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def require_unicode(text: str, what: str) -> None:
    if (position := lone_surrogate_at(text)) is not None:
        raise InvalidMessage(f"{what} is not valid Unicode (a lone surrogate at character {position}).")


@dataclass(frozen=True)
class TurnResult:
    reply: str
    session_id: int
    cache_level: CacheLevel
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    compressed: bool


class Turn:
    """Iterate for the reply's visible text; `result` is set once the turn is stored.

    The turn runs in a task of its own from the first iteration, so it is stored once the reply
    is complete whether or not the caller reads to the end. A caller that leaves earlier (a closed
    page, a client that went away) aborts it, and nothing is stored. `cache_level` is known
    before the first text, for headers sent ahead of it.
    """

    def __init__(self, run: Callable[[Turn], Awaitable[TurnResult]]) -> None:
        self.cache_level: CacheLevel | None = None
        self.result: TurnResult | None = None
        self._run = run
        self._texts: asyncio.Queue[str | None] = asyncio.Queue()
        self._task: asyncio.Task[TurnResult] | None = None
        self._reply_complete = False

    def __aiter__(self) -> AsyncGenerator[str]:
        return self._stream()

    async def collect(self) -> TurnResult:
        """Read the reply to its end; the stored turn's result."""
        async for _ in self:
            continue  # the pieces are in the result's reply
        assert self.result is not None
        return self.result

    # --- the pipeline's side -------------------------------------------------------------------

    def emit(self, text: str) -> None:
        self._texts.put_nowait(text)

    def reply_complete(self) -> None:
        """From here on the turn is stored even if its caller leaves."""
        self._reply_complete = True

    # --- the caller's side ---------------------------------------------------------------------

    async def _stream(self) -> AsyncGenerator[str]:
        assert self._task is None, "a turn is iterated once"
        task = self._task = asyncio.create_task(self._drive())
        task.add_done_callback(lambda _: self._texts.put_nowait(None))
        try:
            while (text := await self._texts.get()) is not None:
                yield text
            # Shielded: a caller cancelled now must not cancel the storing of a complete reply.
            await asyncio.shield(task)
        finally:
            if not self._reply_complete:
                task.cancel()
            elif not task.done():
                task.add_done_callback(_log_failure)  # no caller is left to see it fail

    async def _drive(self) -> TurnResult:
        self.result = await self._run(self)
        return self.result


def _log_failure(task: asyncio.Task[TurnResult]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("storing a turn whose caller had left failed", exc_info=error)
