"""Whether the engine can take one more request: 503 while it is not running, 429 while its
queue is full."""

from __future__ import annotations

from web.deps import ChatManagerDep, SettingsDep
from web.errors import WebError

RETRY_AFTER_QUEUE_FULL_S = 1
RETRY_AFTER_NOT_RUNNING_S = 10


def admit(chat_manager: ChatManagerDep, settings: SettingsDep) -> None:
    engine = chat_manager.engine
    if not engine.is_running():
        raise WebError(
            503,
            "The model is not loaded: the engine is starting or shutting down.",
            type="server_error",
            code="model_not_ready",
            headers={"Retry-After": str(RETRY_AFTER_NOT_RUNNING_S)},
        )
    limit = settings.api.max_queued_requests
    if engine.num_waiting_requests >= limit:
        raise WebError(
            429,
            f"The engine is busy: {limit} requests are already waiting. Retry shortly.",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_QUEUE_FULL_S)},
        )
