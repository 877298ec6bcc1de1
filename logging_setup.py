"""Process-wide logging: plain text for a terminal, one JSON object a line for collectors."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from cache.pii import ScrubFilter
from settings import LoggingSettings


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(settings: LoggingSettings) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(ScrubFilter())  # on the handler: it then covers every logger's records
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # Libraries that bring their own handlers log through ours instead, once.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "Lark"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Their INFO lines narrate routine work (each migration step, each job run, each HTTP call).
    for name in ("alembic", "apscheduler", "httpx"):
        logging.getLogger(name).setLevel(max(root.level, logging.WARNING))
