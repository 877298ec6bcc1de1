"""The console's JSON: every counter, the charts' time series, cache entries, sessions, config."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, status
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from engine.cache.response_cache import EntryView
from settings import Settings
from storage import ChatSession, Database, MessageRepository, SessionRepository
from web.admin.auth import require_admin
from web.deps import ChatManagerDep, DatabaseDep, MonitorDep, SettingsDep

SECRETS = {"feishu.app_secret", "feishu.verification_token", "feishu.encrypt_key", "admin.token", "api.key"}
MASK = "••••••••"

router = APIRouter(prefix="/admin/api", tags=["admin console"], dependencies=[Depends(require_admin)])


class SessionSummary(BaseModel):
    id: int
    key: str
    state: str
    created_at: datetime
    last_active_at: datetime
    messages: int
    turns: int
    compressions: int


class SessionList(BaseModel):
    total: int
    active: int
    sessions: list[SessionSummary]


class MessageOut(BaseModel):
    seq: int
    turn_index: int
    role: str
    text: str
    tokens: int
    in_context: bool
    created_at: datetime


class SessionDetail(SessionSummary):
    system_prompt: str
    context_tokens: int
    messages_detail: list[MessageOut]


class Flushed(BaseModel):
    deleted: int


@router.get("/stats")
async def stats(chat_manager: ChatManagerDep, db: DatabaseDep) -> dict[str, Any]:
    """Every counter: turns, sessions, engine, KV pool, cache, merging."""
    figures = chat_manager.stats()
    figures["sessions"] |= await asyncio.to_thread(_session_counts, db)
    return figures


@router.get("/history")
async def history(monitor: MonitorDep) -> dict[str, list[float]]:
    return monitor.series()


@router.get("/cache/entries")
async def cache_entries(
    chat_manager: ChatManagerDep,
    q: str = "",
    limit: int = Query(50, ge=1, le=500),
    order: Literal["recent", "hits"] = "recent",
) -> list[EntryView]:
    """Entries whose question contains `q`; most recently used first, or most hit first."""
    cache = chat_manager.cache
    if order == "recent":
        views = await asyncio.to_thread(cache.entries, q, limit)
    else:
        views = await asyncio.to_thread(cache.entries, q, cache.config.capacity)
        views = sorted(views, key=lambda view: view.hits, reverse=True)[:limit]
    return views


@router.delete("/cache/entries/{entry_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_cache_entry(entry_id: int, chat_manager: ChatManagerDep) -> None:
    if not await asyncio.to_thread(chat_manager.cache.delete, entry_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"No cache entry {entry_id}.")


@router.post("/cache/flush")
async def flush_cache(chat_manager: ChatManagerDep) -> Flushed:
    return Flushed(deleted=await asyncio.to_thread(chat_manager.cache.flush))


@router.get("/sessions")
async def sessions(
    db: DatabaseDep, limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0)
) -> SessionList:
    return await asyncio.to_thread(_sessions, db, limit, offset)


@router.get("/sessions/{session_id}")
async def session_detail(session_id: int, db: DatabaseDep) -> SessionDetail:
    detail = await asyncio.to_thread(_session_detail, db, session_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"No session {session_id}.")
    return detail


@router.get("/config")
async def config(settings: SettingsDep) -> dict[str, Any]:
    """The effective settings (file, then environment), secrets masked."""
    return masked(settings)


def masked(settings: Settings) -> dict[str, Any]:
    values = settings.model_dump()
    for dotted in SECRETS:
        section, key = dotted.split(".")
        if values[section][key]:
            values[section][key] = MASK
    values["storage"]["url"] = make_url(settings.storage.url).render_as_string(hide_password=True)
    return values


def _session_counts(db: Database) -> dict[str, int]:
    with db.session() as session:
        repository = SessionRepository(session)
        return {"stored": repository.count(), "active": repository.count("active")}


def _summary(row: ChatSession, counts: tuple[int, int]) -> SessionSummary:
    messages, turns = counts
    return SessionSummary(
        id=row.id, key=row.key, state=row.state, created_at=row.created_at, last_active_at=row.last_active_at,
        messages=messages, turns=turns, compressions=row.compressions,
    )


def _sessions(db: Database, limit: int, offset: int) -> SessionList:
    with db.session() as session:
        repository = SessionRepository(session)
        rows = repository.recent(limit, offset)
        counts = MessageRepository(session).counts([row.id for row in rows])
        return SessionList(
            total=repository.count(),
            active=repository.count("active"),
            sessions=[_summary(row, counts.get(row.id, (0, 0))) for row in rows],
        )


def _session_detail(db: Database, session_id: int) -> SessionDetail | None:
    with db.session() as session:
        row = SessionRepository(session).get(session_id)
        if row is None:
            return None
        messages = MessageRepository(session).of_session(session_id)
        # After a compression only these messages, and every later one, are in the prompt.
        context = set(row.context_seqs) if row.context_seqs is not None else None
        through = row.compacted_through_seq if row.compacted_through_seq is not None else -1
        lines = [
            MessageOut(
                seq=m.seq, turn_index=m.turn_index, role=m.role, text=m.text, tokens=len(m.token_ids),
                in_context=context is None or m.seq in context or m.seq > through, created_at=m.created_at,
            )
            for m in messages
        ]
        summary = _summary(row, (len(messages), max((m.turn_index for m in messages), default=-1) + 1))
        return SessionDetail(
            **summary.model_dump(),
            system_prompt=row.system_prompt or "",
            context_tokens=sum(line.tokens for line in lines if line.in_context),
            messages_detail=lines,
        )
