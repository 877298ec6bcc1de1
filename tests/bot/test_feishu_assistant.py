"""The assistant on Feishu, end to end against the fake: memories recalled into a new session's
prompt (and nobody else's), reminders and scheduled prompts posted where they were set, personas.
The commands need no help from the model: the demo model serves here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from storage import ChatSession, Database, Message
from tests.bot.bot_support import AppServer, app_settings, final_text, pushed, start_connected
from tests.fakes.events import USER_OPEN_ID, mentioning_bot, message_event, reply_event
from tests.fakes.feishu import FakeFeishu, SentMessage, wait_for

ALICE_DM, BOB_DM, GROUP = "oc_alice_dm", "oc_bob_dm", "oc_assistant_group"
BOB = "ou_bob_assistant"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    # Every test speaks as one person, more often than the default 20 a minute.
    settings = app_settings(tmp_path_factory.mktemp("assistant"), fake, requests_per_minute=0)
    server = start_connected(settings, fake)
    yield server
    server.stop()


def ask(fake: FakeFeishu, chat_id: str, text: str, **fields: Any) -> str:
    """Send `text` in a private chat; the bot's answer."""
    return final_text(fake, pushed(fake, message_event(chat_id=chat_id, text=text, **fields)))


def last_question_seen(app: AppServer, chat_id: str) -> tuple[str, str]:
    """The newest user message of the chat's sessions: its text, and its ids as the model read them."""
    db = Database(str(app.settings.storage.url))
    try:
        with db.session() as session:
            message = session.scalars(
                select(Message)
                .join(ChatSession, Message.session_id == ChatSession.id)
                .where(ChatSession.chat_id == chat_id, Message.role == "user")
                .order_by(Message.id.desc())
            ).first()
            assert message is not None
            return message.text, app.app.state.chat_manager.chat_format.decode(message.token_ids)
    finally:
        db.close()


def posted_in(fake: FakeFeishu, chat_id: str, fragment: str) -> list[SentMessage]:
    """The bot's text messages in the chat that hold `fragment`."""
    return [
        m
        for m in list(fake.messages.values())
        if m.chat_id == chat_id and m.msg_type == "text" and fragment in fake.text_of(m)
    ]


def test_a_remembered_fact_goes_with_a_new_sessions_question_and_no_one_elses(app: AppServer, fake: FakeFeishu) -> None:
    assert ask(fake, ALICE_DM, "/remember my desk is 4F-12") == "I'll remember that (#1): my desk is 4F-12"
    assert ask(fake, ALICE_DM, "/reset") == "Started a new conversation."
    ask(fake, ALICE_DM, "where is my desk?")
    text, seen = last_question_seen(app, ALICE_DM)
    assert text == "where is my desk?" and "my desk is 4F-12" in seen

    ask(fake, BOB_DM, "where is my desk?", sender_open_id=BOB)
    text, seen = last_question_seen(app, BOB_DM)
    assert text == "where is my desk?" and "4F-12" not in seen

    assert ask(fake, ALICE_DM, "/forget 1") == "Forgotten: my desk is 4F-12"
    ask(fake, ALICE_DM, "where is my desk?")
    assert "4F-12" not in last_question_seen(app, ALICE_DM)[1]


