"""The bot behind Feishu's webhook: encrypted, signed events, and what is refused."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypedDict, Unpack

import httpx
import pytest

from bot.replies import CARDKIT_CARD, INTERRUPTED
from settings import Settings
from storage import Database, EventRepository, ProcessedEvent, utcnow
from tests.bot.bot_support import AppServer, app_settings, final_text
from tests.fakes.events import encrypt, message_event, seal, signature_headers, url_verification
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


def test_a_challenge_is_answered_as_json_whatever_it_holds(app: AppServer) -> None:
    challenge = 'a "quoted" \\ back\\slash </script>\n'
    body = encrypt(url_verification(TOKEN, challenge), ENCRYPT_KEY)
    response = httpx.post(f"{app.base_url}/feishu/events", content=body, headers={"Content-Type": "application/json"})

    assert response.status_code == 200
    assert response.json() == {"challenge": challenge}


def forgery(kind: str) -> tuple[bytes, dict[str, str]]:
    """A request body and headers that must be refused, by what is wrong with them."""
    plain = {"Content-Type": "application/json"}
    event = encrypt(message_event(chat_id="oc_forged", text="hi", token=TOKEN), ENCRYPT_KEY)
    match kind:
        case "unsigned, not JSON":
            return b"{not json", plain
        case "unsigned, bad base64":
            return json.dumps({"encrypt": "%%not base64%%"}).encode(), plain
        case "unsigned, bad padding":
            return seal(os.urandom(31) + b"\x00", ENCRYPT_KEY), plain
        case "unsigned, valid padding, not JSON":
            return seal(b"\xff" * 31 + b"\x01", ENCRYPT_KEY), plain
        case "unsigned, a genuine event":
            return event, plain
        case "unsigned, a challenge with another token":
            return encrypt(url_verification("not-the-token"), ENCRYPT_KEY), plain
        case "forged signature":
            return event, signature_headers(event, ENCRYPT_KEY) | {"X-Lark-Signature": "0" * 64}
        case "timestamp in superscript digits":
            return event, signature_headers(event, ENCRYPT_KEY) | {"X-Lark-Request-Timestamp": "²"}
        case "timestamp of 5,000 digits":
            return event, signature_headers(event, ENCRYPT_KEY, timestamp="9" * 5000)
    raise AssertionError(kind)


FORGERIES = [
    "unsigned, not JSON",
    "unsigned, bad base64",
    "unsigned, bad padding",
    "unsigned, valid padding, not JSON",
    "unsigned, a genuine event",
    "unsigned, a challenge with another token",
    "forged signature",
    "timestamp in superscript digits",
    "timestamp of 5,000 digits",
]


def test_every_refusal_is_answered_alike_and_logged_in_one_line_without_a_traceback(
    app: AppServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    answers = {}
    for kind in FORGERIES:
        body, headers = forgery(kind)
        caplog.clear()
        # Latin-1, as servers decode header bytes: "²" arrives as "²", which str.isdigit() accepts.
        raw_headers = {name.encode(): value.encode("latin-1") for name, value in headers.items()}
        response = httpx.post(f"{app.base_url}/feishu/events", content=body, headers=raw_headers)

        answers[kind] = (response.status_code, response.content)
        assert len([r for r in caplog.records if "feishu webhook: refused" in r.getMessage()]) == 1, kind
        assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()], kind

    assert set(answers.values()) == {(401, b'{"msg":"unauthorized"}')}, answers


def test_an_authentic_event_the_bot_does_not_handle_gets_a_generic_answer(
    app: AppServer, fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    event = message_event(chat_id="oc_other_events", token=TOKEN)
    event["header"]["event_type"] = "im.chat.disbanded_v1"

    response = fake.post_event(f"{app.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY)

    assert response.status_code == 400
    assert response.json() == {"msg": "event not handled"}  # not the SDK's words
    assert "feishu webhook: event not handled" in caplog.text
    assert not [r for r in caplog.records if r.exc_info]


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


def test_a_message_left_unanswered_is_answered_once_by_one_of_two_apps_started_after(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    settings = webhook_settings(tmp_path, fake)
    app = start(settings, fake)
    try:
        # The reply to `lost` fails: no card is shown and its claim is left unfinished.
        lost = message_event(chat_id="oc_lost", text="Did you get this?", token=TOKEN)
        lost_id = lost["event"]["message"]["message_id"]
        fake.fail(f"/messages/{lost_id}/reply")
        assert fake.post_event(f"{app.base_url}/feishu/events", lost, encrypt_key=ENCRYPT_KEY).status_code == 200
        answered_response, answered_id = deliver(fake, app, "oc_lost", "And this?")
        assert answered_response.status_code == 200
        final_text(fake, answered_id)  # one lane per chat: `lost` has been handled
    finally:
        app.stop()
    assert fake.replies_to(lost_id) == []
    old = message_event(chat_id="oc_lost", text="From long ago", token=TOKEN, created_at=time.time() - 700)
    old_id = old["event"]["message"]["message_id"]
    fake.remember(old)
    database = Database(str(settings.storage.url))
    with database.session() as session:
        EventRepository(session).claim(f"feishu:message:{old_id}", timedelta(days=2), utcnow() - timedelta(seconds=700))

    apps = [AppServer(webhook_settings(tmp_path, fake)) for _ in range(2)]  # the same database
    for replica in apps:
        replica.launch()
    try:
        for replica in apps:
            replica.started()  # each has taken its share of the unfinished claims
        assert final_text(fake, lost_id) == apps[0].assistant_texts()[-1]
        wait_for(lambda: claim(database, lost_id).finished_at, what="the claim to be finished")
    finally:
        for replica in apps:
            replica.stop()

    assert len(fake.replies_to(lost_id)) == 1
    assert len([c for c in fake.calls if c.method == "GET" and c.path.endswith(lost_id)]) == 1
    assert len(fake.replies_to(answered_id)) == 1 and claim(database, answered_id).resumed_at is None
    assert fake.replies_to(old_id) == [] and claim(database, old_id).resumed_at is None
    database.close()


def test_a_replica_starting_while_another_answers_leaves_the_message_to_it(tmp_path: Path, fake: FakeFeishu) -> None:
    settings = webhook_settings(tmp_path, fake)
    first = start(settings, fake)
    database = Database(str(settings.storage.url))
    try:
        event = message_event(chat_id="oc_busy", text="Still there?", token=TOKEN)
        message_id = event["event"]["message"]["message_id"]
        reply = f"/messages/{message_id}/reply"
        fake.hold(reply)  # the first replica is answering: its reply waits on Feishu
        assert fake.post_event(f"{first.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY).status_code == 200
        wait_for(lambda: fake.calls_to(reply), what="the first replica to be answering")

        second = start(webhook_settings(tmp_path, fake), fake)  # the same database
        try:
            assert claim(database, message_id).resumed_at is None  # its start left the claim alone
            fake.release(reply)
            final_text(fake, message_id)
            wait_for(lambda: claim(database, message_id).finished_at, what="the claim to be finished")
        finally:
            second.stop()
    finally:
        first.stop()
    assert len(fake.replies_to(message_id)) == 1
    assert not [c for c in fake.calls if c.method == "GET" and c.path.endswith(message_id)]  # never fetched again
    database.close()


def test_a_reply_that_failed_is_answered_again_by_a_running_replica_within_a_lease(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    settings = app_settings(
        tmp_path, fake, mode="webhook", encrypt_key=ENCRYPT_KEY, verification_token=TOKEN, claim_lease_s=1
    )
    app = start(settings, fake)
    database = Database(str(settings.storage.url))
    try:
        time.sleep(2.5)  # long after the start: a pass at start-up alone would not retry it
        event = message_event(chat_id="oc_retry", text="Are you there?", token=TOKEN)
        message_id = event["event"]["message"]["message_id"]
        fake.remember(event)  # what the Open API gives when the message is fetched again
        fake.fail(f"/messages/{message_id}/reply")  # the first answer fails: its claim is given up
        assert fake.post_event(f"{app.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY).status_code == 200
        final_text(fake, message_id)  # answered, with no restart
        wait_for(lambda: claim(database, message_id).finished_at, what="the claim to be finished")
    finally:
        app.stop()
    assert len(fake.replies_to(message_id)) == 1
    assert claim(database, message_id).resumed_at is not None
    database.close()


def test_a_card_left_streaming_is_closed_when_its_message_is_answered_again(tmp_path: Path, fake: FakeFeishu) -> None:
    settings = app_settings(
        tmp_path, fake, mode="webhook", encrypt_key=ENCRYPT_KEY, verification_token=TOKEN, claim_lease_s=1
    )
    app = start(settings, fake)
    database = Database(str(settings.storage.url))
    try:
        event = message_event(chat_id="oc_cut", text="Will you finish?", token=TOKEN)
        message_id = event["event"]["message"]["message_id"]
        fake.remember(event)
        fake.fail("/settings", times=2)  # the card streams, then can be neither finished nor given its error line
        assert fake.post_event(f"{app.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY).status_code == 200
        wait_for(lambda: len(fake.replies_to(message_id)) == 2, what="the answer again, in a card of its own")
        wait_for(lambda: claim(database, message_id).finished_at, what="the claim to be finished")
    finally:
        app.stop()
    cut, answered = fake.replies_to(message_id)
    assert fake.text_of(cut) == INTERRUPTED and not fake.card_of(cut).streaming
    assert fake.text_of(answered) == app.assistant_texts()[-1] and not fake.card_of(answered).streaming
    assert claim(database, message_id).reply_card == CARDKIT_CARD + fake.card_of(answered).card_id
    database.close()


def claim(database: Database, message_id: str) -> ProcessedEvent:
    with database.session() as session:
        found = session.get(ProcessedEvent, f"feishu:message:{message_id}")
        assert found is not None
        return found


def test_without_an_encrypt_key_the_verification_token_decides(tmp_path: Path, fake: FakeFeishu) -> None:
    app = start(app_settings(tmp_path, fake, mode="webhook", verification_token=TOKEN), fake)
    try:
        forged = message_event(chat_id="oc_plain", text="Let me in", token="guessed")
        genuine = message_event(chat_id="oc_plain", text="Hello in plain JSON", token=TOKEN)
        for event in (forged, genuine):
            fake.remember(event)
        url = f"{app.base_url}/feishu/events"

        refused = httpx.post(url, json=forged)
        accepted = httpx.post(url, json=genuine)

        assert (refused.status_code, refused.json()) == (401, {"msg": "unauthorized"})
        assert accepted.status_code == 200
        final_text(fake, genuine["event"]["message"]["message_id"])
        assert fake.replies_to(forged["event"]["message"]["message_id"]) == []
    finally:
        app.stop()
