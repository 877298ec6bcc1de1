"""The bot behind Feishu's webhook: encrypted, signed events, and what is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict, Unpack

import httpx
import pytest

from settings import Settings
from tests.bot.bot_support import AppServer, app_settings, final_text
from tests.fakes.events import encrypt, message_event, url_verification
from tests.fakes.feishu import FakeFeishu, wait_for

ENCRYPT_KEY = "test-encrypt-key"
TOKEN = "test-verification-token"


def webhook_settings(workdir: Path, fake: FakeFeishu) -> Settings:
    return app_settings(workdir, fake, mode="webhook", encrypt_key=ENCRYPT_KEY, verification_token=TOKEN)


def start(settings: Settings, fake: FakeFeishu) -> AppServer:
    calls = len(fake.calls_to("/bot/v3/info"))
    server = AppServer(settings).start()
    wait_for(lambda: len(fake.calls_to("/bot/v3/info")) > calls, 30, what="the bot to ask who it is")
    return server


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    server = start(webhook_settings(tmp_path_factory.mktemp("webhook"), fake), fake)
    yield server
    server.stop()


class Signing(TypedDict, total=False):
    """FakeFeishu.post_event's signing options; a test forges some of them."""

    encrypt_key: str
    timestamp: int
    signature: str


def deliver(
    fake: FakeFeishu, app: AppServer, chat_id: str, text: str = "A question over HTTP", **signing: Unpack[Signing]
) -> tuple[httpx.Response, str]:
    """Post an encrypted, signed message event to the app's webhook; returns the answer and the message_id."""
    delivered = message_event(chat_id=chat_id, text=text, token=TOKEN)
    signing.setdefault("encrypt_key", ENCRYPT_KEY)
    response = fake.post_event(f"{app.base_url}/feishu/events", delivered, **signing)
    return response, delivered["event"]["message"]["message_id"]


def test_the_url_verification_challenge_is_answered(app: AppServer) -> None:
    body = encrypt(url_verification(TOKEN, "challenge-42"), ENCRYPT_KEY)
    response = httpx.post(f"{app.base_url}/feishu/events", content=body, headers={"Content-Type": "application/json"})

    assert response.status_code == 200
    assert response.json() == {"challenge": "challenge-42"}


def test_an_encrypted_signed_event_is_accepted_at_once_and_answered(app: AppServer, fake: FakeFeishu) -> None:
    started = time.monotonic()
    response, message_id = deliver(fake, app, "oc_webhook")

    assert response.status_code == 200
    assert time.monotonic() - started < 1.0
    assert final_text(fake, message_id) == app.assistant_texts()[-1]


@pytest.mark.parametrize(
    "signing",
    [
        pytest.param({"signature": "0" * 64}, id="forged signature"),
        pytest.param({"timestamp": int(time.time()) - 301}, id="stale timestamp"),
        pytest.param({"encrypt_key": "not-the-key"}, id="signed with another key"),
    ],
)
def test_an_unauthentic_request_gets_401_and_no_answer(
    app: AppServer, fake: FakeFeishu, caplog: pytest.LogCaptureFixture, signing: Signing
) -> None:
    response, refused = deliver(fake, app, "oc_refused", **signing)

    assert response.status_code == 401
    assert "feishu webhook: refused" in caplog.text
    # Once a genuine message after it in the same chat is answered, the refused one would have been.
    final_text(fake, deliver(fake, app, "oc_refused")[1])
    assert fake.replies_to(refused) == []


def test_a_redelivery_after_a_restart_is_not_answered_again(tmp_path: Path, fake: FakeFeishu) -> None:
    settings = webhook_settings(tmp_path, fake)
    app = start(settings, fake)
    try:
        delivered = message_event(chat_id="oc_restart", text="Are you new here?", token=TOKEN)
        message_id = delivered["event"]["message"]["message_id"]
        assert fake.post_event(f"{app.base_url}/feishu/events", delivered, encrypt_key=ENCRYPT_KEY).status_code == 200
        final_text(fake, message_id)
    finally:
        app.stop()

    app = start(settings, fake)  # the same database, port and app
    try:
        assert fake.post_event(f"{app.base_url}/feishu/events", delivered, encrypt_key=ENCRYPT_KEY).status_code == 200
        final_text(fake, deliver(fake, app, "oc_restart")[1])
    finally:
        app.stop()
    assert len(fake.replies_to(message_id)) == 1
