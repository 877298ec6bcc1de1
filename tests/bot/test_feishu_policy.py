"""Which events the bot answers and what it reads in them, on events as the SDK decodes them."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import lark_oapi as lark
import pytest
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1

from bot.commands import Command, parse_command
from bot.feishu_api import FeishuApi
from bot.policy import EventPolicy, fetched_event
from storage import Database
from tests.fakes.events import BOT_OPEN_ID, bot_mention, mention, message_event, reply_event
from tests.fakes.feishu import FakeFeishu


def event_policy(db: Database, *, answer_at_all: bool = False) -> EventPolicy:
    policy = EventPolicy(
        db,
        max_event_age=timedelta(minutes=10),
        dedup_ttl=timedelta(days=2),
        claim_lease=timedelta(seconds=30),
        answer_at_all=answer_at_all,
    )
    policy.bot_open_id = BOT_OPEN_ID
    return policy


@pytest.fixture
def policy(db: Database) -> EventPolicy:
    return event_policy(db)


def decoded(**fields: Any) -> P2ImMessageReceiveV1:
    fields.setdefault("chat_id", "oc_1")
    return lark.JSON.unmarshal(json.dumps(message_event(**fields)), P2ImMessageReceiveV1)


def test_a_private_text_message_is_read_as_it_was_written(policy: EventPolicy) -> None:
    message = policy.admit(decoded(text="  What is RoPE?  "))

    assert message is not None
    assert (message.text, message.chat_type, message.thread_id) == ("What is RoPE?", "p2p", None)


def test_in_groups_the_mention_of_the_bot_goes_and_others_keep_their_names(policy: EventPolicy) -> None:
    message = policy.admit(
        decoded(
            text="@_user_1 ask @_user_2 about it",
            chat_type="group",
            mentions=[bot_mention(1), mention(2, "ou_alice", "Alice")],
        )
    )

    assert message is not None and message.text == "ask @Alice about it"


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"text": "hi all", "chat_type": "group"}, id="group without a mention"),
        pytest.param(
            {"text": "@_user_1 hi", "chat_type": "group", "mentions": [mention(1, "ou_alice", "Clawdbot")]},
            id="someone else who has the bot's name",
        ),
        pytest.param({"text": "@_all hi", "chat_type": "group"}, id="@all"),
        pytest.param({"text": "hi", "sender_type": "app"}, id="another app"),
        pytest.param({"text": "hi", "sender_open_id": BOT_OPEN_ID}, id="the bot itself"),
        pytest.param({"text": "hi", "created_at": time.time() - 601}, id="older than max_event_age"),
    ],
)
def test_the_bot_stays_silent(policy: EventPolicy, fields: dict[str, Any]) -> None:
    assert policy.admit(decoded(**fields)) is None


def test_at_all_is_answered_when_configured(db: Database) -> None:
    policy = event_policy(db, answer_at_all=True)

    message = policy.admit(decoded(text="@_all standup in 5", chat_type="group"))

    assert message is not None and message.text == "standup in 5"


def test_a_rich_text_post_becomes_plain_text(policy: EventPolicy) -> None:
    post = {
        "title": "Question",
        "content": [
            [
                {"tag": "at", "user_id": "@_user_1", "user_name": "Clawdbot"},
                {"tag": "text", "text": " how do I "},
                {"tag": "a", "text": "deploy", "href": "https://example.com"},
                {"tag": "text", "text": "?"},
            ],
            [{"tag": "img", "image_key": "img_1"}, {"tag": "code_block", "language": "bash", "text": "make deploy"}],
        ],
    }

    message = policy.admit(decoded(message_type="post", content=post, chat_type="group", mentions=[bot_mention(1)]))

    assert message is not None and message.text == "Question\n how do I deploy?\n[image]make deploy"


def test_other_message_types_are_admitted_without_text(policy: EventPolicy) -> None:
    message = policy.admit(decoded(message_type="image", content={"image_key": "img_1"}))

    assert message is not None and message.text is None


def test_a_mention_and_an_image_have_no_text_but_a_mention_alone_is_an_empty_message(policy: EventPolicy) -> None:
    mention_only = [{"tag": "at", "user_id": "@_user_1", "user_name": "Clawdbot"}]
    with_image = [*mention_only, {"tag": "img", "image_key": "img_1"}]
    group = {"message_type": "post", "chat_type": "group", "mentions": [bot_mention(1)]}

    image = policy.admit(decoded(content={"title": "", "content": [with_image]}, **group))
    empty = policy.admit(decoded(content={"title": "", "content": [mention_only]}, **group))

    assert image is not None and image.text is None
    assert empty is not None and empty.text == ""


async def test_a_reply_knows_the_message_it_answers_also_when_fetched_again(
    policy: EventPolicy, fake: FakeFeishu
) -> None:
    event = reply_event(parent_id="om_parent", root_id="om_root", chat_id="oc_fetched", text="why?")
    fake.remember(event)
    api = FeishuApi.connect("cli_policy_reply", "secret", fake.domain)

    delivered = policy.admit(lark.JSON.unmarshal(json.dumps(event), P2ImMessageReceiveV1))
    fetched = policy.admit(fetched_event(await api.message(event["event"]["message"]["message_id"]), "p2p"))

    assert delivered is not None and (delivered.parent_id, delivered.root_id) == ("om_parent", "om_root")
    assert fetched == delivered


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(
            {
                "text": "@_user_1 ask @_user_2",
                "chat_type": "group",
                "mentions": [bot_mention(1), mention(2, "ou_a", "A")],
            },
            id="group text with mentions",
        ),
        pytest.param({"text": "in a thread", "thread_id": "omt_1"}, id="private, in a thread"),
        pytest.param({"message_type": "image", "content": {"image_key": "img_1"}}, id="an image"),
    ],
)
async def test_a_message_fetched_again_reads_as_the_event_it_came_in(
    policy: EventPolicy, fake: FakeFeishu, fields: dict[str, Any]
) -> None:
    event = message_event(chat_id="oc_fetched", **fields)
    fake.remember(event)
    api = FeishuApi.connect("cli_policy_fetch", "secret", fake.domain)

    fetched = await api.message(event["event"]["message"]["message_id"])

    delivered = policy.admit(lark.JSON.unmarshal(json.dumps(event), P2ImMessageReceiveV1))
    assert delivered is not None
    assert policy.admit(fetched_event(fetched, event["event"]["message"]["chat_type"])) == delivered


async def test_a_message_is_claimed_once(policy: EventPolicy) -> None:
    message = policy.admit(decoded(text="hi"))
    assert message is not None

    assert await policy.first_delivery(message) is True
    assert await policy.first_delivery(message) is False


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("/help", Command("help", "")),
        ("/System  be brief\nand kind", Command("system", "be brief\nand kind")),
        ("/usr/bin is gone", None),
        ("what about /reset?", None),
    ],
)
def test_commands_are_a_slash_and_a_word(text: str, command: Command | None) -> None:
    assert parse_command(text) == command
