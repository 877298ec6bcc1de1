"""What the database holds of sessions: which stored messages are in a session's prompt, and the
views the chat page and the console read. Functions of one unit of work each, for worker threads;
SessionStore is their caller."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from storage import ChatSession, Database, Message, MessageRepository, SessionQuery, SessionRepository


@dataclass(frozen=True)
class SessionSummary:
    id: int
    key: str
    channel: str | None  # None: its chat was deleted
    chat_id: str | None
    state: str
    created_at: datetime
    last_active_at: datetime
    messages: int
    turns: int
    compressions: int


@dataclass(frozen=True)
class SessionPage:
    total: int
    active: int
    matching: int  # of the query the page is from
    sessions: list[SessionSummary]


@dataclass(frozen=True)
class MessageView:
    seq: int
    turn_index: int
    role: str
    text: str
    tokens: int
    in_context: bool
    created_at: datetime


@dataclass(frozen=True)
class SessionDetail:
    summary: SessionSummary
    system_prompt: str
    context_tokens: int
    messages: list[MessageView]


def context_of(row: ChatSession, messages: Sequence[Message]) -> list[Message]:
    """The messages in the session's prompt, in prompt order: after a compression, the ones it
    kept (summaries included) and every later one; before any, all of them."""
    if row.context_seqs is None:
        return list(messages)
    by_seq = {message.seq: message for message in messages}
    kept = [by_seq[seq] for seq in row.context_seqs]
    return kept + [message for message in messages if message.seq > (row.compacted_through_seq or -1)]


def chat_with_transcript(db: Database, digest: str) -> str | None:
    """The chat of the active API session whose transcript has this digest (the most recently
    active, should two clients have had the same conversation)."""
    with db.session() as session:
        return session.scalar(
            select(ChatSession.chat_id)
            .where(ChatSession.transcript_digest == digest, ChatSession.state == "active")
            .order_by(ChatSession.last_active_at.desc())
            .limit(1)
        )


def visible_messages(db: Database, key: str) -> list[tuple[str, str]]:
    with db.session() as session:
        row = SessionRepository(session).active(key)
        messages = MessageRepository(session).of_session(row.id) if row is not None else []
        return [(m.role, m.text) for m in messages if m.role in ("user", "assistant")]


def page(db: Database, limit: int, offset: int, query: SessionQuery) -> SessionPage:
    with db.session() as session:
        repository = SessionRepository(session)
        rows = repository.recent(limit, offset, query)
        counts = MessageRepository(session).counts([row.id for row in rows])
        return SessionPage(
            total=repository.count(),
            active=repository.count("active"),
            matching=repository.count_matching(query),
            sessions=[_summary(row, *counts.get(row.id, (0, 0))) for row in rows],
        )


def detail(db: Database, session_id: int) -> SessionDetail | None:
    with db.session() as session:
        row = SessionRepository(session).get(session_id)
        if row is None:
            return None
        messages = MessageRepository(session).of_session(session_id)
        in_context = {message.seq for message in context_of(row, messages)}
        views = [
            MessageView(
                seq=m.seq,
                turn_index=m.turn_index,
                role=m.role,
                text=m.text,
                tokens=len(m.token_ids),
                in_context=m.seq in in_context,
                created_at=m.created_at,
            )
            for m in messages
        ]
        turns = max((m.turn_index for m in messages), default=-1) + 1
        return SessionDetail(
            summary=_summary(row, len(messages), turns),
            system_prompt=row.system_prompt or "",
            context_tokens=sum(view.tokens for view in views if view.in_context),
            messages=views,
        )


def counts(db: Database) -> tuple[int, int, dict[str, int]]:
    """Sessions stored, how many of them are active, and how many each channel holds."""
    with db.session() as session:
        repository = SessionRepository(session)
        return repository.count(), repository.count("active"), repository.count_by_channel()


def _summary(row: ChatSession, messages: int, turns: int) -> SessionSummary:
    return SessionSummary(
        id=row.id,
        key=row.key,
        channel=row.chat.channel if row.chat is not None else None,
        chat_id=row.chat_id,
        state=row.state,
        created_at=row.created_at,
        last_active_at=row.last_active_at,
        messages=messages,
        turns=turns,
        compressions=row.compressions,
    )
