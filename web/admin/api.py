"""The console's JSON: every figure, the charts' time series, cache entries, sessions, config."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, status
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from cache.response_cache import EntryView
from chat.session_rows import SessionDetail, SessionPage
from chat.turns import lone_surrogate_at
from settings import Settings
from web.admin.auth import require_admin
from web.deps import AssistantCountsDep, ChatManagerDep, MonitorDep, SessionsDep, SettingsDep, TransportsDep
from web.health import TransportStatus

SECRETS = {
    "feishu.app_secret",
    "feishu.verification_token",
    "feishu.encrypt_key",
    "admin.token",
    "api.key",
    "engine.remote_api_key",
}
MASK = "••••••••"

# The largest integer the databases store (SQLite's INTEGER, PostgreSQL's BIGINT): a larger id or
# offset is the client's mistake (422), not a failed query (500).
MAX_ROW_NUMBER = 2**63 - 1
RowId = Annotated[int, Path(ge=1, le=MAX_ROW_NUMBER)]

router = APIRouter(prefix="/admin/api", tags=["admin console"], dependencies=[Depends(require_admin)])


class Flushed(BaseModel):
    deleted: int


@router.get("/stats")
async def stats(
    chat_manager: ChatManagerDep, sessions: SessionsDep, transports: TransportsDep, assistant: AssistantCountsDep
) -> dict[str, Any]:
    """Every figure: turns, sessions, engine, KV pool, cache, merging; the assistant's memories and
    reminders (counts only); and how chat platforms' events reach the app (Feishu's transport)."""
    figures = dataclasses.asdict(chat_manager.figures())
    figures["sessions"] = dataclasses.asdict(await sessions.counts())
    figures["assistant"] = await assistant()
    figures["transports"] = {name: _transport(probe()) for name, probe in transports.items()}
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
    return await chat_manager.cache.entries(q, limit, order)


@router.delete("/cache/entries/{entry_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_cache_entry(entry_id: RowId, chat_manager: ChatManagerDep) -> None:
    if not await chat_manager.cache.delete(entry_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"No cache entry {entry_id}.")


@router.post("/cache/flush")
async def flush_cache(chat_manager: ChatManagerDep) -> Flushed:
    return Flushed(deleted=await chat_manager.cache.flush())


@router.get("/sessions")
async def sessions_page(
    sessions: SessionsDep,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=MAX_ROW_NUMBER),
    q: str = Query("", max_length=200, description="a word in the chat's key or name, or in any message"),
    channel: str | None = Query(None, max_length=32),
    state: Literal["active", "closed"] | None = None,
) -> SessionPage:
    if lone_surrogate_at(q) is not None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "q is not valid Unicode.")
    return await sessions.page(limit, offset, text=q.strip(), channel=channel or None, state=state)


@router.get("/sessions/{session_id}")
async def session_detail(session_id: RowId, sessions: SessionsDep) -> SessionDetail:
    detail = await sessions.detail(session_id)
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


def _transport(status: TransportStatus) -> dict[str, Any]:
    return {"state": status.state, "ready": status.ready, "last_event_at": status.last_event_at}
