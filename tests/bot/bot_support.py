"""The app built by `wiring.build_app`, served by uvicorn in this process, and what it answered.

In-process so the model, torch and lark-oapi load once per test session (a `python app.py` start
costs half a minute on two cores); the wiring is `build_app`'s own, the Feishu side is the real
SDK talking to the fake over loopback.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import select

from settings import Settings
from storage import Database, Message
from tests.fakes.feishu import FakeFeishu, SentMessage, wait_for
from tests.support import SHARED_DATA_DIR, free_port
from wiring import build_app

_app_ids = itertools.count(1)


class AppServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = f"http://{settings.server.host}:{settings.server.port}"
        self.app = build_app(settings)
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host=settings.server.host, port=settings.server.port, log_config=None)
        )
        self._thread = threading.Thread(target=self._server.run, name="app-under-test", daemon=True)

    def start(self) -> AppServer:
        self.launch()
        return self.started()

    def launch(self) -> None:
        """Start serving without waiting: for apps that start together."""
        self._thread.start()

    def started(self) -> AppServer:
        wait_for(lambda: self._server.started or not self._thread.is_alive(), 120, what="the app to start")
        assert self._server.started, "the app did not start"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the app did not stop"

    def assistant_texts(self) -> list[str]:
        """Every assistant message the app stored, oldest first."""
        return self.stored_texts("assistant")

    def stored_texts(self, role: str) -> list[str]:
        """Every message of `role` the app stored, oldest first: a user's is what the model was asked."""
        database = Database(str(self.settings.storage.url))
        try:
            with database.session() as session:
                return list(session.scalars(select(Message.text).where(Message.role == role).order_by(Message.id)))
        finally:
            database.close()


def app_settings(
    workdir: Path,
    fake: FakeFeishu,
    *,
    database_url: str | None = None,
    cache: dict[str, Any] | None = None,
    **feishu: Any,
) -> Settings:
    """Settings for an app on the fake, with the built-in demo model; a fresh app_id each time,
    since lark-oapi caches tenant tokens per app_id for the whole process. The database is a
    SQLite file in `workdir` unless `database_url` names one."""
    return Settings.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "storage": {"url": database_url or f"sqlite:///{workdir / 'bot.db'}"},
            "cache": cache or {},
            "engine": {
                "model": "builtin:tiny-qwen3",
                "device": "cpu",
                "data_dir": str(SHARED_DATA_DIR),
                "kv_cache_tokens": 4096,
            },
            "generation": {"max_tokens": 6},
            "feishu": {
                "app_id": f"cli_test_{next(_app_ids)}",
                "app_secret": "secret",
                "domain": fake.domain,
                "stream_interval_ms": 50,
                **feishu,
            },
        }
    )


def final_text(fake: FakeFeishu, message_id: str, timeout_s: float = 30.0) -> str:
    """The text of the bot's answer to `message_id`, once its card(s) stop streaming."""

    def done() -> list[SentMessage]:
        replies = fake.replies_to(message_id)
        finished = replies and all(m.msg_type != "interactive" or not _streaming(fake, m) for m in replies)
        return replies if finished else []

    replies = wait_for(done, timeout_s, what=f"the answer to {message_id}")
    return "".join(fake.text_of(m) for m in replies)


def _streaming(fake: FakeFeishu, message: SentMessage) -> bool:
    return message.content.get("type") == "card" and fake.card_of(message).streaming


def start_connected(settings: Settings, fake: FakeFeishu) -> AppServer:
    """An app on the fake's long connection, once connected: the fake pushes on the newest one."""
    opened = fake.connections_opened
    server = AppServer(settings).start()
    wait_for(lambda: fake.connections_opened > opened, 60, what="the long connection")
    return server


def engine_requests(app: AppServer) -> int:
    """The requests the app's engine has taken so far: finished, running or waiting."""
    figures = app.app.state.chat_manager.engine.figures()
    return sum(figures.activity.finish_reasons.values()) + figures.requests.running + figures.requests.waiting


def pushed(fake: FakeFeishu, event: dict[str, Any]) -> str:
    """Deliver `event` on the long connection; returns its message_id."""
    assert fake.push(event) == 200
    message_id: str = event["event"]["message"]["message_id"]
    return message_id


def webhook_app_settings(workdir: Path, fake: FakeFeishu, **feishu: Any) -> Settings:
    """Settings for an app that takes events by webhook: for a test's own app beside a module's,
    since apps on long connections in one process would share lark-oapi's module-level loop."""
    return app_settings(
        workdir, fake, mode="webhook", encrypt_key="test-encrypt-key", verification_token="test-token", **feishu
    )


def posted(fake: FakeFeishu, app: AppServer, event: dict[str, Any]) -> str:
    """Deliver `event` to the app's webhook, as Feishu does for that app; returns its message_id."""
    feishu = app.settings.feishu
    event["header"]["token"] = feishu.verification_token
    response = fake.post_event(f"{app.base_url}/feishu/events", event, encrypt_key=feishu.encrypt_key)
    assert response.status_code == 200
    message_id: str = event["event"]["message"]["message_id"]
    return message_id