def test_plain_requests_to_remember_are_kept_without_the_model(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_plain_memory"
    assert ask(fake, chat, "remember that I am on the billing team").startswith("I'll remember that (#1)")
    assert ask(fake, chat, "记住我的工位是5F-03").startswith("I'll remember that (#2)")
    listed = ask(fake, chat, "/memory")
    assert "1. I am on the billing team" in listed and "2. 我的工位是5F-03" in listed
    assert ask(fake, chat, "/forget all") == "Forgotten: all 2 of what I kept for you."
    assert ask(fake, chat, "/memory").startswith("I keep nothing for you yet")


def test_a_reminder_is_posted_once_in_its_chat_mentioning_its_person(app: AppServer, fake: FakeFeishu) -> None:
    event = message_event(chat_id=GROUP, chat_type="group", **mentioning_bot("/remind in 2 seconds stand up"))
    assert final_text(fake, pushed(fake, event)).startswith("OK (#1), at ")

    (reminder,) = wait_for(lambda: posted_in(fake, GROUP, "⏰ stand up"), 15, what="the reminder")
    assert fake.text_of(reminder) == f'<at user_id="{USER_OPEN_ID}"></at> ⏰ stand up'
    assert reminder.reply_to is None
    time.sleep(2)
    assert len(posted_in(fake, GROUP, "⏰ stand up")) == 1


def test_a_reminder_set_in_a_thread_is_posted_in_that_thread(app: AppServer, fake: FakeFeishu) -> None:
    root = pushed(fake, message_event(chat_id=GROUP, chat_type="group", text="release 1.4 thread"))
    said = mentioning_bot("提醒我2秒后检查构建")
    event = reply_event(parent_id=root, chat_id=GROUP, chat_type="group", thread_id=f"omt_{root}", **said)
    assert final_text(fake, pushed(fake, event)).startswith("OK (#")

    (reminder,) = wait_for(lambda: posted_in(fake, GROUP, "⏰ 检查构建"), 15, what="the reminder")
    assert reminder.reply_to == root and reminder.reply_in_thread


def test_reminders_are_listed_and_cancelled_by_number(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_reminder_list"
    ask(fake, chat, "/remind in 3 days call the bank")
    ask(fake, chat, "/schedule every weekday 9:00 summarize yesterday")  # always due within 3 days
    listed = ask(fake, chat, "/reminders")
    assert "1. every weekday at 09:00 (Asia/Shanghai): answer “summarize yesterday”" in listed
    assert "2. at " in listed and listed.index("call the bank") > listed.index("2. at ")
    assert ask(fake, chat, "/reminders cancel 2").startswith("Cancelled: at ")
    assert "call the bank" not in ask(fake, chat, "/reminders")
    assert ask(fake, chat, "/reminders cancel 7") == "You have no reminder #7 here; `/reminders` lists them."
    assert ask(fake, chat, "/remind someday maybe").startswith("I found no time in")


def test_a_scheduled_prompt_posts_the_models_answer(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_scheduled_prompt"
    assert ask(fake, chat, "/schedule in 2 seconds summarize our plans").startswith("Scheduled (#1)")

    (post,) = wait_for(lambda: posted_in(fake, chat, "🗓 summarize our plans"), 30, what="the scheduled answer")
    question, _ = last_question_seen(app, chat)
    assert question == "summarize our plans"  # it ran through the chat's session like a question
    answer = app.stored_texts("assistant")[-1]
    assert fake.text_of(post) == f"🗓 summarize our plans\n\n{answer}"


def test_a_persona_heads_the_next_sessions_system_prompt(app: AppServer, fake: FakeFeishu) -> None:
    chat = "oc_persona"
    assert ask(fake, chat, "/persona Ada: calm and brief") == "I am Ada here now; a new conversation starts with it."
    assert ask(fake, chat, "/help").startswith("Here I am Ada. calm and brief\n\nI answer in private chats")
    ask(fake, chat, "hello")
    db = Database(str(app.settings.storage.url))
    try:
        with db.session() as session:
            prompt = session.scalars(
                select(ChatSession.system_prompt).where(ChatSession.chat_id == chat, ChatSession.state == "active")
            ).one()
    finally:
        db.close()
    assert prompt is not None and prompt.startswith("Your name is Ada. calm and brief\n\n")
    assert ask(fake, chat, "/persona off") == "Persona cleared; a new conversation starts without it."
    assert ask(fake, chat, "/persona").startswith("I have no persona here.")


def test_a_persons_own_time_zone_reads_their_reminders_times(app: AppServer, fake: FakeFeishu) -> None:
    chat, person = "oc_new_york", "ou_in_new_york"
    fake.users[person], fake.time_zones[person] = "Nora", "America/New_York"
    said = ask(fake, chat, "/remind tomorrow 9:00 call the bank", sender_open_id=person)
    assert said.startswith("OK (#1), at ") and said.endswith(" 09:00 (America/New_York): call the bank")
    # A person whose zone cannot be read (not in the contact range): the configured one.
    assert ask(fake, "oc_default_zone", "/remind tomorrow 9:00 x").endswith(" 09:00 (Asia/Shanghai): x")
