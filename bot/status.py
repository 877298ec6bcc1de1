"""How Feishu's events reach the bot now, for /readyz and the console."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class TransportState(StrEnum):
    OFF = "off"  # Feishu is not configured
    WEBHOOK = "webhook"  # Feishu posts events; nothing to hold open
    CONNECTING = "connecting"  # the long connection has not been opened yet
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"  # the long connection dropped (or its first try failed); the SDK retries
    STOPPED = "stopped"  # the long connection was closed, or the SDK gave up

    @property
    def ready(self) -> bool:
        return self in (TransportState.OFF, TransportState.WEBHOOK, TransportState.CONNECTED)


@dataclass(frozen=True)
class FeishuStatus:
    state: TransportState
    last_event_at: datetime | None
    """When the last event (a message or a card click) arrived; None: none since the start."""

    @property
    def ready(self) -> bool:
        return self.state.ready
