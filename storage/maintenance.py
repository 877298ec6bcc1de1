"""The periodic clean-up job: expired dedup keys and followed threads go, idle sessions close."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from storage.db import Database
from storage.models import utcnow
from storage.repositories import EventRepository, SessionRepository, ThreadRepository

log = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    purged_events: int = 0
    purged_threads: int = 0
    closed_session_keys: list[str] = field(default_factory=list)


def run_maintenance(db: Database, *, session_idle_ttl: timedelta, now: datetime | None = None) -> MaintenanceReport:
    now = now or utcnow()
    with db.session() as session:
        report = MaintenanceReport(
            purged_events=EventRepository(session).purge_expired(now),
            purged_threads=ThreadRepository(session).purge_expired(now),
            closed_session_keys=SessionRepository(session).close_idle(now - session_idle_ttl),
        )
    if report.purged_events or report.purged_threads or report.closed_session_keys:
        log.info(
            "maintenance: purged %d expired event keys and %d followed threads, closed %d idle sessions",
            report.purged_events,
            report.purged_threads,
            len(report.closed_session_keys),
        )
    return report
