"""What the user sees around an answer: the typing reaction, the card's buttons and their clicks
(over the long connection and the webhook), and the transport's health in /readyz and the console."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from bot.card_actions import NEW_SESSION, REGENERATE
from settings import AdminSettings
from storage import ChatSession, Database
from tests.bot.bot_support import AppServer, app_settings, final_text, start_connected
from tests.fakes.events import card_action_event, message_event
from tests.fakes.feishu import FakeFeishu, SentMessage, wait_for

ENCRYPT_KEY = "actions-encrypt-key"
TOKEN = "actions-verification-token"
ADMIN_TOKEN = "actions-admin-token"


@pytest.fixture(scope="module")
def longconn_app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    settings = app_settings(tmp_path_factory.mktemp("actions-longconn"), fake)
    server = start_connected(settings.model_copy(update={"admin": AdminSettings(token=ADMIN_TOKEN)}), fake)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def webhook_app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    settings = app_settings(
        tmp_path_factory.mktemp("actions-webhook"),
        fake,
        mode="webhook",
        encrypt_key=ENCRYPT_KEY,
        verification_token=TOKEN,
        typing_reaction=False,
    )
    calls = len(fake.calls_to("/bot/v3/info"))
    server = AppServer(settings).start()
    wait_for(lambda: len(fake.calls_to("/bot/v3/info")) > calls, 30, what="the bot to ask who it is")
    yield server
    server.stop()


@dataclass
class Bot:
    """An app under test and the way Feishu reaches it."""

    app: AppServer
    fake: FakeFeishu
    webhook: bool

    def ask(self, text: str, chat_id: str) -> str:
        """Send the bot a private message; returns its message_id."""
        event = message_event(chat_id=chat_id, text=text, token=TOKEN)
        if self.webhook:
            self._post(event)
        else:
            assert self.fake.push(event) == 200
        return str(event["event"]["message"]["message_id"])

    def click(self, event: dict[str, Any]) -> dict[str, Any]:
        """Deliver a card click; returns the callback's answer."""
        return self._post(event) if self.webhook else self.fake.push_callback(event)

    def _post(self, event: dict[str, Any]) -> dict[str, Any]:
        response = self.fake.post_event(f"{self.app.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture
def longconn(longconn_app: AppServer, fake: FakeFeishu) -> Bot:
    return Bot(longconn_app, fake, webhook=False)


@pytest.fixture(params=["long connection", "webhook"])
def bot(request: pytest.FixtureRequest, fake: FakeFeishu) -> Bot:
    webhook = request.param == "webhook"
    app: AppServer = request.getfixturevalue("webhook_app" if webhook else "longconn_app")
    return Bot(app, fake, webhook)


def answered(fake: FakeFeishu, question_id: str) -> SentMessage:
    """The bot's (last) answer card to `question_id`, once it is finished."""
    final_text(fake, question_id)
    return fake.replies_to(question_id)[-1]


def click_on(fake: FakeFeishu, reply: SentMessage, action: str, chat_id: str) -> dict[str, Any]:
    """A `card.action.trigger` callback for a click on the reply card's `action` button."""
    (value,) = [
        b["behaviors"][0]["value"] for b in fake.buttons_of(reply) if b["behaviors"][0]["value"]["action"] == action
    ]
    return card_action_event(value=value, chat_id=chat_id, card_message_id=reply.message_id, token=TOKEN)


def sessions_of(app: AppServer, chat_id: str) -> int:
    database = Database(str(app.settings.storage.url))
    try:
        with database.session() as session:
            return session.scalar(select(func.count()).where(ChatSession.key == f"feishu:{chat_id}")) or 0
    finally:
        database.close()


def readiness(app: AppServer) -> tuple[int, str]:
    response = httpx.get(f"{app.base_url}/readyz", timeout=10)
    return response.status_code, response.json()["transports"]["feishu"]


# --- the typing reaction ---------------------------------------------------------------------------


def test_the_typing_reaction_is_on_the_question_while_it_is_answered(longconn: Bot, fake: FakeFeishu) -> None:
    question = longconn.ask("What is a token?", "oc_typing")
    reply = answered(fake, question)

    (reaction,) = fake.reactions_on(question)
    assert reaction.emoji_type == "Typing"
    wait_for(lambda: reaction.removed, what="the typing reaction to go")
    paths = [call.path for call in list(fake.calls)]
    added = paths.index(f"/open-apis/im/v1/messages/{question}/reactions")
    removed = paths.index(f"/open-apis/im/v1/messages/{question}/reactions/{reaction.reaction_id}")
    card_closed = max(i for i, path in enumerate(paths) if path.endswith(f"{fake.card_of(reply).card_id}/settings"))
    assert added < card_closed < removed


def test_a_failing_reaction_call_does_not_fail_the_answer(
    longconn: Bot, fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.fail("/reactions")
    question = longconn.ask("Still answering?", "oc_typing_fails")

    assert final_text(fake, question)
    assert fake.reactions_on(question) == []
    assert f"no typing reaction on message {question}" in caplog.text


def test_a_reaction_call_that_hangs_does_not_hold_the_answer(longconn: Bot, fake: FakeFeishu) -> None:
    fake.hold("/reactions")
    try:
        question = longconn.ask("Are you stuck?", "oc_typing_hangs")
        assert final_text(fake, question)
        assert fake.calls_to(f"/messages/{question}/reactions") and fake.reactions_on(question) == []
    finally:
        fake.release("/reactions")


def test_with_typing_reaction_off_the_question_gets_none(webhook_app: AppServer, fake: FakeFeishu) -> None:
    question = Bot(webhook_app, fake, webhook=True).ask("Quietly, please.", "oc_no_typing")

    assert final_text(fake, question)
    assert fake.calls_to(f"/messages/{question}/reactions") == []


# --- the card's buttons ----------------------------------------------------------------------------


def test_the_answer_card_ends_with_the_two_buttons(bot: Bot) -> None:
    question = bot.ask("Tell me something.", f"oc_buttons_{bot.webhook}")

    buttons = bot.fake.buttons_of(answered(bot.fake, question))

    assert [button["text"]["content"] for button in buttons] == ["New session", "Regenerate"]
    values = [button["behaviors"][0]["value"] for button in buttons]
    assert [value["action"] for value in values] == [NEW_SESSION, REGENERATE]
    assert {value["question_id"] for value in values} == {question}


def test_a_patched_card_ends_with_the_buttons_too(longconn: Bot, fake: FakeFeishu) -> None:
    fake.refuse_cardkit = True
    question = longconn.ask("And without CardKit?", "oc_buttons_patched")

    (reply,) = wait_for(lambda: fake.replies_to(question), what="the answer")
    buttons = wait_for(lambda: fake.buttons_of(reply), what="the card's last patch")
    assert [button["text"]["content"] for button in buttons] == ["New session", "Regenerate"]


def test_new_session_starts_one_session_even_if_the_click_is_delivered_twice(bot: Bot) -> None:
    chat = f"oc_new_session_{bot.webhook}"
    click = click_on(bot.fake, answered(bot.fake, bot.ask("Remember the number 7.", chat)), NEW_SESSION, chat)

    answers = [bot.click(click), bot.click(click)]  # Feishu redelivers what it thinks was not acknowledged
    final_text(bot.fake, bot.ask("/stats", chat))  # one lane per chat: both clicks have been handled

    assert answers == [{"toast": {"type": "info", "content": "Starting a new conversation."}}] * 2
    assert sessions_of(bot.app, chat) == 2  # the one the click closed and the one /stats opened


def test_regenerate_answers_the_question_again_once_even_if_the_click_is_delivered_twice(bot: Bot) -> None:
    chat = f"oc_regenerate_{bot.webhook}"
    question = bot.ask("Name a colour.", chat)
    first = answered(bot.fake, question)
    click = click_on(bot.fake, first, REGENERATE, chat)

    answers = [bot.click(click), bot.click(click)]
    final_text(bot.fake, bot.ask("And another?", chat))  # one lane per chat: both clicks have been handled

    assert answers == [{"toast": {"type": "info", "content": "Answering the question again."}}] * 2
    assert bot.app.stored_texts("user").count("Name a colour.") == 2  # asked, and asked again once
    again = [reply for reply in bot.fake.replies_to(question) if reply is not first]
    assert len(again) == 1
    assert final_text(bot.fake, question)  # the new answer is finished too
    assert bot.fake.buttons_of(again[0])


# --- the transport's health ------------------------------------------------------------------------


def test_readyz_is_not_ready_while_the_long_connection_is_down(longconn: Bot, fake: FakeFeishu) -> None:
    assert readiness(longconn.app) == (200, "connected")

    fake.refuse_connections = True
    fake.drop_connections()
    wait_for(lambda: readiness(longconn.app) == (503, "reconnecting"), 15, what="/readyz to see the loss")
    fake.refuse_connections = False
    wait_for(lambda: readiness(longconn.app) == (200, "connected"), 30, what="/readyz to see the reconnect")

    assert final_text(fake, longconn.ask("Back again?", "oc_reconnected"))


def test_readyz_reports_the_webhook_as_ready(webhook_app: AppServer) -> None:
    assert readiness(webhook_app) == (200, "webhook")


def test_the_console_shows_the_transport_and_the_last_event(longconn: Bot, fake: FakeFeishu) -> None:
    final_text(fake, longconn.ask("Anyone there?", "oc_console"))
    with httpx.Client(base_url=longconn.app.base_url, timeout=10) as console:
        assert console.post("/admin/login", data={"token": ADMIN_TOKEN}).status_code == 303

        feishu = console.get("/admin/api/stats").json()["transports"]["feishu"]

    assert (feishu["state"], feishu["ready"]) == ("connected", True)
    assert feishu["last_event_at"] is not None
