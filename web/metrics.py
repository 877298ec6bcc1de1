"""GET /metrics: the Prometheus exposition of the app's figures (web/telemetry.py)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from web.deps import TelemetryDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
async def metrics(telemetry: TelemetryDep) -> Response:
    return Response(telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)
