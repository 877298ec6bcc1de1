"""End-to-end benchmark: the app driven through its OpenAI-compatible API, measured by the client.

    python bench/benchmark.py --concurrency 8 --requests 200 --compare --plot bench.png
    python bench/benchmark.py --optimized          # one side (without a flag: the baseline)
    python bench/benchmark.py --url http://127.0.0.1:8000 --admin-token TOKEN   # an app already running
    python bench/benchmark.py --peer transformers-serve   # our app against `transformers serve`
    python bench/benchmark.py --remote     # the engine in the app, then behind HTTP in a second app

The workload (bench/workload.yaml, or --workload FILE) is sent by `--concurrency` clients at
once, streaming: FAQ questions, paraphrases, bursts of one question asked at the same moment,
multi-turn conversations and long ones that outgrow the prompt budget. `--compare` starts the
app twice with the same model, workload and max_tokens: the baseline without response cache,
merging, prefix cache, speculative decoding and compression, with static sampling; then the
optimized side with all of them. It prints the figures side by side with their ratios, then the seed articles' claims
beside ours; the last line is JSON with every figure. `--peer transformers-serve` runs
`transformers serve --continuous-batching`, then the optimized app, on the same checkpoint, with the
same KV blocks and token budget, on bench/peer_workload.yaml (conversations no cache can help)
unless --workload names another. `--remote` runs the optimized app, then the same app with
`engine.backend: remote` against a second app process serving its engine on /v1/completions: what
the HTTP hop between a bot replica and its engine box costs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml
from client import ApiClient, RequestFailed, Target
from report import Figures, Run, Sample, as_json, claims, claims_table, ratios, table
from tqdm import tqdm
from workload import Script, Workload, build_scripts, load_workload

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the app's engine, for --peer
DEFAULT_WORKLOAD = Path(__file__).with_name("workload.yaml")
PEER_WORKLOAD = Path(__file__).with_name("peer_workload.yaml")
PEER = "transformers serve"
DEFAULT_DATA_DIR = Path(tempfile.gettempdir()) / "clawdbot-bench-data"
DEMO_MODEL = "builtin:tiny-qwen3"
# A prompt budget no conversation reaches: the app has no switch for compression itself.
NO_COMPRESSION_BUDGET = 10**9
WARM_UP = [{"role": "user", "content": "Benchmark warm-up: say hello."}]

PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "baseline": {
        "cache": {"enabled": False},
        "engine": {"enable_prefix_caching": False, "num_speculative_tokens": 0},
        "context": {"max_prompt_tokens": NO_COMPRESSION_BUDGET},
        # Qwen3's recommended sampling without thinking, the same top-k at every position.
        "generation": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "dynamic_top_k": False, "merge_requests": False},
    },
    "optimized": {
        "cache": {"enabled": True},
        "engine": {"enable_prefix_caching": True, "num_speculative_tokens": 4},
        "generation": {"temperature": 0.0, "dynamic_top_k": True, "merge_requests": True},
    },
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = load_workload(args.workload)
    scripts = build_scripts(workload, args.requests, max_copies=args.concurrency)
    if args.url:
        target = Target(args.url.rstrip("/"), args.api_key, args.admin_token)
        runs = [asyncio.run(measure("target", target, scripts, workload.max_tokens, args.concurrency))]
    elif args.peer:
        # The peer first: the ratio column is then ours to the peer's.
        runs = [run_peer(args, workload, scripts), run_side("optimized", args, workload, scripts)]
    elif args.remote:
        runs = [run_side("optimized", args, workload, scripts), run_remote(args, workload, scripts)]
    else:
        sides = ["baseline", "optimized"] if args.compare else ["optimized" if args.optimized else "baseline"]
        runs = [run_side(side, args, workload, scripts) for side in sides]
    figures = {run.label: Figures.of(run) for run in runs}
    report(args, workload, figures)
    if args.plot:
        from plot import plot  # matplotlib only when a plot is asked for

        plot(args.plot, runs)
    failed = [error for run in runs for error in run.errors]
    for error in failed[:5]:
        print(f"failed: {error}", file=sys.stderr)
    return 1 if failed else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="End-to-end benchmark through the OpenAI-compatible API.")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    parser.add_argument("--requests", type=int, default=200, help="requests to send per side (default 200)")
    side = parser.add_mutually_exclusive_group()
    side.add_argument("--optimized", action="store_true", help="run the optimized side only")
    side.add_argument("--compare", action="store_true", help="run the baseline, then the optimized side")
    side.add_argument(
        "--peer", choices=["transformers-serve"], help="run this server, then the optimized side, on the same model"
    )
    side.add_argument(
        "--remote", action="store_true", help="run the optimized side, then it again with its engine behind HTTP"
    )
    parser.add_argument(
        "--workload",
        type=Path,
        help=f"traffic description (YAML; default {DEFAULT_WORKLOAD.name}, with --peer {PEER_WORKLOAD.name})",
    )
    parser.add_argument("--plot", type=Path, help="write latency distributions and hit rates to this PNG")
    parser.add_argument(
        "--model", default=DEMO_MODEL, help=f"engine.model for the app it starts (default {DEMO_MODEL})"
    )
    parser.add_argument(
        "--data-dir",
        type=lambda path: Path(path).resolve(),  # the app and the peer run in folders of their own
        default=DEFAULT_DATA_DIR,
        help="engine.data_dir for the app it starts",
    )
    parser.add_argument(
        "--url",
        help="benchmark an app already running at this URL, as it is configured "
        "(set its limits.requests_per_minute to 0: every request comes from one client)",
    )
    parser.add_argument("--api-key", default=os.environ.get("CLAWDBOT_API_KEY", ""), help="with --url: the API key")
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("CLAWDBOT_ADMIN_TOKEN", ""),
        help="with --url: the admin token, to read the app's counters (engine requests, cache hits, tokens)",
    )
    args = parser.parse_args(argv)
    if args.url and (args.optimized or args.compare or args.peer or args.remote):
        parser.error(
            "--url measures the app as it is configured; --optimized, --compare, --peer and --remote start their own"
        )
    args.workload = args.workload or (PEER_WORKLOAD if args.peer else DEFAULT_WORKLOAD)
    if args.concurrency < 1 or args.requests < 1:
        parser.error("--concurrency and --requests must be at least 1")
    return args


# --- the app ----------------------------------------------------------------------------------


def app_config(side: str, args: argparse.Namespace, workload: Workload, port: int, workdir: Path) -> dict[str, Any]:
    """The workload's server settings, then the run's own, then the side's switches."""
    run: dict[str, dict[str, Any]] = {
        "server": {"host": "127.0.0.1", "port": port},
        "storage": {"url": f"sqlite:///{workdir / 'bench.db'}"},
        "logging": {"level": "WARNING"},
        "engine": {"model": args.model, "data_dir": str(args.data_dir)},
        "generation": {"max_tokens": workload.max_tokens},
        "limits": {"requests_per_minute": 0},
    }
    config: dict[str, dict[str, Any]] = {}
    for layer in (workload.server, run, PROFILES[side]):
        for section, values in layer.items():
            config.setdefault(section, {}).update(values)
    return config


