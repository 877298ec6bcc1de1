"""Composition root: read the config, build the parts, serve them. No logic of its own.

    python app.py [--config PATH]
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI

from logging_setup import configure_logging
from settings import ConfigError, Settings, load_settings
from storage import Database
from storage.maintenance import run_maintenance
from web import health

log = logging.getLogger("clawdbot")

DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"


def build_app(settings: Settings) -> FastAPI:
    db = Database(settings.storage.url, busy_timeout_ms=settings.storage.busy_timeout_ms, echo=settings.storage.echo_sql)
    db.upgrade()

    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(
        run_maintenance,
        "interval",
        seconds=settings.maintenance.interval_s,
        kwargs={"db": db, "session_idle_ttl": timedelta(seconds=settings.sessions.idle_ttl_s)},
        id="maintenance",
        max_instances=1,
        coalesce=True,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        log.info("serving on http://%s:%d", settings.server.host, settings.server.port)
        try:
            yield
        finally:
            scheduler.shutdown(wait=True)
            db.close()
            log.info("stopped cleanly")

    app = FastAPI(title="Clawdbot", lifespan=lifespan)
    app.state.settings = settings
    app.state.db = db
    app.state.readiness_checks = {"database": db.ping}
    app.include_router(health.router)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Clawdbot: a self-hosted Feishu/Lark chatbot on Qwen3.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="settings file (default: config.yaml)")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config if args.config.exists() or args.config != DEFAULT_CONFIG else None)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(settings.logging)
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(settings),
            host=settings.server.host,
            port=settings.server.port,
            log_config=None,
            timeout_graceful_shutdown=settings.server.shutdown_timeout_s,
        )
    )
    # uvicorn re-raises the stop signal after its graceful shutdown, to the handlers that were
    # installed before it ran; a finished shutdown is a clean exit, so those handlers do nothing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
