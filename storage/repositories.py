"""Small repositories over one unit of work (a SQLAlchemy Session from Database.session())."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import ColumnElement, CursorResult, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from storage.models import CacheEntry, Chat, ChatSession, FollowedThread, Message, ProcessedEvent, utcnow


@dataclass(frozen=True)
class SessionQuery:
    """What the console looks for: `text` in the session's key (which holds the chat and, per user
    or thread, their ids), its chat's id or name, or any of its messages, case-insensitively; a
    channel; a state. Empty fields match everything."""

    text: str = ""
    channel: str | None = None
    state: str | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        conditions: list[ColumnElement[bool]] = []
        if self.state is not None:
            conditions.append(ChatSession.state == self.state)
        if self.channel is not None:
            conditions.append(ChatSession.chat.has(Chat.channel == self.channel))
        if self.text:
            conditions.append(
                or_(
                    ChatSession.key.icontains(self.text, autoescape=True),
                    ChatSession.chat.has(Chat.name.icontains(self.text, autoescape=True)),
                    ChatSession.messages.any(Message.text.icontains(self.text, autoescape=True)),
                )
            )
        return conditions


class ChatRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get_or_create(self, chat_id: str, *, channel: str, chat_type: str = "p2p", name: str | None = None) -> Chat:
        chat = self.session.get(Chat, chat_id)
        if chat is not None:
            return chat
        chat = Chat(id=chat_id, channel=channel, chat_type=chat_type, name=name)
        self.session.add(chat)
        self.session.flush()
        return chat

    def set_system_prompt(self, chat_id: str, system_prompt: str | None) -> None:
        chat = self.session.get(Chat, chat_id)
        assert chat is not None, f"unknown chat {chat_id}"
        chat.system_prompt = system_prompt

    def set_persona(self, chat_id: str, name: str | None, manner: str | None) -> None:
        chat = self.session.get(Chat, chat_id)
        assert chat is not None, f"unknown chat {chat_id}"
        chat.persona_name, chat.persona_manner = name, manner


class SessionRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def active(self, key: str) -> ChatSession | None:
        return self.session.scalar(select(ChatSession).where(ChatSession.key == key, ChatSession.state == "active"))

    def get(self, session_id: int) -> ChatSession | None:
        return self.session.get(ChatSession, session_id)

    def progress(self, session_id: int) -> tuple[str, int, int] | None:
        """(state, the seq its next message takes, compressions), in one query: what a copy of the
        session in memory is checked against before each turn."""
        last_seq = select(func.max(Message.seq)).where(Message.session_id == session_id).scalar_subquery()
        next_seq = func.coalesce(last_seq + 1, 0).label("next_seq")
        row = self.session.execute(
            select(ChatSession.state, next_seq, ChatSession.compressions).where(ChatSession.id == session_id)
        ).one_or_none()
        return None if row is None else (row.state, row.next_seq, row.compressions)

    def create(self, key: str, *, chat_id: str | None = None, system_prompt: str | None = None) -> ChatSession:
        chat_session = ChatSession(key=key, chat_id=chat_id, system_prompt=system_prompt)
        self.session.add(chat_session)
        self.session.flush()
        return chat_session

    def touch(self, session_id: int, when: datetime | None = None, *, transcript_digest: str | None = None) -> None:
        """Marks the session active at `when` (now) and, where given, keyed by a new transcript's digest."""
        digest = {} if transcript_digest is None else {"transcript_digest": transcript_digest}
        self.session.execute(
            update(ChatSession).where(ChatSession.id == session_id).values(last_active_at=when or utcnow(), **digest)
        )

    def close(self, session_id: int, when: datetime | None = None) -> None:
        self.session.execute(
            update(ChatSession)
            .where(ChatSession.id == session_id, ChatSession.state == "active")
            .values(state="closed", closed_at=when or utcnow())
        )

    def close_idle(self, idle_since: datetime) -> list[str]:
        """Close every active session last active before `idle_since`; returns their keys."""
        keys = self.session.scalars(
            select(ChatSession.key).where(ChatSession.state == "active", ChatSession.last_active_at < idle_since)
        ).all()
        if keys:
            self.session.execute(
                update(ChatSession)
                .where(ChatSession.state == "active", ChatSession.last_active_at < idle_since)
                .values(state="closed", closed_at=utcnow())
            )
        return list(keys)

    def recent(self, limit: int = 100, offset: int = 0, among: SessionQuery | None = None) -> Sequence[ChatSession]:
        """Most recently active first, with their chats; with `among`, only the sessions it matches."""
        query = select(ChatSession).options(selectinload(ChatSession.chat))
        if among is not None:
            query = query.where(*among.conditions())
        return self.session.scalars(
            query.order_by(ChatSession.last_active_at.desc(), ChatSession.id.desc()).limit(limit).offset(offset)
        ).all()

    def count_matching(self, among: SessionQuery) -> int:
        return self.session.scalar(select(func.count()).select_from(ChatSession).where(*among.conditions())) or 0

    def count_by_channel(self) -> dict[str, int]:
        rows = self.session.execute(
            select(Chat.channel, func.count()).select_from(ChatSession).join(Chat).group_by(Chat.channel)
        )
        return dict(rows.all())

    def count(self, state: str | None = None) -> int:
        query = select(func.count()).select_from(ChatSession)
        if state is not None:
            query = query.where(ChatSession.state == state)
        return self.session.scalar(query) or 0


