"""What the model reads from a Feishu message, through the real SDK against the fake Feishu: the
speaker's name in groups, quoted messages, posts with images, merged forwards, and the notice for
a message without text. What the model was asked is the user message the app stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.bot.bot_support import AppServer, app_settings, final_text
from tests.fakes.events import (
    bot_mention,
    image_event,
    merge_forward_event,
    message_event,
    post_event,
    reply_event,
)
from tests.fakes.feishu import FakeFeishu, wait_for

PRIVATE = "oc_content_private"
GROUP = "oc_content_group"
ELSEWHERE = "oc_content_elsewhere"
ALICE, BOB = "ou_alice_0a11ce", "ou_bob_00b0b0"
UNKNOWN = "ou_hidden_9f3e2a"  # not in the fake's contacts: the app may not read their name
NOTICE_EN, NOTICE_ZH = "I can only read text for now.", "我目前只能读文字。"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    fake.users |= {ALICE: "Alice", BOB: "Bob"}
    server = AppServer(app_settings(tmp_path_factory.mktemp("content"), fake)).start()
    wait_for(lambda: fake.connected, 60, what="the long connection")
    yield server
    server.stop()


def asked(app: AppServer, fake: FakeFeishu, event: dict[str, Any]) -> str:
    """Deliver `event` and wait for its answer; returns what the model was asked."""
    stored = len(app.stored_texts("user"))
    assert fake.push(event) == 200
    final_text(fake, message_id(event))
    return wait_for(lambda: app.stored_texts("user")[stored:], what="the question to be stored")[-1]


def in_group(text: str, sender: str = ALICE, **fields: Any) -> dict[str, Any]:
    """Fields of a group message that @mentions the bot."""
    return {
        "chat_id": GROUP,
        "chat_type": "group",
        "text": f"@_user_1 {text}",
        "mentions": [bot_mention(1)],
        "sender_open_id": sender,
        **fields,
    }


def message_id(event: dict[str, Any]) -> str:
    return event["event"]["message"]["message_id"]


def quoted(text: str) -> str:
    return "\n".join(f"> {line}" for line in text.splitlines())


def test_in_a_group_each_message_starts_with_its_speakers_name(app: AppServer, fake: FakeFeishu) -> None:
    assert asked(app, fake, message_event(**in_group("how do I deploy?"))) == "Alice: how do I deploy?"
    assert asked(app, fake, message_event(**in_group("and roll back?", sender=BOB))) == "Bob: and roll back?"
    looked_up = len(fake.calls_to(f"/contact/v3/users/{ALICE}"))

    assert asked(app, fake, message_event(**in_group("thanks!"))) == "Alice: thanks!"
    assert len(fake.calls_to(f"/contact/v3/users/{ALICE}")) == looked_up == 1


def test_a_private_message_carries_no_name(app: AppServer, fake: FakeFeishu) -> None:
    event = message_event(chat_id=PRIVATE, text="how do I deploy to staging?", sender_open_id=ALICE)

    assert asked(app, fake, event) == "how do I deploy to staging?"


def test_a_name_that_cannot_be_read_becomes_a_short_stable_stand_in(app: AppServer, fake: FakeFeishu) -> None:
    assert asked(app, fake, message_event(**in_group("who am I?", sender=UNKNOWN))) == "user-9f3e2a: who am I?"
    assert asked(app, fake, message_event(**in_group("still me", sender=UNKNOWN))) == "user-9f3e2a: still me"


def test_commands_are_read_without_the_name(app: AppServer, fake: FakeFeishu) -> None:
    event = message_event(**in_group("/help"))
    assert fake.push(event) == 200

    assert "/reset" in final_text(fake, message_id(event))


def test_a_reply_quotes_the_message_it_answers(app: AppServer, fake: FakeFeishu) -> None:
    bobs = message_event(chat_id=GROUP, chat_type="group", text="The build fails at step 3.", sender_open_id=BOB)
    fake.remember(bobs)  # Feishu has it; the bot was not @mentioned in it

    reply = reply_event(parent_id=message_id(bobs), **in_group("why?"))

    assert asked(app, fake, reply) == "> Bob: The build fails at step 3.\n\nAlice: why?"


def test_a_bare_mention_under_a_message_asks_about_it(app: AppServer, fake: FakeFeishu) -> None:
    bobs = message_event(chat_id=GROUP, chat_type="group", text="Disk at 95% on db-2.", sender_open_id=BOB)
    fake.remember(bobs)

    reply = reply_event(parent_id=message_id(bobs), **in_group(""))

    assert asked(app, fake, reply) == "> Bob: Disk at 95% on db-2.\n\nAlice:"


def test_a_reply_to_the_bots_answer_quotes_that_answer(app: AppServer, fake: FakeFeishu) -> None:
    question = message_event(chat_id=PRIVATE, text="What is a KV cache?", sender_open_id=ALICE)
    asked(app, fake, question)
    (answer,) = fake.replies_to(message_id(question))

    follow_up = reply_event(parent_id=answer.message_id, chat_id=PRIVATE, text="Say more?", sender_open_id=ALICE)

    expected = quoted(f"Assistant: {fake.text_of(answer).strip()}") + "\n\nSay more?"
    assert asked(app, fake, follow_up) == expected


def test_a_thread_quotes_its_root_once(app: AppServer, fake: FakeFeishu) -> None:
    root = message_event(chat_id=GROUP, chat_type="group", text="Release plan: Friday.", sender_open_id=BOB)
    fake.remember(root)
    thread = {"parent_id": message_id(root), "thread_id": "omt_content_1"}

    first = asked(app, fake, reply_event(**thread, **in_group("is it on track?")))
    second = asked(app, fake, reply_event(**thread, **in_group("and the tests?")))

    assert (first, second) == ("> Bob: Release plan: Friday.\n\nAlice: is it on track?", "Alice: and the tests?")


def test_a_post_with_an_image_keeps_its_text_and_marks_the_image(app: AppServer, fake: FakeFeishu) -> None:
    post = post_event(
        chat_id=PRIVATE,
        title="Screenshot",
        paragraphs=[
            [{"tag": "text", "text": "what is wrong "}, {"tag": "emotion", "emoji_type": "THINKING"}],
            [{"tag": "img", "image_key": "img_v3_1"}],
        ],
    )

    assert asked(app, fake, post) == "Screenshot\nwhat is wrong :THINKING:\n[image]"


def test_an_image_alone_gets_the_notice_in_its_thread_and_no_engine_request(app: AppServer, fake: FakeFeishu) -> None:
    turns = app.app.state.chat_manager.figures().turns.total
    stored = len(app.stored_texts("user"))
    image = image_event(chat_id="oc_content_images", thread_id="omt_content_2")
    assert fake.push(image) == 200

    (notice,) = wait_for(lambda: fake.replies_to(message_id(image)), what="the notice")
    assert (notice.msg_type, fake.text_of(notice), notice.reply_in_thread) == ("text", f"{NOTICE_EN} {NOTICE_ZH}", True)
    assert app.app.state.chat_manager.figures().turns.total == turns
    assert len(app.stored_texts("user")) == stored


def test_the_notice_speaks_the_chats_language(app: AppServer, fake: FakeFeishu) -> None:
    asked(app, fake, message_event(chat_id="oc_content_zh", text="这个怎么部署？"))
    image = image_event(chat_id="oc_content_zh")
    assert fake.push(image) == 200

    (notice,) = wait_for(lambda: fake.replies_to(message_id(image)), what="the notice")
    assert fake.text_of(notice) == NOTICE_ZH


def test_a_merged_forward_reads_as_its_messages_with_their_senders(app: AppServer, fake: FakeFeishu) -> None:
    forward = merge_forward_event(chat_id=PRIVATE, sender_open_id=ALICE)
    carried: dict[str, Any] = {"chat_id": ELSEWHERE, "chat_type": "group"}
    fake.forward(
        forward,
        [
            message_event(**carried, text="Deploy failed on node 3.", sender_open_id=BOB),
            post_event(**carried, sender_open_id=UNKNOWN, paragraphs=[[{"tag": "code_block", "text": "make retry"}]]),
            image_event(**carried, sender_open_id=BOB),
        ],
    )

    expected = "[forwarded messages]\nBob: Deploy failed on node 3.\nuser-9f3e2a: make retry\nBob: [image]"
    assert asked(app, fake, forward) == expected
