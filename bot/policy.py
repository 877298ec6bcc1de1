"""Which `im.message.receive_v1` events the bot answers, and what the user said in them.

Private chats always; groups only when this bot is @mentioned (by open_id, never by name), and on
@all only if configured. Senders that are not users, the bot's own messages and events older than
`max_event_age` are ignored. Each message is answered once: its id is claimed in the database,
which survives restarts and is shared by replicas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from lark_oapi.api.im.v1 import EventMessage, MentionEvent, P2ImMessageReceiveV1

from storage import Database, EventRepository

log = logging.getLogger(__name__)

PLACEHOLDER = re.compile(r"@_user_\d+")
AT_ALL = re.compile(r"@_all(?![A-Za-z0-9_])")


@dataclass(frozen=True)
class IncomingMessage:
    message_id: str
    chat_id: str
    chat_type: str
    sender_open_id: str
    thread_id: str | None
    message_type: str
    text: str | None
    """The user's words, mentions resolved; None for a message type the bot cannot read."""


class EventPolicy:
    def __init__(self, db: Database, *, max_event_age: timedelta, dedup_ttl: timedelta, answer_at_all: bool) -> None:
        self._db = db
        self._max_event_age = max_event_age
        self._dedup_ttl = dedup_ttl
        self._answer_at_all = answer_at_all
        self.bot_open_id: str | None = None

    def admit(self, event: P2ImMessageReceiveV1, now: float | None = None) -> IncomingMessage | None:
        """The message to answer, or None when the bot stays silent."""
        assert self.bot_open_id is not None, "admit() before the bot knows its open_id"
        data = event.event
        if data is None or data.message is None or data.sender is None or data.sender.sender_id is None:
            log.warning("feishu: malformed im.message.receive_v1 event ignored")
            return None
        message, sender = data.message, data.sender
        sender_open_id = data.sender.sender_id.open_id or ""
        if sender.sender_type != "user" or sender_open_id == self.bot_open_id:
            return None
        age_s = (time.time() if now is None else now) - int(message.create_time or 0) / 1000
        if age_s > self._max_event_age.total_seconds():
            log.info("feishu: message %s is %.0f s old; dropped unanswered", message.message_id, age_s)
            return None
        mentions = message.mentions or []
        raw_text = _raw_text(message)
        if message.chat_type != "p2p" and not self._addressed(mentions, raw_text):
            return None
        return IncomingMessage(
            message_id=message.message_id,
            chat_id=message.chat_id,
            chat_type="p2p" if message.chat_type == "p2p" else "group",
            sender_open_id=sender_open_id,
            thread_id=message.thread_id or None,
            message_type=message.message_type,
            text=None if raw_text is None else self._resolve_mentions(raw_text, mentions),
        )

    async def first_delivery(self, message: IncomingMessage) -> bool:
        """Claim the message; False when it was claimed before (a redelivery or a replay)."""
        return await asyncio.to_thread(self._claim, f"feishu:message:{message.message_id}")

    def _claim(self, key: str) -> bool:
        with self._db.session() as session:
            return EventRepository(session).claim(key, self._dedup_ttl)

    def _addressed(self, mentions: list[MentionEvent], raw_text: str | None) -> bool:
        if any(m.id is not None and m.id.open_id == self.bot_open_id for m in mentions):
            return True
        at_all = any(m.key == "@_all" for m in mentions) or bool(raw_text and AT_ALL.search(raw_text))
        return self._answer_at_all and at_all

    def _resolve_mentions(self, text: str, mentions: list[MentionEvent]) -> str:
        """The bot's own mention goes; others become @Name, so "ask @Alice" keeps its meaning."""
        names = {
            m.key: "" if m.id is not None and m.id.open_id == self.bot_open_id else f"@{m.name}"
            for m in mentions
            if m.key
        }
        text = PLACEHOLDER.sub(lambda match: names.get(match.group(), ""), text)
        return AT_ALL.sub("", text).strip()


def _raw_text(message: EventMessage) -> str | None:
    try:
        content = json.loads(message.content or "{}")
    except json.JSONDecodeError:
        return None
    if message.message_type == "text":
        return content.get("text", "")
    if message.message_type == "post":
        return _post_text(content)
    return None


def _post_text(content: dict[str, Any]) -> str:
    # Events carry the post itself; messages fetched by API wrap it in a locale ({"zh_cn": {...}}).
    post = content if "content" in content else next(iter(content.values()), {})
    lines = [post["title"]] if post.get("title") else []
    for paragraph in post.get("content") or []:
        lines.append("".join(_post_element_text(element) for element in paragraph))
    return "\n".join(lines)


def _post_element_text(element: dict[str, Any]) -> str:
    tag = element.get("tag")
    if tag in ("text", "a", "code_block", "md"):
        return element.get("text", "")
    if tag == "at":
        return element.get("user_id", "")
    return ""
