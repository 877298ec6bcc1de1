"""Whether the app can take one more turn: 503 while the engine is not running, 429 at once while
it already holds as many as it can.

A turn waits in several places before the engine's queue: the session's lock, the cache lookup,
a merge. So the engine's waiting queue alone never filled under a burst (300 requests waited in
the cache lookup while the engine held a handful). The web layer counts the requests it has
admitted and not yet answered, from `admit` to the end of the response, streams included, and
refuses beyond `api.max_queued_requests` plus what the engine runs at once (`engine.max_num_seqs`):
as many as wait plus as many as run, wherever they wait. The engine's own waiting queue still
counts too: Feishu turns and background summaries fill it without passing here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request

from engine import Engine
from web.deps import ChatManagerDep, SettingsDep
from web.errors import WebError

RETRY_AFTER_QUEUE_FULL_S = 1
RETRY_AFTER_NOT_RUNNING_S = 10


class Admission:
    """The requests admitted and not yet answered; owned by the event loop."""

    def __init__(self) -> None:
        self.in_flight = 0


async def admit(request: Request, chat_manager: ChatManagerDep, settings: SettingsDep) -> AsyncIterator[None]:
    """A dependency with `yield`: FastAPI runs what follows it once the response is sent, the
    stream ended, the client gone or the handler failed, so every admitted request is released."""
    if not chat_manager.engine.is_running():
        raise WebError(
            503,
            "The model is not available: the engine is starting or shutting down, or its server cannot be reached.",
            type="server_error",
            code="model_not_ready",
            headers={"Retry-After": str(RETRY_AFTER_NOT_RUNNING_S)},
        )
    admission: Admission = request.app.state.admission
    if busy := _busy(admission, chat_manager.engine, settings.api.max_queued_requests):
        raise WebError(
            429,
            f"The server is busy: {busy}. Retry shortly.",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_QUEUE_FULL_S)},
        )
    admission.in_flight += 1
    try:
        yield
    finally:
        admission.in_flight -= 1


def _busy(admission: Admission, engine: Engine, max_queued: int) -> str | None:
    limit = max_queued + engine.max_num_seqs
    if admission.in_flight >= limit:
        return f"{admission.in_flight} requests are in flight (api.max_queued_requests + engine.max_num_seqs = {limit})"
    if engine.num_waiting_requests >= max_queued:
        return f"{max_queued} requests wait for the engine (api.max_queued_requests)"
    return None
