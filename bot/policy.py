"""Which `im.message.receive_v1` events the bot answers, and what the user said in them.

Private chats always; groups when this bot is @mentioned (by open_id, never by name), on @all
only if configured, and in threads, where a message without a mention may be a follow-up (the
bot decides: `addressed` is False). Senders that are not users, the bot's own messages and
events older than `max_event_age` are ignored. Each message is answered once: its id is claimed
in the database, which survives restarts and is shared by replicas. A claim whose reply was never
finished (the process stopped meanwhile) is answered again at the next start, by one replica; the
claim holds the card the reply was streaming into, for that replica to close it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import lark_oapi as lark
from lark_oapi.api.im.v1 import MentionEvent, Message, P2ImMessageReceiveV1

from bot.content import Said, read, resolve_mentions
from storage import Database, EventRepository, ProcessedEvent, utcnow

log = logging.getLogger(__name__)

MESSAGE_KEY = "feishu:message:"
CARD_ACTION_KEY = "feishu:card-action:"
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
    """The user's words, mentions resolved, what the model cannot read marked in place ("[image]");
    None when there are markers but no words (`bot.content`)."""
    parent_id: str | None = None
    """The message this one replies to (in a thread: the thread's root)."""
    root_id: str | None = None
    addressed: bool = True
    """False: a group message in a thread that does not @mention the bot."""


@dataclass(frozen=True)
class Unanswered:
    """A message claimed before a restart whose reply was never finished."""

    message_id: str
    chat_type: str
    reply_card: str | None = None
    """The card the unfinished reply was streaming into, if one was opened (`Replier`'s reference)."""


class EventPolicy:
    def __init__(
        self,
        db: Database,
        *,
        max_event_age: timedelta,
        dedup_ttl: timedelta,
        claim_lease: timedelta,
        answer_at_all: bool,
    ) -> None:
        self._db = db
        self._max_event_age = max_event_age
        self._dedup_ttl = dedup_ttl
        self.claim_lease = claim_lease
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
        said = read(message.message_type or "", message.content)
        raw_text = said.words
        addressed = message.chat_type == "p2p" or self._addressed(mentions, raw_text)
        if not addressed and not message.thread_id:
            return None
        return IncomingMessage(
            message_id=message.message_id,
            chat_id=message.chat_id,
            chat_type="p2p" if message.chat_type == "p2p" else "group",
            sender_open_id=sender_open_id,
            thread_id=message.thread_id or None,
            message_type=message.message_type,
            text=self._text(said, mentions),
            parent_id=message.parent_id or None,
            root_id=message.root_id or None,
            addressed=addressed,
        )

    async def first_delivery(self, message: IncomingMessage) -> bool:
        """Claim the message; False when it was claimed before (a redelivery or a replay)."""
        return await asyncio.to_thread(self._claim, MESSAGE_KEY + message.message_id, message.chat_type)

    async def first_click(self, event_id: str, chat_type: str) -> bool:
        """Claim a card click by its callback's event_id; False when it was claimed before."""
        return await asyncio.to_thread(self._claim, CARD_ACTION_KEY + event_id, chat_type)

    @asynccontextmanager
    async def answering(self, message: IncomingMessage) -> AsyncIterator[None]:
        """While the block makes the reply, the message's claim stays leased to this replica
        (renewed every third of the lease), so a replica starting meanwhile leaves it alone.
        Finished when the block ends (the reply, or an error line, was shown); given up at once
        when it raises, for the next pass over unfinished claims (`take_unanswered`) to answer."""
        key = MESSAGE_KEY + message.message_id
        renewing = asyncio.create_task(self._renew(key))
        try:
            yield
        except BaseException:
            await asyncio.to_thread(self._lease, key, timedelta(0))
            raise
        else:
            await asyncio.to_thread(self._finish, key)
        finally:
            renewing.cancel()

    async def showing(self, message: IncomingMessage, card: str) -> None:
        """The reply to `message` streams into `card` now: recorded on its claim, so that a replica
        answering it again can close the card if this one stops before finishing it."""
        await asyncio.to_thread(self._showing, MESSAGE_KEY + message.message_id, card)

    async def take_unanswered(self) -> list[Unanswered]:
        """Claim, to answer them again, the messages claimed within `max_event_age` whose reply was
        never finished (the process stopped or failed meanwhile) and whose lease has run out; each
        goes to one replica."""
        claims = await asyncio.to_thread(self._resume_unfinished, utcnow() - self._max_event_age)
        return [
            Unanswered(claim.key.removeprefix(MESSAGE_KEY), claim.chat_type or "p2p", claim.reply_card)
            for claim in claims
        ]

    async def _renew(self, key: str) -> None:
        while True:
            await asyncio.sleep(self.claim_lease.total_seconds() / 3)
            await asyncio.to_thread(self._lease, key, self.claim_lease)

    def _claim(self, key: str, chat_type: str) -> bool:
        with self._db.session() as session:
            return EventRepository(session).claim(key, self._dedup_ttl, chat_type=chat_type, lease=self.claim_lease)

    def _finish(self, key: str) -> None:
        with self._db.session() as session:
            EventRepository(session).finish(key)

    def _showing(self, key: str, card: str) -> None:
        with self._db.session() as session:
            EventRepository(session).showing(key, card)

    def _lease(self, key: str, lease: timedelta) -> None:
        with self._db.session() as session:
            EventRepository(session).lease(key, lease)

    def _resume_unfinished(self, since: datetime) -> list[ProcessedEvent]:
        with self._db.session() as session:
            return EventRepository(session).resume_unfinished(MESSAGE_KEY, since, lease=self.claim_lease)

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
        return AT_ALL.sub("", resolve_mentions(text, names)).strip()

    def _text(self, said: Said, mentions: list[MentionEvent]) -> str | None:
        resolved = said.map(lambda text: self._resolve_mentions(text, mentions))
        # Nothing at all is an empty message, which the chat manager refuses as such.
        return None if resolved.text and not resolved.readable else resolved.text


def fetched_event(message: Message, chat_type: str) -> P2ImMessageReceiveV1:
    """The receive event a message fetched through the Open API came in, for `admit` to read.

    The API names some fields differently (msg_type, body.content) and gives ids as bare strings."""
    mentions = [{"key": m.key, "id": {"open_id": m.id}, "name": m.name} for m in message.mentions or []]
    event = {
        "sender": {"sender_id": {"open_id": message.sender.id}, "sender_type": message.sender.sender_type},
        "message": {
            "message_id": message.message_id,
            "create_time": str(message.create_time),
            "chat_id": message.chat_id,
            "chat_type": chat_type,
            "thread_id": message.thread_id,
            "parent_id": message.parent_id,
            "root_id": message.root_id,
            "message_type": message.msg_type,
            "content": message.body.content,
            "mentions": mentions,
        },
    }
    return lark.JSON.unmarshal(json.dumps({"schema": "2.0", "event": event}), P2ImMessageReceiveV1)
