"""Liveness and readiness probes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])

ReadinessCheck = Callable[[], bool]


class TransportStatus(Protocol):
    """How a chat platform's events reach the app (the Feishu bot's transport): its state, as a word
    ("connected"), whether the app is ready with it, and when the last event came."""

    @property
    def state(self) -> str: ...

    @property
    def ready(self) -> bool: ...

    @property
    def last_event_at(self) -> datetime | None: ...


TransportProbe = Callable[[], TransportStatus]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    checks: dict[str, ReadinessCheck] = request.app.state.readiness_checks
    probes: dict[str, TransportProbe] = request.app.state.transports
    results = {name: await run_in_threadpool(check) for name, check in checks.items()}
    transports = {name: probe() for name, probe in probes.items()}
    results |= {name: status.ready for name, status in transports.items()}
    ready = all(results.values())
    return JSONResponse(
        {
            "status": "ready" if ready else "not ready",
            "checks": results,
            "transports": {name: status.state for name, status in transports.items()},
        },
        status_code=200 if ready else 503,
    )
