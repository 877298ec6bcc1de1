"""The local chat page at /: talk to the bot in a browser, streamed, one session per browser.

Served by default only when the server listens on loopback (api.chat_page: auto). When api.key is
set, the page asks for it once (/login) and keeps a signed login cookie. The browser's
conversation is named by a cookie the server issued and signed, never by a value the client
invents; its session is the ChatManager session of Conversation(channel="web", chat_id=<that
id>), so it survives reloads and restarts."""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Cookie, Depends, Form, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from pydantic import BaseModel, Field

from cache.levels import CacheLevel
from chat import Conversation, InvalidMessage, Turn
from settings import Settings
from web import signing
from web.admission import admit
from web.deps import ChatManagerDep, LoginThrottleDep, RateLimiterDep, SessionsDep, SettingsDep
from web.errors import WebError, WebErrorRoute
from web.login import LoginForm
from web.templating import templates

log = logging.getLogger(__name__)

COOKIE = "clawdbot_chat"
COOKIE_MAX_AGE_S = 365 * 86_400
CONVERSATION_PURPOSE = "clawdbot-chat-conversation"
SECRET_FILE = "chat_cookie_secret"  # under engine.data_dir
LOGIN = LoginForm(
    heading="Clawdbot chat",
    action="/login",
    label="API key",
    wrong="Wrong API key.",
    cookie="clawdbot_chat_login",
    cookie_path="/",
    purpose="clawdbot-chat-login",
    then="/",
)


def serves_chat_page(settings: Settings) -> bool:
    """api.chat_page: auto serves the page only when no other host can reach it."""
    if settings.api.chat_page == "auto":
        return _is_loopback(settings.server.host)
    return settings.api.chat_page


def warn_if_open(settings: Settings) -> None:
    """At start-up: a chat page other hosts can reach, without api.key, lets anyone use the bot."""
    if serves_chat_page(settings) and not settings.api.key and not _is_loopback(settings.server.host):
        log.warning(
            "the chat page is on (api.chat_page: true) on %s, which other hosts can reach, and api.key "
            "is empty: anyone who reaches it can use the bot. Set api.key, or api.chat_page: auto",
            settings.server.host,
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def chat_page_enabled(settings: SettingsDep) -> None:
    if not serves_chat_page(settings):
        raise WebError(404, "The chat page is off (api.chat_page).", code="not_found")


def _conversation_secret(settings: Settings) -> str:
    return signing.stored_secret(Path(settings.engine.data_dir).resolve() / SECRET_FILE)


def _logged_in(settings: Settings, login_cookie: str | None) -> bool:
    return not settings.api.key or LOGIN.logged_in(login_cookie, settings.api.key)


def browser_conversation(
    settings: SettingsDep,
    clawdbot_chat: Annotated[str | None, Cookie()] = None,
    clawdbot_chat_login: Annotated[str | None, Cookie()] = None,
) -> Conversation:
    if not _logged_in(settings, clawdbot_chat_login):
        raise WebError(401, "Log in at /login with the API key (api.key).", code="invalid_api_key")
    chat_id = signing.unsign(clawdbot_chat or "", _conversation_secret(settings), CONVERSATION_PURPOSE)
    if not chat_id:
        raise WebError(400, "No chat session: reload the page.", code="no_session")
    return Conversation(channel="web", chat_id=chat_id)


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
async def chat_page(
    request: Request,
    settings: SettingsDep,
    chat_manager: ChatManagerDep,
    clawdbot_chat: Annotated[str | None, Cookie()] = None,
    clawdbot_chat_login: Annotated[str | None, Cookie()] = None,
) -> HTMLResponse:
    if not _logged_in(settings, clawdbot_chat_login):
        return LOGIN.page(request)
    engine = chat_manager.engine
    page = templates.TemplateResponse(
        request, "chat.html", {"model": engine.model_name, "is_demo_model": engine.is_demo_model}
    )
    secret = _conversation_secret(settings)
    if signing.unsign(clawdbot_chat or "", secret, CONVERSATION_PURPOSE) is None:
        conversation = signing.sign(secrets.token_urlsafe(18), secret, CONVERSATION_PURPOSE)
        page.set_cookie(COOKIE, conversation, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="strict")
    return page


@router.get("/login", response_class=HTMLResponse, include_in_schema=False)
async def login_form(request: Request, settings: SettingsDep) -> Response:
    if not settings.api.key:
        return RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    return LOGIN.page(request)


@router.post("/login", response_class=HTMLResponse, include_in_schema=False)
async def login(
    request: Request, settings: SettingsDep, throttle: LoginThrottleDep, given: Annotated[str, Form(alias="token")]
) -> Response:
    if not settings.api.key:
        return RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    return LOGIN.submit(request, throttle, given, settings.api.key, settings.api.chat_login_ttl_s)


@router.get("/chat/api/history")
async def history(conversation: BrowserConversation, sessions: SessionsDep) -> History:
    messages = await sessions.visible_messages(conversation)
    return History(messages=[ChatLine(role=role, text=text) for role, text in messages])


@router.post("/chat/api/messages", dependencies=[Depends(admit)])
async def send_message(
    message: ChatRequest,
    request: Request,
    conversation: BrowserConversation,
    chat_manager: ChatManagerDep,
    settings: SettingsDep,
    rate_limiter: RateLimiterDep,
) -> StreamingResponse:
    """Server-sent events: `delta` {text} as the reply streams, then `done` with its Badges, or
    `error` {message}."""
    rate_limiter.check_client(request, settings.api.key)
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
