"""Overload: a burst of clients beyond what the app admits, and what it does meanwhile and after.

    python bench/overload.py                       # 128 clients at once against 32 places
    python bench/overload.py --concurrency 300     # the issue's burst

Starts the app with the demo model (as bench/benchmark.py does), stores one answer so that the
cache's shared scope holds a vector (every new question is then embedded), and sends
`--concurrency` requests at once, in turn of five kinds: streamed and read to the end, answered
whole, streamed and abandoned after the first text, abandoned before the answer, and asking for
more tokens than generation.max_reply_tokens (400 expected). The questions are distinct but for
one in eight, a question already cached. Meanwhile /healthz is probed every 50 ms. It reports the
statuses, the 429s and how fast they came, /healthz latency, RSS before and after, the cache
lookup p99 and the embedder's forwards, and how long after the burst the engine had nothing
running or waiting and every KV block free. The last line is JSON; the issue's targets are in
`targets`.

The clients share the app's two cores, so they are kept cheap: the burst goes through aiohttp
(its parser is C; httpx's pool bookkeeping took more CPU than the app's event loop at 300
connections), and /healthz is probed from a process of its own, as a load balancer would, so its
latency is the app's and not the burst client's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from benchmark import DEFAULT_DATA_DIR, DEMO_MODEL, app_process, free_port
from client import ApiClient, Target

KINDS = ("stream", "whole", "stream_abandoned", "whole_abandoned", "over_cap")
CACHED_QUESTION = "What is the capital of France?"
MAX_REPLY_TOKENS = 2048  # generation.max_reply_tokens, as the app is started
ABANDON_AFTER_S = 0.5  # a client that answers nothing by then leaves
HEALTHZ_EVERY_S = 0.05
DRAIN_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    kind: str
    status: int | str  # the HTTP status, or what ended the request on the client's side
    latency_s: float
    retry_after: bool = False


@dataclass
class Burst:
    outcomes: list[Outcome] = field(default_factory=list)
    healthz_s: list[float] = field(default_factory=list)


class HealthzProbe:
    """GET /healthz every HEALTHZ_EVERY_S from a process of its own, a new connection each time,
    while the block runs; `latencies_s` afterwards. The block starts once the process probes."""

    def __init__(self, port: int) -> None:
        # spawned, not forked: a fork of this process would copy its event loop's threads' locks
        context = multiprocessing.get_context("spawn")
        self.latencies_s: list[float] = []
        self._stop = context.Event()
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe, args=(port, self._stop, sender), daemon=True)

    def __enter__(self) -> HealthzProbe:
        self._process.start()
        self._receiver.recv()  # its first probe answered
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.latencies_s = self._receiver.recv()
        self._process.join()


def _probe(port: int, stop: Event, results: Connection) -> None:
    def once() -> float:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        connection.close()
        return time.perf_counter() - started

    once()
    results.send("ready")
    latencies = []
    while not stop.is_set():
        latencies.append(once())
        stop.wait(HEALTHZ_EVERY_S)
    results.send(latencies)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    admin_token = secrets.token_urlsafe(16)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="clawdbot-overload-") as scratch:
        workdir = Path(scratch)
        with app_process(app_config(args, port, workdir), workdir, admin_token) as process:
            target = Target(f"http://127.0.0.1:{port}", admin_token=admin_token)
            summary = asyncio.run(overload(args, target, process.pid, port))
    print(json.dumps(summary))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A burst of clients beyond what the app admits.")
    parser.add_argument("--concurrency", type=int, default=128, help="requests sent at once (default 128)")
    parser.add_argument(
        "--max-queued", type=int, default=16, help="api.max_queued_requests of the app it starts (default 16)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine.max_num_seqs (default 16)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens a completed reply asks for (default 16)")
    parser.add_argument(
        "--lookup-budget-ms", type=int, help="cache.lookup_budget_ms of the app it starts (default: the app's)"
    )
    parser.add_argument("--model", default=DEMO_MODEL, help=f"engine.model (default {DEMO_MODEL})")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="engine.data_dir")
    args = parser.parse_args(argv)
    if min(args.concurrency, args.max_queued, args.max_num_seqs, args.max_tokens) < 1:
        parser.error("--concurrency, --max-queued, --max-num-seqs and --max-tokens must be at least 1")
    return args


def app_config(args: argparse.Namespace, port: int, workdir: Path) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "storage": {"url": f"sqlite:///{workdir / 'overload.db'}"},
        "logging": {"level": "WARNING"},
        "engine": {"model": args.model, "data_dir": str(args.data_dir), "max_num_seqs": args.max_num_seqs},
        "generation": {"temperature": 0, "max_tokens": args.max_tokens, "max_reply_tokens": MAX_REPLY_TOKENS},
        "api": {"max_queued_requests": args.max_queued},
        "limits": {"requests_per_minute": 0},
    } | ({"cache": {"lookup_budget_ms": args.lookup_budget_ms}} if args.lookup_budget_ms else {})


async def overload(args: argparse.Namespace, target: Target, pid: int, port: int) -> dict[str, Any]:
    async with ApiClient(target, args.max_tokens) as client:
        await seed_cache(client)
        before = await stats(client)
        rss_before = rss_mb(pid)
        burst = Burst()
        connector = aiohttp.TCPConnector(limit=0)  # one connection per client, as 300 users would have
        async with aiohttp.ClientSession(target.url, connector=connector) as http:
            with HealthzProbe(port) as probe:
                started = time.perf_counter()
                await asyncio.gather(*(request(http, client.model, i, burst) for i in range(args.concurrency)))
                burst_s = time.perf_counter() - started
        burst.healthz_s = probe.latencies_s
        drained_s = await until_drained(client)
        after = await stats(client)
        rss_after = rss_mb(pid)
    return summarize(args, burst, burst_s, drained_s, before, after, rss_before, rss_after)


async def seed_cache(client: ApiClient) -> None:
    """Caches an answer to CACHED_QUESTION, so the shared scope holds a vector and every other
    question's lookup is embedded. The demo model's answer is cut at max_tokens, and cached as cut:
    it serves the burst's requests for CACHED_QUESTION, which ask for as many tokens."""
    body = {"model": client.model, "messages": [{"role": "user", "content": CACHED_QUESTION}]}
    async with client.http.post(client.url("/v1/chat/completions"), json=body, raise_for_status=True) as response:
        completion = await response.json()
    for _ in range(100):  # the answer is stored after the reply is sent
        if (await stats(client))["cache"]["entries"]:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the seed answer was not cached (finish reason {completion['choices'][0]['finish_reason']})")


