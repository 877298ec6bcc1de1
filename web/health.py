"""Liveness and readiness probes."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])

ReadinessCheck = Callable[[], bool]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    checks: dict[str, ReadinessCheck] = request.app.state.readiness_checks
    results = {name: await run_in_threadpool(check) for name, check in checks.items()}
    ready = all(results.values())
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": results},
        status_code=200 if ready else 503,
    )
