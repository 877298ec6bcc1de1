"""Runs `python app.py` as a real process on a loopback port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support import SHARED_DATA_DIR

ROOT = Path(__file__).resolve().parent.parent


class AppProcess:
    def __init__(self, workdir: Path, port: int, overrides: dict[str, Any] | None = None) -> None:
        self.workdir = workdir
        self.cwd = workdir  # where it is started from
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        config: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": port},
            "storage": {"url": f"sqlite:///{workdir / 'bot.db'}"},
            "engine": {"model": "builtin:tiny-qwen3", "data_dir": str(SHARED_DATA_DIR)},
        }
        for section, values in (overrides or {}).items():
            config.setdefault(section, {}).update(values)
        self.config_path = workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log_path = workdir / "app.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0, *, wait_ready: bool = True) -> AppProcess:
        """Launch; return once `/healthz` answers, and with `wait_ready` once `/readyz` does too
        (the port answers before the model is loaded)."""
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "app.py"), "--config", str(self.config_path)],
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.wait_for("/healthz", timeout_s)
        if wait_ready:
            self.wait_for("/readyz", timeout_s)
        return self

    def wait_for(self, path: str, timeout_s: float = 120.0) -> None:
        """Until `path` answers 200; raises if the app exits first or the time runs out."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"app exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}{path}", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"app did not answer {path} within {timeout_s} s:\n{self.log()}")

    def until_cached(self, question: str, admin_token: str, timeout_s: float = 30.0) -> None:
        """Until the response cache holds an answer to `question`, as it was asked: a turn's answer
        is cached after the turn. Reads the console's API, logged in with `admin_token`."""
        with httpx.Client(base_url=self.base_url, timeout=10) as console:
            assert console.post("/admin/login", data={"token": admin_token}).status_code == 303
            deadline = time.monotonic() + timeout_s
            while True:
                entries = console.get("/admin/api/cache/entries", params={"q": question}).raise_for_status().json()
                if any(entry["question"] == question for entry in entries):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer to {question!r} was cached within {timeout_s} s")
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> tuple[int, float]:
        """Send `sig`; returns the exit code and the seconds it took to exit."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, time.monotonic() - started

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
