"""Process-wide logging: plain text for a terminal, one JSON object a line for collectors.

Every line is scrubbed of PII as it is formatted, the traceback and the stack with the message: an
exception's text is the client's input often enough (`WebError: The model '13812345678' does not
exist`), and a filter on the message never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from cache.pii import scrub
from settings import LoggingSettings

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def _clean(text: str) -> str:
    """`text` scrubbed of PII, a lone surrogate (from a client's JSON: "\\ud800") written as its
    escape: the stream's UTF-8 encoder would raise on it, and the line would be lost."""
    return scrub(text).encode("utf-8", "backslashreplace").decode("utf-8")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _clean(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": _clean(record.getMessage()),
        }
        if record.exc_info:
            entry["exc"] = _clean(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = _clean(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False)


class ScrubbedHandler(logging.StreamHandler[TextIO]):
    def handleError(self, record: logging.LogRecord) -> None:
        """A record that cannot be formatted (`log.info("%d", text)`) is reported by where it was
        logged: the default report prints its message and arguments as they came, PII and all."""
        error = type(sys.exc_info()[1]).__name__
        with contextlib.suppress(OSError, ValueError):  # stderr closed or gone: nowhere left to say it
            sys.stderr.write(f"--- Logging error: {error} in {record.name} at {record.pathname}:{record.lineno}\n")


class GracefulShutdownTimeout(logging.Filter):
    """uvicorn says ERROR when `server.shutdown_timeout_s` runs out ("Cancel 0 running task(s)"
    included), and again, with a traceback, for each request it cancels then. Connections that
    outlive the timeout are closed and requests still running aborted: what the setting promises,
    not a failure. Said once, as a warning, in our words."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Cancel %s running task(s), timeout graceful shutdown exceeded":
            (running,) = record.args or (0,)
            record.msg = "server.shutdown_timeout_s is over: %s request(s) still running are aborted"
            record.args = (running,)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        # uvicorn cancels a request's task only then.
        cancelled = record.exc_info is not None and isinstance(record.exc_info[1], asyncio.CancelledError)
        return not (cancelled and str(record.msg).startswith("Exception in ASGI application"))


def build_handler(settings: LoggingSettings, stream: TextIO | None = None) -> logging.Handler:
    """The one handler every record goes through, writing to `stream` (stderr by default)."""
    handler = ScrubbedHandler(stream)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter(_TEXT_FORMAT))
    return handler


def configure_logging(settings: LoggingSettings) -> None:
    root = logging.getLogger()
    root.handlers[:] = [build_handler(settings)]
    root.setLevel(settings.level)
    # Libraries that bring their own handlers log through ours instead, once.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "Lark"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.error").addFilter(GracefulShutdownTimeout())
    # Their INFO lines narrate routine work (each migration step, each job run, each HTTP call).
    for name in ("alembic", "apscheduler", "httpx"):
        logging.getLogger(name).setLevel(max(root.level, logging.WARNING))
