"""The bot on Feishu's long connection: the app's real wiring, the real SDK, the fake Feishu."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bot.bot_support import AppServer, app_settings, final_text
from tests.fakes.events import BOT_OPEN_ID, bot_mention, mention, message_event
from tests.fakes.feishu import FakeFeishu, wait_for

CHAT = "oc_private_1"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    server = AppServer(app_settings(tmp_path_factory.mktemp("longconn"), fake)).start()
    wait_for(lambda: fake.connected, 60, what="the long connection")
    yield server
    server.stop()


def ask(fake: FakeFeishu, text: str, chat_id: str = CHAT, **fields: Any) -> str:
    """Deliver a message on the long connection; returns its message_id."""
    event = message_event(chat_id=chat_id, text=text, **fields)
    assert fake.push(event) == 200
    return event["event"]["message"]["message_id"]


def test_a_private_message_gets_a_streamed_card_with_the_engine_reply(app: AppServer, fake: FakeFeishu) -> None:
    message_id = ask(fake, "What is a KV cache?")

    text = final_text(fake, message_id)
    (reply,) = fake.replies_to(message_id)
    assert reply.msg_type == "interactive" and reply.content["type"] == "card"
    assert reply.uuid
    card = fake.card_of(reply)
    assert card.card["config"]["streaming_mode"] is False
    assert card.sequences == sorted(set(card.sequences)) and len(card.sequences) >= 2
    assert text == app.assistant_texts()[-1]


def test_group_messages_are_answered_only_when_the_bot_is_mentioned(app: AppServer, fake: FakeFeishu) -> None:
    group = "oc_group_1"
    ignored = ask(fake, "hello everyone", chat_id=group, chat_type="group")
    someone_else = ask(
        fake,
        "@_user_1 please have a look",
        chat_id=group,
        chat_type="group",
        mentions=[mention(1, "ou_alice", "Alice")],
    )
    at_all = ask(fake, "@_all standup in 5", chat_id=group, chat_type="group")
    by_name = ask(fake, "Clawdbot, are you there?", chat_id=group, chat_type="group")
    addressed = ask(
        fake,
        "@_user_1 what does @_user_2 think?",
        chat_id=group,
        chat_type="group",
        mentions=[bot_mention(1), mention(2, "ou_alice", "Alice")],
    )

    # One lane per chat: once the last message is answered, the earlier ones have been handled.
    final_text(fake, addressed)
    for message_id in (ignored, someone_else, at_all, by_name):
        assert fake.replies_to(message_id) == []


def test_a_redelivered_message_is_answered_once(app: AppServer, fake: FakeFeishu) -> None:
    event = message_event(chat_id=CHAT, text="Say something twice?")
    message_id = event["event"]["message"]["message_id"]
    assert fake.push(event) == 200
    final_text(fake, message_id)
    assert fake.push(event) == 200  # Feishu redelivers what it thinks was not acknowledged

    final_text(fake, ask(fake, "And now?"))
    assert len(fake.replies_to(message_id)) == 1


def test_a_rate_limited_send_is_retried_and_delivered(app: AppServer, fake: FakeFeishu) -> None:
    fake.rate_limit(2, reset_s=1)
    message_id = ask(fake, "Is the line busy?")

    assert final_text(fake, message_id)
    assert fake.rate_limited == 2
    assert len(fake.replies_to(message_id)) == 1


def test_reset_starts_a_new_session(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_private_reset"
    final_text(fake, ask(fake, "Remember the number 7.", chat_id=chat))
    before = session_id(final_text(fake, ask(fake, "/stats", chat_id=chat)))

    assert final_text(fake, ask(fake, "/reset", chat_id=chat)) == "Started a new conversation."
    final_text(fake, ask(fake, "Which number?", chat_id=chat))
    after = session_id(final_text(fake, ask(fake, "/stats", chat_id=chat)))

    assert after != before


def test_commands_answer_in_chat(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_private_commands"
    assert "/reset" in final_text(fake, ask(fake, "/help", chat_id=chat))
    assert "/reset" in final_text(fake, ask(fake, "/frobnicate", chat_id=chat))
    assert "set" in final_text(fake, ask(fake, "/system You answer like a pirate.", chat_id=chat))
    assert "You answer like a pirate." in final_text(fake, ask(fake, "/stats", chat_id=chat))


def test_an_image_gets_a_polite_reply(app: AppServer, fake: FakeFeishu) -> None:
    event = message_event(chat_id=CHAT, message_type="image", content={"image_key": "img_v2_0001"})
    assert fake.push(event) == 200

    assert "only read text" in final_text(fake, event["event"]["message"]["message_id"])


def test_the_long_connection_comes_back_after_a_loss(app: AppServer, fake: FakeFeishu) -> None:
    opened = fake.connections_opened
    fake.drop_connections()
    wait_for(lambda: fake.connections_opened > opened and fake.connected, 30, what="the reconnect")

    assert final_text(fake, ask(fake, "Still there?"))


def test_the_bot_asked_feishu_who_it_is(app: AppServer, fake: FakeFeishu) -> None:
    assert fake.calls_to("/open-apis/bot/v3/info")
    assert fake.bot_open_id == BOT_OPEN_ID


def session_id(stats: str) -> str:
    match = re.search(r"session_id: (\d+)", stats)
    assert match, stats
    return match[1]