@contextmanager
def app_process(
    config: dict[str, Any], workdir: Path, admin_token: str, timeout_s: float = 600
) -> Iterator[subprocess.Popen[bytes]]:
    """`python app.py` with this config, until /readyz answers (the model is loaded); stopped on exit."""
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    # Secrets from the caller's environment would override the file: no Feishu, an open API.
    env = {"CLAWDBOT_ADMIN_TOKEN": admin_token, "CLAWDBOT_API_KEY": "", "FEISHU_APP_ID": ""}
    command = [sys.executable, str(ROOT / "app.py"), "--config", str(config_path)]
    url = f"http://127.0.0.1:{config['server']['port']}/readyz"
    with server_process(command, env, workdir, url, timeout_s) as process:
        yield process


@contextmanager
def server_process(
    command: list[str], env: dict[str, str], workdir: Path, ready_url: str, timeout_s: float
) -> Iterator[subprocess.Popen[bytes]]:
    """A server started with `command`, once `ready_url` answers 200; stopped with SIGINT on exit."""
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        _wait_ready(process, ready_url, timeout_s, log_path)
        yield process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s:\n{_tail(log_path)}")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:]


def peak_rss_mb(pid: int) -> float:
    """The high-water mark of resident memory of the process and of its children (the app's
    engine process), summed: an upper bound where they peak at different times (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    children = (Path(f"/proc/{pid}/task/{tid}/children").read_text().split() for tid in os.listdir(f"/proc/{pid}/task"))
    return int(kilobytes) / 1024 + sum(peak_rss_mb(int(child)) for listed in children for child in listed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_side(side: str, args: argparse.Namespace, workload: Workload, scripts: list[Script]) -> Run:
    admin_token = secrets.token_urlsafe(16)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"clawdbot-bench-{side}-") as scratch:
        workdir = Path(scratch)
        with app_process(app_config(side, args, workload, port, workdir), workdir, admin_token) as process:
            target = Target(f"http://127.0.0.1:{port}", admin_token=admin_token)
            run = asyncio.run(measure(side, target, scripts, workload.max_tokens, args.concurrency))
            return dataclasses.replace(run, peak_rss_mb=peak_rss_mb(process.pid))


def run_remote(args: argparse.Namespace, workload: Workload, scripts: list[Script]) -> Run:
    """The optimized side as two processes on this machine: the bot, its engine on another app's
    /v1/completions. The peak memory is both processes'."""
    engine_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="clawdbot-bench-remote-") as scratch:
        engine_dir, bot_dir = Path(scratch, "engine"), Path(scratch, "bot")
        engine_dir.mkdir()
        bot_dir.mkdir()
        engine_box = app_config("optimized", args, workload, engine_port, engine_dir)
        engine_box["cache"] = {"enabled": False}  # its /v1/completions never reads the response cache
        bot = app_config("optimized", args, workload, port, bot_dir)
        bot["engine"] |= {"backend": "remote", "remote_url": f"http://127.0.0.1:{engine_port}", "tokenizer": args.model}
        admin_token = secrets.token_urlsafe(16)
        with (
            app_process(engine_box, engine_dir, secrets.token_urlsafe(16)) as engine_process,
            app_process(bot, bot_dir, admin_token) as process,
        ):
            target = Target(f"http://127.0.0.1:{port}", admin_token=admin_token)
            run = asyncio.run(measure("remote", target, scripts, workload.max_tokens, args.concurrency))
            peak_mb = peak_rss_mb(process.pid) + peak_rss_mb(engine_process.pid)
            return dataclasses.replace(run, peak_rss_mb=peak_mb)


