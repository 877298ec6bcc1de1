"""How fast `python app.py` answers: `--help`, a config error, the first `/healthz`, the first
200 from `/readyz` (model loaded), and stopping on SIGINT.

    python bench/startup_bench.py [--runs 3] [--model builtin:smollm2-135m-instruct] [--data-dir data]

Each run is a fresh process on a fresh database; the model (and its data folder) is the one a
user's first start would have written already. Prints each run, the medians, and a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def seconds_to_exit(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, cwd=ROOT, timeout=60)
    return time.perf_counter() - started


def seconds_until(url: str, process: subprocess.Popen[bytes], started: float) -> float:
    while process.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"app exited with {process.returncode} before {url} answered")


def one_run(workdir: Path, model: str, data_dir: Path) -> dict[str, float]:
    bad_config = workdir / "bad.yaml"
    bad_config.write_text("server:\n  port: not-a-port\n", encoding="utf-8")
    port = free_port()
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server": {"host": "127.0.0.1", "port": port},
                "storage": {"url": f"sqlite:///{workdir / 'bot.db'}"},
                "engine": {"model": model, "data_dir": str(data_dir)},
            }
        ),
        encoding="utf-8",
    )
    figures = {"help_s": seconds_to_exit("--help"), "config_error_s": seconds_to_exit("--config", str(bad_config))}
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--config", str(config)],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        figures["healthz_s"] = seconds_until(f"http://127.0.0.1:{port}/healthz", process, started)
        figures["readyz_s"] = seconds_until(f"http://127.0.0.1:{port}/readyz", process, started)
        stopping = time.perf_counter()
        process.send_signal(signal.SIGINT)
        process.wait(60)
        figures["stop_s"] = time.perf_counter() - stopping
    finally:
        if process.poll() is None:
            process.kill()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--model", default="builtin:smollm2-135m-instruct", help="the model `python app.py` loads by default"
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    args = parser.parse_args()
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory() as workdir:
            figures = one_run(Path(workdir), args.model, args.data_dir.resolve())
        runs.append(figures)
        print(f"run {index + 1}: " + ", ".join(f"{name} {value:.2f}" for name, value in figures.items()))
    medians = {name: round(statistics.median(run[name] for run in runs), 2) for name in runs[0]}
    print("medians: " + ", ".join(f"{name} {value:.2f} s" for name, value in medians.items()))
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
