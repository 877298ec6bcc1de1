"""One queue per chat: a chat's messages are handled one at a time in arrival order, chats in parallel."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class ChatLanes(Generic[Item]):
    def __init__(self, handle: Callable[[Item], Awaitable[None]]) -> None:
        self._handle = handle
        self._lanes: dict[str, deque[Item]] = {}
        self._workers: set[asyncio.Task[None]] = set()

    def submit(self, chat_id: str, item: Item) -> None:
        """Queue `item` behind the chat's earlier ones; call on the event loop's thread."""
        lane = self._lanes.get(chat_id)
        if lane is None:
            lane = self._lanes[chat_id] = deque()
            worker = asyncio.create_task(self._drain(chat_id, lane), name=f"feishu-chat-{chat_id}")
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        lane.append(item)

    async def close(self, grace_s: float) -> None:
        """Let work in progress finish for up to `grace_s`, then cancel what is left."""
        if not self._workers:
            return
        _, unfinished = await asyncio.wait(set(self._workers), timeout=grace_s)
        for worker in unfinished:
            worker.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)

    async def _drain(self, chat_id: str, lane: deque[Item]) -> None:
        try:
            while lane:
                try:
                    await self._handle(lane.popleft())
                except Exception:
                    log.exception("feishu: handling a message in chat %s failed", chat_id)
        finally:
            del self._lanes[chat_id]
