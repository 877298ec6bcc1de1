"""Threads: which one an answer goes in, and the group threads the bot answered in, where a
message is a follow-up, answered without an @mention (`feishu.thread_follow_up`).

A thread is named by its first message: Feishu gives every message in a thread that message as
root_id, and it is known even before the thread exists, when the answer opens the thread on the
question (`feishu.reply_in_thread`). The threads followed are kept in the database, so that they
hold after a restart and for every replica, until `ttl` after the bot's last answer in them.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from bot.policy import IncomingMessage
from storage import Database, ThreadRepository


class Threads:
    def __init__(self, db: Database, *, ttl: timedelta, reply_in_thread: bool, follow_up: bool) -> None:
        self._db = db
        self._ttl = ttl
        self._reply_in_thread = reply_in_thread
        self._follow_up = follow_up

    def of_answer(self, message: IncomingMessage) -> str | None:
        """The thread the answer to `message` goes in: the one the message is in, or in a group
        answered in threads, the one the answer opens on it; None: the chat's main stream."""
        if message.thread_id is not None:
            return _root(message)
        if self._reply_in_thread and message.chat_type == "group":
            return message.message_id
        return None

    async def answering(self, message: IncomingMessage) -> None:
        """Follow the group thread the answer to `message` goes in, if there is one."""
        thread = self.of_answer(message)
        if not self._follow_up or thread is None or message.chat_type != "group":
            return
        await asyncio.to_thread(self._follow, thread)

    async def is_follow_up(self, message: IncomingMessage) -> bool:
        """Whether `message` is in a thread the bot answered in, and follow-ups are answered."""
        if not self._follow_up or message.thread_id is None:
            return False
        return await asyncio.to_thread(self._followed, _root(message))

    def _follow(self, thread: str) -> None:
        with self._db.session() as session:
            ThreadRepository(session).follow(thread, self._ttl)

    def _followed(self, thread: str) -> bool:
        with self._db.session() as session:
            return ThreadRepository(session).followed(thread)


def _root(message: IncomingMessage) -> str:
    # The first message of a topic group's thread has no root: it is the root.
    return message.root_id or message.message_id