def run_peer(args: argparse.Namespace, workload: Workload, scripts: list[Script]) -> Run:
    """`transformers serve --continuous-batching` on the checkpoint the app ran, with the app's
    engine defaults: 16-token KV blocks, 16,384 KV tokens, 2,048 tokens a step, fp32 on CPU."""
    from engine import EngineConfig
    from engine.checkpoints import resolve_checkpoint  # torch: only when a peer is run

    checkpoint = resolve_checkpoint(args.model, args.data_dir)
    engine = EngineConfig()
    port = free_port()
    command = [
        *("transformers", "serve", str(checkpoint.path), "--continuous-batching"),
        *("--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--reasoning", "off"),
        *(
            "--cb-block-size",
            str(engine.block_size),
            "--cb-num-blocks",
            str(engine.kv_cache_tokens // engine.block_size),
        ),
        *("--cb-max-batch-tokens", str(engine.max_num_batched_tokens)),
    ]
    with tempfile.TemporaryDirectory(prefix="clawdbot-bench-peer-") as scratch:
        url = f"http://127.0.0.1:{port}"
        with server_process(command, {}, Path(scratch), f"{url}/health", timeout_s=600) as process:
            run = asyncio.run(measure(PEER, Target(url), scripts, workload.max_tokens, args.concurrency))
            return dataclasses.replace(run, peak_rss_mb=peak_rss_mb(process.pid))


# --- the load ---------------------------------------------------------------------------------


class Slots:
    """At most `size` requests in flight. A burst takes its slots together, so its requests leave
    at the same moment; callers are served in arrival order."""

    def __init__(self, size: int) -> None:
        self._free = asyncio.Semaphore(size)
        self._queue = asyncio.Lock()

    async def acquire(self, count: int) -> None:
        async with self._queue:
            for _ in range(count):
                await self._free.acquire()

    def release(self) -> None:
        self._free.release()


class Load:
    """Sends the scripts, each conversation turn after turn, and records what the client sees."""

    def __init__(self, client: ApiClient, concurrency: int, progress: tqdm) -> None:
        self.client = client
        self.slots = Slots(concurrency)
        self.progress = progress
        self.samples: list[Sample] = []
        self.errors: list[str] = []

    async def run(self, scripts: list[Script]) -> None:
        await asyncio.gather(*(self._script(script) for script in scripts))

    async def _script(self, script: Script) -> None:
        transcripts: list[list[dict[str, str]]] = [[] for _ in range(script.copies)]
        for text in script.turns:
            await self.slots.acquire(script.copies)
            answered = await asyncio.gather(*(self._turn(script, transcript, text) for transcript in transcripts))
            if not all(answered):
                return  # a conversation cannot go on without the reply it builds on

    async def _turn(self, script: Script, transcript: list[dict[str, str]], text: str) -> bool:
        transcript.append({"role": "user", "content": text})
        try:
            reply = await self.client.chat(transcript)
        except (RequestFailed, aiohttp.ClientError) as exc:
            self.errors.append(f"{script.kind}: {exc!r}")
            return False
        finally:
            self.slots.release()
            self.progress.update()
        transcript.append({"role": "assistant", "content": reply.text})
        self.samples.append(
            Sample(
                script.kind,
                reply.ttft_s,
                reply.latency_s,
                reply.prompt_tokens,
                reply.cached_tokens,
                reply.completion_tokens,
            )
        )
        return True


async def measure(label: str, target: Target, scripts: list[Script], max_tokens: int, concurrency: int) -> Run:
    """The counters are read after a warm-up request and again at the end: the run's own are the difference."""
    async with ApiClient(target, max_tokens) as client:
        await client.chat(WARM_UP)
        before = await client.counters()
        with tqdm(total=sum(s.requests for s in scripts), desc=label, unit="req", file=sys.stderr) as progress:
            load = Load(client, concurrency, progress)
            started = time.perf_counter()
            await load.run(scripts)
            wall_s = time.perf_counter() - started
        after = await client.counters()
    counters = after - before if after is not None and before is not None else None
    return Run(label, load.samples, load.errors, wall_s, counters, peak_rss_mb=None)


# --- the report -------------------------------------------------------------------------------


def report(args: argparse.Namespace, workload: Workload, figures: dict[str, Figures]) -> None:
    app = args.url or args.model
    print(
        f"workload {args.workload.name}: {args.requests} requests, concurrency {args.concurrency}, "
        f"max_tokens {workload.max_tokens}, {app}"
    )
    print(table(figures))
    summary: dict[str, Any] = {
        "workload": str(args.workload),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": workload.max_tokens,
        "app": app,
        **{label: as_json(f) for label, f in figures.items()},
    }
    if len(figures) == 2:
        before, after = figures.values()
        summary["ratios"] = {name: round(r, 3) if r is not None else None for name, r in ratios(before, after).items()}
    if "remote" in figures:
        local, remote = figures["optimized"], figures["remote"]
        summary["http_hop"] = {
            "requests_per_s_ratio": round(remote.requests_per_s / local.requests_per_s, 3),
            "output_tokens_per_s_ratio": round(remote.output_tokens_per_s / local.output_tokens_per_s, 3),
            "ttft_ms_p50_added": round(remote.ttft_ms_p50 - local.ttft_ms_p50, 1),
        }
        print(f"\nthe HTTP hop: {summary['http_hop']}")
    if "baseline" in figures and "optimized" in figures:
        print()
        print(claims_table(figures["baseline"], figures["optimized"]))
        summary["claims"] = claims(figures["baseline"], figures["optimized"])
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
