"""One queue per conversation place, a chat's main stream or one of its threads: a queue's messages
are handled one at a time in arrival order, queues in parallel, and at most `max_per_chat` of one
chat at once, so that one busy group cannot take every engine slot.

A queue per thread rather than per chat: a group's threads would otherwise wait on each other for
nothing, since replies in different threads cannot be read out of order, and turns of a session
the threads share wait for the session's lock anyway."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")


@dataclass(frozen=True)
class Lane:
    chat_id: str
    thread_id: str | None
    """None: the chat's main stream."""


@dataclass
class _Chat:
    slots: asyncio.Semaphore
    lanes: int = 0


class ChatLanes(Generic[Item]):
    def __init__(self, handle: Callable[[Item], Awaitable[None]], *, max_per_chat: int) -> None:
        self._handle = handle
        self._max_per_chat = max_per_chat
        self._lanes: dict[Lane, deque[Item]] = {}
        self._chats: dict[str, _Chat] = {}
        self._workers: set[asyncio.Task[None]] = set()

    def submit(self, lane: Lane, item: Item) -> None:
        """Queue `item` behind the lane's earlier ones; call on the event loop's thread."""
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()
            worker = asyncio.create_task(
                self._drain(lane, queue, self._join(lane.chat_id)), name=f"feishu-chat-{lane.chat_id}"
            )
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        queue.append(item)

    async def close(self, grace_s: float) -> None:
        """Let work in progress finish for up to `grace_s`, then cancel what is left."""
        if not self._workers:
            return
        _, unfinished = await asyncio.wait(set(self._workers), timeout=grace_s)
        for worker in unfinished:
            worker.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)

    def _join(self, chat_id: str) -> _Chat:
        chat = self._chats.get(chat_id)
        if chat is None:
            chat = self._chats[chat_id] = _Chat(asyncio.Semaphore(self._max_per_chat))
        chat.lanes += 1
        return chat

    async def _drain(self, lane: Lane, queue: deque[Item], chat: _Chat) -> None:
        try:
            while queue:
                async with chat.slots:
                    await self._handle_logged(lane, queue.popleft())
        finally:
            del self._lanes[lane]
            chat.lanes -= 1
            if not chat.lanes:
                del self._chats[lane.chat_id]

    async def _handle_logged(self, lane: Lane, item: Item) -> None:
        try:
            await self._handle(item)
        except Exception:
            log.exception("feishu: handling a message in chat %s failed", lane.chat_id)