@dataclass(frozen=True)
class NewMessage:
    seq: int
    turn_index: int
    role: str
    text: str
    token_ids: Sequence[int] | NDArray[np.integer]


class MessageRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, session_id: int, messages: Sequence[NewMessage]) -> None:
        """All in one INSERT. The unit of work's flush for each message cost a turn's write 2.5 ms
        of CPU on SQLite (its two messages and the session's row) against 1.1 ms this way: CPU the
        app shares with the engine on a small machine."""
        if messages:
            self.session.execute(
                insert(Message),
                [
                    {
                        "session_id": session_id,
                        "seq": message.seq,
                        "turn_index": message.turn_index,
                        "role": message.role,
                        "text": message.text,
                        "token_ids": message.token_ids,
                    }
                    for message in messages
                ],
            )

    def of_session(self, session_id: int) -> Sequence[Message]:
        return self.session.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.seq)).all()

    def counts(self, session_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """Session id -> (messages, turns) for the sessions that have messages."""
        rows = self.session.execute(
            select(Message.session_id, func.count(), func.max(Message.turn_index) + 1)
            .where(Message.session_id.in_(session_ids))
            .group_by(Message.session_id)
        ).all()
        return {session_id: (messages, turns) for session_id, messages, turns in rows}


class EventRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def claim(
        self,
        key: str,
        ttl: timedelta,
        now: datetime | None = None,
        *,
        chat_type: str | None = None,
        lease: timedelta = timedelta(0),
    ) -> bool:
        """Record `key` as processed, its reply not yet finished and leased to the caller for
        `lease`. False if it was already claimed and has not expired.

        The primary key makes this safe across replicas sharing one database: of two inserts of
        the same key, exactly one succeeds."""
        now = now or utcnow()
        existing = self.session.get(ProcessedEvent, key)
        if existing is not None:
            if existing.expires_at > now:
                return False
            existing.created_at, existing.expires_at, existing.chat_type = now, now + ttl, chat_type
            existing.finished_at = existing.resumed_at = existing.reply_card = None
            existing.lease_until = now + lease
            return True
        try:
            with self.session.begin_nested():
                self.session.add(
                    ProcessedEvent(
                        key=key, created_at=now, expires_at=now + ttl, chat_type=chat_type, lease_until=now + lease
                    )
                )
        except IntegrityError:
            return False
        return True

    def finish(self, key: str, now: datetime | None = None) -> None:
        """The claim's reply has been shown (an answer or an error line): it is not answered again."""
        self.session.execute(
            update(ProcessedEvent).where(ProcessedEvent.key == key).values(finished_at=now or utcnow())
        )

    def showing(self, key: str, card: str) -> None:
        """The unfinished claim's reply streams into `card` (the newest of its cards)."""
        self.session.execute(
            update(ProcessedEvent)
            .where(ProcessedEvent.key == key, ProcessedEvent.finished_at.is_(None))
            .values(reply_card=card)
        )

    def lease(self, key: str, lease: timedelta, now: datetime | None = None) -> None:
        """The unfinished claim's lease runs for `lease` from now; zero gives it up at once."""
        self.session.execute(
            update(ProcessedEvent)
            .where(ProcessedEvent.key == key, ProcessedEvent.finished_at.is_(None))
            .values(lease_until=(now or utcnow()) + lease)
        )

    def resume_unfinished(
        self, prefix: str, since: datetime, now: datetime | None = None, *, lease: timedelta = timedelta(0)
    ) -> list[ProcessedEvent]:
        """Take the unfinished claims under `prefix` made since `since` that nobody resumed yet and
        whose lease has run out, oldest first, to answer them again under a lease of `lease`.

        One UPDATE both finds and marks them, so of replicas starting together each claim goes to
        exactly one (a SELECT first would let two read it before either wrote)."""
        now = now or utcnow()
        taken = self.session.scalars(
            update(ProcessedEvent)
            .where(
                ProcessedEvent.key.startswith(prefix, autoescape=True),
                ProcessedEvent.created_at >= since,
                ProcessedEvent.expires_at > now,
                ProcessedEvent.finished_at.is_(None),
                ProcessedEvent.resumed_at.is_(None),
                or_(ProcessedEvent.lease_until.is_(None), ProcessedEvent.lease_until <= now),
            )
            .values(resumed_at=now, lease_until=now + lease)
            .returning(ProcessedEvent)
            .execution_options(synchronize_session=False)
        ).all()
        return sorted(taken, key=lambda claim: claim.created_at)

    def purge_expired(self, now: datetime | None = None) -> int:
        result = self.session.execute(delete(ProcessedEvent).where(ProcessedEvent.expires_at <= (now or utcnow())))
        assert isinstance(result, CursorResult)  # what a DELETE returns
        return result.rowcount


class CacheRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, entry: CacheEntry) -> CacheEntry:
        self.session.add(entry)
        self.session.flush()
        return entry

    def all(self) -> Sequence[CacheEntry]:
        return self.session.scalars(select(CacheEntry).order_by(CacheEntry.id)).all()

    def ids(self, embedder: str) -> Sequence[int]:
        return self.session.scalars(select(CacheEntry.id).where(CacheEntry.embedder == embedder)).all()

    def after(self, entry_id: int, embedder: str) -> Sequence[CacheEntry]:
        """The rows added after `entry_id` (ids only grow), oldest first."""
        query = select(CacheEntry).where(CacheEntry.id > entry_id, CacheEntry.embedder == embedder)
        return self.session.scalars(query.order_by(CacheEntry.id)).all()

    def record_hit(self, entry_id: int, when: datetime) -> None:
        self.session.execute(
            update(CacheEntry).where(CacheEntry.id == entry_id).values(hits=CacheEntry.hits + 1, last_hit_at=when)
        )

    def delete(self, entry_ids: Sequence[int]) -> None:
        # In chunks: SQLite caps the bound parameters of one statement.
        for start in range(0, len(entry_ids), 500):
            self.session.execute(delete(CacheEntry).where(CacheEntry.id.in_(entry_ids[start : start + 500])))

    def delete_key(self, key: str) -> None:
        self.session.execute(delete(CacheEntry).where(CacheEntry.key == key))

    def delete_all(self) -> None:
        self.session.execute(delete(CacheEntry))


class ThreadRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def follow(self, root_message_id: str, ttl: timedelta, now: datetime | None = None) -> None:
        """Follow the thread until `ttl` from now, again if it is followed already."""
        expires_at = (now or utcnow()) + ttl
        followed = update(FollowedThread).where(FollowedThread.root_message_id == root_message_id)
        result = self.session.execute(followed.values(expires_at=expires_at))
        assert isinstance(result, CursorResult)  # what an UPDATE returns
        if result.rowcount:
            return
        try:
            with self.session.begin_nested():
                self.session.add(FollowedThread(root_message_id=root_message_id, expires_at=expires_at))
        except IntegrityError:
            # Another replica answered in the thread at the same moment: it follows it as long.
            return

    def followed(self, root_message_id: str, now: datetime | None = None) -> bool:
        expires_at = self.session.scalar(
            select(FollowedThread.expires_at).where(FollowedThread.root_message_id == root_message_id)
        )
        return expires_at is not None and expires_at > (now or utcnow())

    def purge_expired(self, now: datetime | None = None) -> int:
        result = self.session.execute(delete(FollowedThread).where(FollowedThread.expires_at <= (now or utcnow())))
        assert isinstance(result, CursorResult)  # what a DELETE returns
        return result.rowcount
