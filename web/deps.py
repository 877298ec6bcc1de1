"""Typed dependencies on what `build_app` put on `app.state`.

`async`, though they never await: FastAPI runs a plain `def` dependency in its thread pool, a
thread hop (and a wait for the GIL the engine thread holds) for nothing but an attribute read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from chat import ChatManager, SessionStore
from settings import Settings
from web.health import TransportProbe
from web.limits import LoginThrottle, RateLimiter
from web.monitor import Monitor
from web.telemetry import Telemetry


async def _chat_manager(request: Request) -> ChatManager:
    chat_manager: ChatManager = request.app.state.chat_manager
    return chat_manager


async def _sessions(request: Request) -> SessionStore:
    chat_manager: ChatManager = request.app.state.chat_manager
    return chat_manager.sessions


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _rate_limiter(request: Request) -> RateLimiter:
    rate_limiter: RateLimiter = request.app.state.rate_limiter
    return rate_limiter


async def _login_throttle(request: Request) -> LoginThrottle:
    login_throttle: LoginThrottle = request.app.state.login_throttle
    return login_throttle


async def _telemetry(request: Request) -> Telemetry:
    telemetry: Telemetry = request.app.state.telemetry
    return telemetry


async def _monitor(request: Request) -> Monitor:
    monitor: Monitor = request.app.state.monitor
    return monitor


# How many memories, owners, reminders and scheduled prompts the assistant keeps: counts, never texts.
AssistantCounts = Callable[[], Awaitable[dict[str, int]]]


async def _assistant_counts(request: Request) -> AssistantCounts:
    counts: AssistantCounts = request.app.state.assistant_counts
    return counts


async def _transports(request: Request) -> dict[str, TransportProbe]:
    transports: dict[str, TransportProbe] = request.app.state.transports
    return transports


ChatManagerDep = Annotated[ChatManager, Depends(_chat_manager)]
SessionsDep = Annotated[SessionStore, Depends(_sessions)]
SettingsDep = Annotated[Settings, Depends(_settings)]
RateLimiterDep = Annotated[RateLimiter, Depends(_rate_limiter)]
LoginThrottleDep = Annotated[LoginThrottle, Depends(_login_throttle)]
TelemetryDep = Annotated[Telemetry, Depends(_telemetry)]
MonitorDep = Annotated[Monitor, Depends(_monitor)]
TransportsDep = Annotated[dict[str, TransportProbe], Depends(_transports)]
AssistantCountsDep = Annotated[AssistantCounts, Depends(_assistant_counts)]
