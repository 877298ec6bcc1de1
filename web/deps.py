"""Typed dependencies on what `build_app` put on `app.state`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.chat_manager import ChatManager
from settings import Settings
from storage import Database
from web.limits import RateLimiter
from web.telemetry import Telemetry
from web.monitor import Monitor


def _chat_manager(request: Request) -> ChatManager:
    return request.app.state.chat_manager


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _db(request: Request) -> Database:
    return request.app.state.db


def _rate_limiter(request: Request) -> RateLimiter:
    return request.app.state.rate_limiter


def _telemetry(request: Request) -> Telemetry:
    return request.app.state.telemetry


def _monitor(request: Request) -> Monitor:
    return request.app.state.monitor


ChatManagerDep = Annotated[ChatManager, Depends(_chat_manager)]
SettingsDep = Annotated[Settings, Depends(_settings)]
DatabaseDep = Annotated[Database, Depends(_db)]
RateLimiterDep = Annotated[RateLimiter, Depends(_rate_limiter)]
TelemetryDep = Annotated[Telemetry, Depends(_telemetry)]
MonitorDep = Annotated[Monitor, Depends(_monitor)]
