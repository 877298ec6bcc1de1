"""Threads on Feishu: an answer stays in the thread it was asked in; a thread the bot answered in is
followed up without an @mention, after a restart too; `feishu.reply_in_thread` opens a thread on
each group question. And the lanes: a group's threads are answered in parallel, each in order, at
most `feishu.max_concurrent_per_chat` at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.lanes import ChatLanes, Lane
from bot.policy import IncomingMessage
from bot.threads import Threads
from storage import Database, ThreadRepository, utcnow
from tests.bot.bot_support import (
    AppServer,
    app_settings,
    final_text,
    posted,
    pushed,
    start_connected,
    webhook_app_settings,
)
from tests.fakes.events import mentioning_bot, message_event, reply_event
from tests.fakes.feishu import FakeFeishu, wait_for

GROUP = "oc_threads"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    server = start_connected(app_settings(tmp_path_factory.mktemp("threads"), fake), fake)
    yield server
    server.stop()


def group_message(text: str, *, to_bot: bool = False, chat_id: str = GROUP, **fields: Any) -> dict[str, Any]:
    said = mentioning_bot(text) if to_bot else {"text": text}
    return message_event(chat_id=chat_id, chat_type="group", **said, **fields)


def thread_message(
    root_id: str, text: str, *, to_bot: bool = False, chat_id: str = GROUP, **fields: Any
) -> dict[str, Any]:
    """A message in the thread on `root_id` (thread_id omt_<root>): it replies to the root, as all there do."""
    said = mentioning_bot(text) if to_bot else {"text": text}
    thread_id = f"omt_{root_id}"
    return reply_event(parent_id=root_id, chat_id=chat_id, chat_type="group", thread_id=thread_id, **said, **fields)


def topic(fake: FakeFeishu, chat_id: str = GROUP) -> str:
    """A group message not addressed to the bot, for a thread to start on; returns its message_id."""
    return pushed(fake, group_message("Anyone know about paging?", chat_id=chat_id))


def test_an_answer_stays_in_the_thread_it_was_asked_in(app: AppServer, fake: FakeFeishu) -> None:
    root = topic(fake)
    asked_in_thread = pushed(fake, thread_message(root, "how does paging work?", to_bot=True))
    asked_in_stream = pushed(fake, group_message("and here?", to_bot=True))

    final_text(fake, asked_in_thread)
    final_text(fake, asked_in_stream)
    assert [(m.reply_in_thread, m.thread_id) for m in fake.replies_to(asked_in_thread)] == [(True, f"omt_{root}")]
    assert [(m.reply_in_thread, m.thread_id) for m in fake.replies_to(asked_in_stream)] == [(False, None)]


def test_a_thread_the_bot_answered_in_is_followed_up_without_a_mention(app: AppServer, fake: FakeFeishu) -> None:
    root = topic(fake)
    final_text(fake, pushed(fake, thread_message(root, "what is a KV block?", to_bot=True)))

    follow_up = pushed(fake, thread_message(root, "and how big is one?"))
    from_someone_else = pushed(fake, thread_message(root, "same here", sender_open_id="ou_bob"))

    assert final_text(fake, follow_up)
    assert final_text(fake, from_someone_else)
    assert {m.thread_id for m in fake.replies_to(follow_up)} == {f"omt_{root}"}


def test_without_a_mention_the_main_stream_and_other_threads_stay_unanswered(app: AppServer, fake: FakeFeishu) -> None:
    answered_root, other_root = topic(fake), topic(fake)
    final_text(fake, pushed(fake, thread_message(answered_root, "what is a KV block?", to_bot=True)))

    in_stream = pushed(fake, group_message("thanks, bot"))
    in_other_thread = pushed(fake, thread_message(other_root, "what about this one?"))

    # A lane per stream and per thread: once a later mention in each is answered, the earlier
    # message there has been handled.
    final_text(fake, pushed(fake, group_message("ping", to_bot=True)))
    final_text(fake, pushed(fake, thread_message(other_root, "ping", to_bot=True)))
    assert fake.replies_to(in_stream) == []
    assert fake.replies_to(in_other_thread) == []


def test_reply_in_thread_opens_a_thread_that_is_followed_up_after_a_restart(tmp_path: Path, fake: FakeFeishu) -> None:
    settings = webhook_app_settings(tmp_path, fake, reply_in_thread=True)
    group = "oc_reply_in_thread"
    first = AppServer(settings).start()
    try:
        private = posted(fake, first, message_event(chat_id="oc_private_flow", text="Just the two of us?"))
        question = posted(fake, first, group_message("Thread this?", to_bot=True, chat_id=group))
        final_text(fake, private)
        final_text(fake, question)
        assert [m.reply_in_thread for m in fake.replies_to(private)] == [False]
        assert [(m.reply_in_thread, m.thread_id) for m in fake.replies_to(question)] == [(True, fake.threads[question])]
        assert final_text(fake, posted(fake, first, follow_up(fake, group, question, "More, please.")))
    finally:
        first.stop()

    second = AppServer(settings).start()  # the same database
    try:
        assert final_text(fake, posted(fake, second, follow_up(fake, group, question, "Still with me?")))
    finally:
        second.stop()


def follow_up(fake: FakeFeishu, chat_id: str, question: str, text: str) -> dict[str, Any]:
    """A message without a mention in the thread the bot's answer opened on `question`."""
    thread_id = fake.threads[question]
    return reply_event(parent_id=question, chat_id=chat_id, chat_type="group", thread_id=thread_id, text=text)