async def request(http: aiohttp.ClientSession, model: str, index: int, burst: Burst) -> None:
    kind = KINDS[index % len(KINDS)]
    question = (
        CACHED_QUESTION if index % 8 == 0 else f"Question {index}: how do I renew the certificate of service {index}?"
    )
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": question}]}
    if kind == "over_cap":
        body["max_tokens"] = MAX_REPLY_TOKENS * 50
    started = time.perf_counter()
    try:
        if kind.startswith("stream"):
            status, retry_after = await stream(http, body, abandon=kind == "stream_abandoned")
        else:
            status, retry_after = await whole(http, body, abandon=kind == "whole_abandoned")
    except aiohttp.ClientError as exc:
        status, retry_after = type(exc).__name__, False
    burst.outcomes.append(Outcome(kind, status, time.perf_counter() - started, retry_after))


async def stream(http: aiohttp.ClientSession, body: dict[str, Any], *, abandon: bool) -> tuple[int | str, bool]:
    async with http.post("/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status != 200:
            await response.read()
            return response.status, "Retry-After" in response.headers
        async for line in response.content:
            if abandon and line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
                response.close()  # the connection closes mid-stream
                return "abandoned", False
    return 200, False


async def whole(http: aiohttp.ClientSession, body: dict[str, Any], *, abandon: bool) -> tuple[int | str, bool]:
    try:
        async with asyncio.timeout(ABANDON_AFTER_S if abandon else None):
            async with http.post("/v1/chat/completions", json=body) as response:
                await response.read()
    except TimeoutError:
        return "abandoned", False
    return response.status, "Retry-After" in response.headers


async def until_drained(client: ApiClient) -> float | None:
    """Seconds after the burst until nothing runs or waits in the engine and no KV block is held;
    None if that never happens within DRAIN_TIMEOUT_S."""
    started = time.perf_counter()
    while time.perf_counter() - started < DRAIN_TIMEOUT_S:
        engine = (await stats(client))["engine"]
        if _idle(engine):
            return time.perf_counter() - started
        await asyncio.sleep(0.05)
    return None


def _idle(engine: dict[str, Any]) -> bool:
    requests = engine["requests"]
    return requests["running"] == 0 and requests["waiting"] == 0 and engine["kv_cache"]["blocks_used"] == 0


async def stats(client: ApiClient) -> dict[str, Any]:
    figures: dict[str, Any] = await client.get_json("/admin/api/stats")
    return figures


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return round(int(kilobytes) / 1024, 1)


def summarize(
    args: argparse.Namespace,
    burst: Burst,
    burst_s: float,
    drained_s: float | None,
    before: dict[str, Any],
    after: dict[str, Any],
    rss_before: float,
    rss_after: float,
) -> dict[str, Any]:
    statuses = Counter(str(outcome.status) for outcome in burst.outcomes)
    refused = [outcome for outcome in burst.outcomes if outcome.status == 429]
    over_cap = [outcome for outcome in burst.outcomes if outcome.kind == "over_cap" and outcome.status != 429]
    cache_before, cache_after = before["cache"], after["cache"]
    forwards = cache_after["embed_forwards"] - cache_before["embed_forwards"]
    embedded = cache_after["embedded_texts"] - cache_before["embedded_texts"]
    healthz_ms = np.asarray(burst.healthz_s) * 1000
    summary = {
        "concurrency": args.concurrency,
        "in_flight_limit": args.max_queued + args.max_num_seqs,
        "burst_s": round(burst_s, 2),
        "statuses": dict(sorted(statuses.items())),
        "status_429": len(refused),
        "status_429_with_retry_after": sum(outcome.retry_after for outcome in refused),
        "status_429_max_ms": _ms(max((outcome.latency_s for outcome in refused), default=0.0)),
        "over_cap_400": sum(outcome.status == 400 for outcome in over_cap),
        "over_cap_other": sum(outcome.status != 400 for outcome in over_cap),
        "healthz_probes": int(healthz_ms.size),
        "healthz_p50_ms": _percentile(healthz_ms, 50),
        "healthz_p99_ms": _percentile(healthz_ms, 99),
        "rss_before_mb": rss_before,
        "rss_after_mb": rss_after,
        "cache_lookup_p50_ms": round(cache_after["lookup_ms_p50"], 1),
        "cache_lookup_p99_ms": round(cache_after["lookup_ms_p99"], 1),
        "embed_forwards": forwards,
        "embedded_texts": embedded,
        "drained_s": None if drained_s is None else round(drained_s, 2),
        "after": {
            "running": after["engine"]["requests"]["running"],
            "waiting": after["engine"]["requests"]["waiting"],
            "kv_blocks_used": after["engine"]["kv_cache"]["blocks_used"],
            "kv_blocks_free": after["engine"]["kv_cache"]["blocks_free"],
            "kv_blocks_total": after["engine"]["kv_cache"]["blocks_total"],
        },
    }
    summary["targets"] = {
        "429_within_1s": summary["status_429_max_ms"] < 1000,
        "healthz_p99_under_200ms": summary["healthz_p99_ms"] < 200,
        "kv_free_within_5s": drained_s is not None and drained_s < 5,
        "cache_lookup_p99_under_100ms": summary["cache_lookup_p99_ms"] < 100,
    }
    for name, value in summary.items():
        if name != "targets":
            print(f"{name:>28}: {value}")
    return summary


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _percentile(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values.size else 0.0


if __name__ == "__main__":
    sys.exit(main())
