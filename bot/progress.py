"""A "typing" reaction on the user's message while its answer is generated.

Best effort: the reaction is added alongside the answer, never before it, and each call is tried
once, within REACTION_TIMEOUT_S; a failure is a warning and the answer goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bot.feishu_api import FeishuApi

log = logging.getLogger(__name__)

TYPING_EMOJI = "Typing"
# Feishu answers a reaction in ~100 ms; past this the lane moves on (the answer is never held).
REACTION_TIMEOUT_S = 3.0


class TypingReaction:
    def __init__(self, api: FeishuApi, *, enabled: bool) -> None:
        self._api = api
        self._enabled = enabled

    @asynccontextmanager
    async def shown_on(self, message_id: str) -> AsyncIterator[None]:
        """Show the reaction on `message_id` for as long as the block runs."""
        if not self._enabled:
            yield
            return
        adding = asyncio.create_task(self._add(message_id), name=f"feishu-typing-{message_id}")
        try:
            yield
        finally:
            reaction_id = await adding
            if reaction_id is not None:
                await self._remove(message_id, reaction_id)

    async def _add(self, message_id: str) -> str | None:
        try:
            return await asyncio.wait_for(self._api.add_reaction(message_id, TYPING_EMOJI), REACTION_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - network, permission, rate limit or timeout: the answer goes on
            log.warning("feishu: no typing reaction on message %s (%s)", message_id, _reason(exc))
            return None

    async def _remove(self, message_id: str, reaction_id: str) -> None:
        try:
            await asyncio.wait_for(self._api.remove_reaction(message_id, reaction_id), REACTION_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - as for adding it: the reaction stays, the bot goes on
            log.warning("feishu: the typing reaction on message %s stays (%s)", message_id, _reason(exc))


def _reason(exc: Exception) -> str:
    # TimeoutError's message is empty.
    return str(exc) or type(exc).__name__
