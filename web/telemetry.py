"""The figures /metrics serves to Prometheus: HTTP requests, turns by cache level, TTFT and
token histograms, cache, engine and KV-pool figures.

Counters kept elsewhere (ChatManager, ResponseCache, LLMEngine) are read at scrape time by a
collector; the histograms are filled by a ChatManager turn observer. Both cover every channel,
Feishu included."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cache.levels import CacheLevel
from chat import ChatManager, Conversation, TurnResult

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Any token is a valid HTTP method: counting each as its own label grew one counter from 4 to 305
# series in 300 requests. Methods outside RFC 9110's and PATCH are counted as "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


class Telemetry:
    """One registry per app, so several apps in one process (tests) never share figures."""

    def __init__(self, chat_manager: ChatManager) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "clawdbot_http_requests",
            "HTTP requests by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "clawdbot_ttft_seconds",
            "time to the first reply text, per turn",
            ["channel", "cache_level"],
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tokens = Histogram(
            "clawdbot_turn_tokens",
            "tokens per turn, every channel: prompt, prompt served from the prefix cache, completion",
            ["channel", "kind"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(ChatManagerCollector(chat_manager))

    def observe_turn(self, conversation: Conversation, result: TurnResult) -> None:
        """A ChatManager turn observer: every channel's turns land in the histograms."""
        self.ttft.labels(conversation.channel, result.cache_level).observe(result.ttft_s)
        for kind, count in (
            ("prompt", result.prompt_tokens),
            ("cached", result.cached_tokens),
            ("completion", result.completion_tokens),
        ):
            self.tokens.labels(conversation.channel, kind).observe(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class ChatManagerCollector(Collector):
    def __init__(self, chat_manager: ChatManager) -> None:
        self.chat_manager = chat_manager

    def collect(self) -> Iterator[Metric]:
        figures = self.chat_manager.figures()
        turns, cache, engine = figures.turns, figures.cache, figures.engine
        kv = engine.kv_cache

        by_level = CounterMetricFamily("clawdbot_turns", "turns answered, by how", labels=["cache_level"])
        for level, count in turns.by_level.items():
            by_level.add_metric([level], count)
        yield by_level
        yield CounterMetricFamily("clawdbot_compressions", "history compressions", value=turns.compressions)

        lookups = CounterMetricFamily("clawdbot_cache_lookups", "response-cache lookups, by result", labels=["result"])
        for level, count in (
            (CacheLevel.EXACT, cache.hits_exact),
            (CacheLevel.SEMANTIC, cache.hits_semantic),
            (CacheLevel.MISS, cache.misses),
        ):
            lookups.add_metric([level], count)
        yield lookups
        yield GaugeMetricFamily("clawdbot_cache_entries", "response-cache entries", value=cache.entries)
        yield CounterMetricFamily("clawdbot_cache_evictions", "entries evicted for capacity", value=cache.evictions)
        yield CounterMetricFamily("clawdbot_cache_skipped_pii", "lookups skipped for PII", value=cache.skipped_pii)
        yield CounterMetricFamily(
            "clawdbot_cache_over_budget", "lookups missed: not embedded within the budget", value=cache.over_budget
        )
        yield CounterMetricFamily(
            "clawdbot_cache_outrun", "lookups missed: the model began the answer first", value=cache.outrun
        )

        requests = GaugeMetricFamily("clawdbot_engine_requests", "engine requests, by state", labels=["state"])
        requests.add_metric(["running"], engine.requests.running)
        requests.add_metric(["waiting"], engine.requests.waiting)
        yield requests
        yield CounterMetricFamily(
            "clawdbot_engine_generated_tokens", "tokens generated", value=engine.activity.generated_tokens
        )
        drafts = CounterMetricFamily(
            "clawdbot_engine_draft_tokens", "speculative draft tokens, by outcome", labels=["outcome"]
        )
        drafts.add_metric(["proposed"], engine.activity.draft_tokens.proposed)
        drafts.add_metric(["accepted"], engine.activity.draft_tokens.accepted)
        yield drafts
        yield GaugeMetricFamily(
            "clawdbot_engine_batch_size", "mean sequences per step, last minute", value=engine.activity.batch_size.mean
        )
        yield GaugeMetricFamily("clawdbot_kv_pool_usage_ratio", "share of KV blocks in use", value=kv.usage)
        blocks = GaugeMetricFamily("clawdbot_kv_pool_blocks", "KV blocks, by state", labels=["state"])
        for state, count in (("used", kv.blocks_used), ("free", kv.blocks_free), ("cached", kv.blocks_cached)):
            blocks.add_metric([state], count)
        yield blocks
        yield GaugeMetricFamily(
            "clawdbot_prefix_cache_hit_ratio", "prompt tokens found in the prefix cache", value=kv.prefix_hit_rate
        )


class RequestMetrics:
    """Counts every HTTP request by its route template (not the raw path) and method, unknown ones
    bucketed, so the label values are bounded whatever clients send."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            # A route's template; for a mount (/static) the router leaves its path in root_path.
            path = getattr(scope.get("route"), "path", None) or scope.get("root_path") or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.telemetry.requests.labels(path, method, str(status)).inc()