@contextmanager
def held(fake: FakeFeishu, fragment: str) -> Iterator[None]:
    fake.hold(fragment)
    try:
        yield
    finally:
        fake.release(fragment)


def test_a_groups_threads_are_answered_in_parallel_up_to_the_cap(app: AppServer, fake: FakeFeishu) -> None:
    group = "oc_busy"
    asked = [thread_message(topic(fake, group), "hi", to_bot=True, chat_id=group) for _ in range(3)]
    first, second, third = (event["event"]["message"]["message_id"] for event in asked)

    with held(fake, f"/messages/{first}/reply"), held(fake, f"/messages/{second}/reply"):
        pushed(fake, asked[0])
        pushed(fake, asked[1])
        wait_for(
            lambda: fake.calls_to(f"/messages/{first}/reply") and fake.calls_to(f"/messages/{second}/reply"),
            what="two answers of the group in progress",
        )
        pushed(fake, asked[2])
        assert final_text(fake, pushed(fake, message_event(chat_id="oc_elsewhere", text="Am I held up?")))
        assert fake.calls_to(third) == []  # the group's two slots are taken: its third thread waits

    for message_id in (first, second, third):
        assert final_text(fake, message_id)


# --- the parts ------------------------------------------------------------------------------------


async def test_a_lane_keeps_its_order_and_a_chat_runs_at_most_its_cap_at_once() -> None:
    started: list[str] = []
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    go_on = asyncio.Event()

    async def handle(item: tuple[str, str]) -> None:
        chat_id, name = item
        started.append(name)
        running[chat_id] += 1
        peak[chat_id] = max(peak[chat_id], running[chat_id])
        await go_on.wait()
        running[chat_id] -= 1

    lanes: ChatLanes[tuple[str, str]] = ChatLanes(handle, max_per_chat=2)
    for lane, name in [
        (Lane("oc_1", "omt_1"), "first in thread 1"),
        (Lane("oc_1", "omt_1"), "second in thread 1"),
        (Lane("oc_1", "omt_2"), "thread 2"),
        (Lane("oc_1", None), "main stream"),
        (Lane("oc_2", None), "another chat"),
    ]:
        lanes.submit(lane, (lane.chat_id, name))
    await asyncio.sleep(0.05)

    assert started == ["first in thread 1", "thread 2", "another chat"]
    go_on.set()
    await lanes.close(grace_s=5)
    assert sorted(started) == sorted(
        ["first in thread 1", "second in thread 1", "thread 2", "main stream", "another chat"]
    )
    assert started.index("first in thread 1") < started.index("second in thread 1")
    assert peak == {"oc_1": 2, "oc_2": 1}


def message(
    *, chat_type: str = "group", thread_id: str | None = None, root_id: str | None = None, addressed: bool = True
) -> IncomingMessage:
    return IncomingMessage(
        message_id="om_question",
        chat_id="oc_1",
        chat_type=chat_type,
        sender_open_id="ou_asker",
        thread_id=thread_id,
        message_type="text",
        text="hi",
        root_id=root_id,
        addressed=addressed,
    )


@pytest.mark.parametrize(
    ("asked", "reply_in_thread", "thread"),
    [
        pytest.param(message(), False, None, id="group stream"),
        pytest.param(message(), True, "om_question", id="group stream, answered in a thread of its own"),
        pytest.param(message(chat_type="p2p"), True, None, id="private chat: one flow"),
        pytest.param(message(thread_id="omt_1", root_id="om_root"), False, "om_root", id="in a thread"),
        pytest.param(message(thread_id="omt_1"), False, "om_question", id="the first message of a topic"),
    ],
)
def test_which_thread_an_answer_goes_in(
    db: Database, asked: IncomingMessage, reply_in_thread: bool, thread: str | None
) -> None:
    threads = Threads(db, ttl=timedelta(days=2), reply_in_thread=reply_in_thread, follow_up=True)

    assert threads.of_answer(asked) == thread


async def test_a_thread_is_followed_once_answered_in_and_only_when_follow_ups_are_on(db: Database) -> None:
    follow_up = message(thread_id="omt_1", root_id="om_question", addressed=False)
    threads = Threads(db, ttl=timedelta(days=2), reply_in_thread=True, follow_up=True)
    assert not await threads.is_follow_up(follow_up)

    await threads.answering(message())

    assert await threads.is_follow_up(follow_up)
    assert not await threads.is_follow_up(message(addressed=False))  # the main stream is no thread
    off = Threads(db, ttl=timedelta(days=2), reply_in_thread=True, follow_up=False)
    assert not await off.is_follow_up(follow_up)


def test_a_followed_thread_expires_unless_answered_in_again(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        threads = ThreadRepository(session)
        threads.follow("om_root", timedelta(hours=1), now)
        threads.follow("om_quiet", timedelta(hours=1), now)
        threads.follow("om_root", timedelta(hours=1), now + timedelta(minutes=50))  # answered in again

    later = now + timedelta(minutes=70)
    with db.session() as session:
        threads = ThreadRepository(session)
        assert threads.followed("om_root", later)
        assert not threads.followed("om_quiet", later)
        assert threads.purge_expired(later) == 1
        assert not threads.followed("om_never")
