"""The local chat page at /: talk to the bot in a browser, streamed, one session per browser.

The browser is known by a cookie; its conversation is the ChatManager session of
Conversation(channel="web", chat_id=<cookie>), so it survives reloads and restarts."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Literal

from fastapi import APIRouter, Cookie, Depends, Request, Response, status
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, Field

from cache.levels import CacheLevel
from chat import Conversation, InvalidMessage, Turn
from web.admission import admit
from web.deps import ChatManagerDep, RateLimiterDep, SessionsDep, SettingsDep
from web.errors import WebError, WebErrorRoute
from web.templating import templates

COOKIE = "clawdbot_chat"
COOKIE_MAX_AGE_S = 365 * 86_400


def chat_page_enabled(settings: SettingsDep) -> None:
    if not settings.api.chat_page:
        raise WebError(404, "The chat page is off (api.chat_page).", code="not_found")


def browser_conversation(clawdbot_chat: Annotated[str | None, Cookie()] = None) -> Conversation:
    if not clawdbot_chat:
        raise WebError(400, "No chat session: reload the page.", code="no_session")
    return Conversation(channel="web", chat_id=clawdbot_chat)


BrowserConversation = Annotated[Conversation, Depends(browser_conversation)]

router = APIRouter(tags=["chat page"], route_class=WebErrorRoute, dependencies=[Depends(chat_page_enabled)])


class ChatRequest(BaseModel):
    text: str = Field(min_length=1)


class ChatLine(BaseModel):
    role: Literal["user", "assistant"]
    text: str


class History(BaseModel):
    messages: list[ChatLine]


class Badges(BaseModel):
    """What the page shows under a reply."""

    cache_level: CacheLevel
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    compressed: bool


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def chat_page(request: Request, clawdbot_chat: Annotated[str | None, Cookie()] = None) -> HTMLResponse:
    page = templates.TemplateResponse(request, "chat.html")
    if not clawdbot_chat:
        page.set_cookie(COOKIE, secrets.token_urlsafe(18), max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="strict")
    return page


@router.get("/chat/api/history")
async def history(conversation: BrowserConversation, sessions: SessionsDep) -> History:
    messages = await sessions.visible_messages(conversation)
    return History(messages=[ChatLine(role=role, text=text) for role, text in messages])


@router.post("/chat/api/messages", dependencies=[Depends(admit)])
async def send_message(
    message: ChatRequest,
    conversation: BrowserConversation,
    chat_manager: ChatManagerDep,
    rate_limiter: RateLimiterDep,
) -> StreamingResponse:
    """Server-sent events: `delta` {text} as the reply streams, then `done` with its Badges, or
    `error` {message}."""
    rate_limiter.check(f"web:{conversation.chat_id}")
    try:
        turn = chat_manager.turn(conversation, message.text)
    except InvalidMessage as exc:
        raise WebError(400, str(exc), param="text") from None
    return StreamingResponse(_events(turn), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/chat/api/reset", status_code=status.HTTP_204_NO_CONTENT)
async def new_session(conversation: BrowserConversation, sessions: SessionsDep) -> Response:
    await sessions.reset(conversation)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


async def _events(turn: Turn) -> AsyncIterator[str]:
    async with aclosing(aiter(turn)) as deltas:  # a closed page stops the generation
        try:
            async for text in deltas:
                yield _event("delta", {"text": text})
        except (ValueError, RuntimeError) as exc:
            yield _event("error", {"message": f"The bot could not answer: {exc}."})
            return
    result = turn.result
    assert result is not None
    badges = Badges(
        cache_level=result.cache_level,
        ttft_ms=result.ttft_s * 1000,
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        completion_tokens=result.completion_tokens,
        compressed=result.compressed,
    )
    yield _event("done", badges.model_dump())


def _event(name: str, data: dict[str, object]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
