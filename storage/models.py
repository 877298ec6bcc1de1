"""What the bot keeps: chats, sessions, messages with their token ids, processed events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    Unicode,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC (SQLite has no time zones), always returned aware."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        assert value.tzinfo is not None, "store aware datetimes only"
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class TokenIds(TypeDecorator[NDArray[np.uint32]]):
    """Token ids as packed little-endian uint32: 4 bytes a token. Read back as one read-only
    `frombuffer` over the row's bytes, no int per token; written from any sequence of ids."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Sequence[int] | NDArray[np.integer] | None, dialect: object) -> bytes | None:
        if value is None:
            return None
        return np.asarray(value, dtype="<u4").tobytes()

    def process_result_value(self, value: bytes | None, dialect: object) -> NDArray[np.uint32] | None:
        return None if value is None else np.frombuffer(value, dtype="<u4")


class Base(DeclarativeBase):
    pass


class Chat(Base):
    """A conversation place: a Feishu group or private chat, or a web/API client."""

    __tablename__ = "chats"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    channel: Mapped[str] = mapped_column(String(32))
    chat_type: Mapped[str] = mapped_column(String(16), default="p2p")
    name: Mapped[str | None] = mapped_column(String(256))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    persona_name: Mapped[str | None] = mapped_column(String(64))
    persona_manner: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    sessions: Mapped[list[ChatSession]] = relationship(back_populates="chat")


class ChatSession(Base):
    """One conversation thread; at most one active session per key."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index(
            "uq_sessions_active_key",
            "key",
            unique=True,
            sqlite_where=text("state = 'active'"),
            postgresql_where=text("state = 'active'"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(256), index=True)
    chat_id: Mapped[str | None] = mapped_column(ForeignKey("chats.id", ondelete="SET NULL"), index=True)
    system_prompt: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_active_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # After a compression the context is these messages in this order (summaries included),
    # followed by every message with a seq above compacted_through_seq. None: all messages.
    context_seqs: Mapped[list[int] | None] = mapped_column(JSON)
    compacted_through_seq: Mapped[int | None] = mapped_column(Integer)
    compressions: Mapped[int] = mapped_column(Integer, default=0)
    # An API session's transcript (system prompt, user and assistant texts), hashed: the next
    # request of its client sends it again and is matched to this session by it.
    transcript_digest: Mapped[str | None] = mapped_column(String(32), index=True)
    # When the model went over it for facts to remember, once it had closed (or it was decided to skip).
    distilled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    chat: Mapped[Chat | None] = relationship(back_populates="sessions")
    messages: Mapped[list[Message]] = relationship(
        back_populates="session", order_by="Message.seq", cascade="all, delete-orphan"
    )


class Message(Base):
    """One message of a session, with the exact token ids the model saw or produced."""

    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    turn_index: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[NDArray[np.uint32]] = mapped_column(TokenIds)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    session: Mapped[ChatSession] = relationship(back_populates="messages")


class ProcessedEvent(Base):
    """A dedup key (Feishu message_id / event_id) seen before; kept until it expires.

    A claim is finished once its reply has been shown; an unfinished one is answered again after
    a restart, once (`resumed_at`), when its lease has run out: the replica answering it renews
    `lease_until` while it works, so a replica starting meanwhile leaves it alone. `reply_card` is
    the card the reply streams into (its writer's reference to it), for the replica that answers
    again to close a card the stopped one left streaming."""

    __tablename__ = "processed_events"

    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    # A message fetched again through the Open API does not say which kind of chat it is in.
    chat_type: Mapped[str | None] = mapped_column(String(16))
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reply_card: Mapped[str | None] = mapped_column(String(64))


class CacheEntry(Base):
    """A cached answer: the question it answers within its scope, and that question's embedding."""

    __tablename__ = "cache_entries"
    # Ids are never reused (SQLite reuses the largest one after a delete without this): replicas
    # follow the table by the highest id they have read (ResponseCache.sync).
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(String(64), index=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    # The max_tokens the model's answer was cut at; NULL: the model ended it. A cut answer serves
    # only requests that ask for no more tokens.
    cut_at: Mapped[int | None] = mapped_column(Integer)
    embedder: Mapped[str] = mapped_column(String(256))
    embedding: Mapped[bytes] = mapped_column(LargeBinary)  # float32, native byte order
    hits: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_hit_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class FollowedThread(Base):
    """A Feishu thread the bot answered in, named by its first message: until `expires_at`, a
    message in it is answered without an @mention."""

    __tablename__ = "followed_threads"

    root_message_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class Memory(Base):
    """A fact the bot keeps for its owner (a private chat, or one person in a group) across
    sessions, with its embedding for recall."""

    __tablename__ = "memories"
    # Ids are never reused (SQLite reuses the largest one after a delete without this), so the
    # (count, largest id) of an owner's rows changes with every change: MemoryStore's index check.
    __table_args__ = (Index("ix_memories_owner", "owner"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(256))
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))  # "asked" (/remember) or "distilled" (a closed session)
    embedder: Mapped[str] = mapped_column(String(128))
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ScheduledJob(Base):
    """A reminder or scheduled prompt, as APScheduler's SQLAlchemyJobStore keeps it (its table),
    with its chat, owner and kind beside it, set as the job is inserted: written and read only by
    that job store (assistant/reminders.py)."""

    __tablename__ = "apscheduler_jobs"
    __table_args__ = (Index("ix_apscheduler_jobs_owner", "chat_id", "user_id"),)

    id: Mapped[str] = mapped_column(Unicode(191), primary_key=True)
    next_run_time: Mapped[float | None] = mapped_column(Float(25), index=True)  # a UTC timestamp
    job_state: Mapped[bytes] = mapped_column(LargeBinary)  # the pickled job
    # NULL only for a job stored before migration 0013 that it could not read
    chat_id: Mapped[str | None] = mapped_column(Unicode(191))
    user_id: Mapped[str | None] = mapped_column(Unicode(191))
    kind: Mapped[str | None] = mapped_column(Unicode(191))  # "remind" or "prompt"
