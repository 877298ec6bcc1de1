"""Streamed replies against the fake Feishu: splitting, the patch fallback, the error footer, resuming."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from bot.feishu_api import FeishuApi, FeishuApiError
from bot.replies import (
    CARDKIT_CARD,
    EMPTY_ANSWER,
    ERROR_FOOTER,
    FOOTER_RULE,
    INTERRUPTED,
    PATCHED_CARD,
    UNAVAILABLE_FOOTER,
    Replier,
)
from engine import SamplingParams
from engine.config import RemoteConfig
from engine.remote import RemoteEngine
from tests.fakes.events import new_message_id
from tests.fakes.feishu import FakeFeishu
from tests.fakes.model_server import FakeModelServer
from tests.support import free_port

_app_ids = itertools.count(1)


@pytest.fixture
def api(fake: FakeFeishu) -> FeishuApi:
    return FeishuApi.connect(f"cli_replies_{next(_app_ids)}", "secret", fake.domain)


async def words(text: str, fail_after: int | None = None) -> AsyncIterator[str]:
    for number, word in enumerate(text.split(" ")):
        if number == fail_after:
            raise RuntimeError("the engine fell over")
        yield word if number == 0 else " " + word


def answer_text(fake: FakeFeishu, message_id: str) -> str:
    return "".join(fake.text_of(m) for m in fake.replies_to(message_id))


async def test_an_answer_streams_into_one_cardkit_card(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()
    text = "Paged attention keeps the KV cache in fixed-size blocks."

    await Replier(api, interval_s=0.0).stream(message_id, words(text), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    card = fake.card_of(reply)
    assert fake.text_of(reply) == text
    assert not card.streaming
    assert card.sequences == list(range(1, len(card.sequences) + 1))
    assert len(card.sequences) > 2  # several content updates, then the settings that close streaming


async def test_updates_are_throttled(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()

    await Replier(api, interval_s=60.0).stream(message_id, words("one two three four five"), in_thread=False)

    card = fake.card_of(fake.replies_to(message_id)[0])
    assert len(card.sequences) == 2  # the final text and the end of streaming, nothing in between


async def test_a_long_answer_continues_in_further_cards(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()
    text = " ".join(f"w{n}" for n in range(40))

    await Replier(api, interval_s=0.05, card_text_limit=60).stream(message_id, words(text), in_thread=False)

    replies = fake.replies_to(message_id)
    assert len(replies) >= 3
    assert all(len(fake.text_of(m)) <= 60 for m in replies)
    assert answer_text(fake, message_id) == text
    assert len({m.uuid for m in replies}) == len(replies)


async def test_when_cardkit_is_refused_the_card_is_patched(api: FeishuApi, fake: FakeFeishu) -> None:
    fake.refuse_cardkit = True
    message_id = new_message_id()
    text = "Prefix caching shares full blocks between requests."

    await Replier(api, interval_s=0.0).stream(message_id, words(text), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    assert reply.msg_type == "interactive" and reply.patches
    assert fake.text_of(reply) == text


async def test_an_empty_answer_says_so_rather_than_leaving_the_placeholder(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()

    await Replier(api, interval_s=0.0).stream(message_id, words(""), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == EMPTY_ANSWER
    assert not fake.card_of(reply).streaming


async def test_a_failed_generation_ends_with_the_error_footer(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()

    await Replier(api, interval_s=0.0).stream(message_id, words("so far so good", fail_after=2), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == "so far" + ERROR_FOOTER
    assert not fake.card_of(reply).streaming


async def test_a_model_server_that_cannot_be_reached_gets_a_short_apology(api: FeishuApi, fake: FakeFeishu) -> None:
    server = FakeModelServer(free_port(), model="Qwen/Qwen3-8B").start()
    engine = RemoteEngine(RemoteConfig(url=server.base_url, tokenizer="qwen3")).start()
    server.stop()  # gone by the time the question comes
    message_id = new_message_id()

    async def answer() -> AsyncIterator[str]:
        async for delta in engine.stream([1, 2, 3], SamplingParams()):
            yield delta.text

    await Replier(api, interval_s=0.0).stream(message_id, answer(), in_thread=False)
    await engine.close(1.0)

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == UNAVAILABLE_FOOTER.removeprefix(FOOTER_RULE)
    assert not fake.card_of(reply).streaming


async def test_rate_limits_are_waited_out_and_others_fail_loudly(api: FeishuApi, fake: FakeFeishu) -> None:
    fake.rate_limit(1, reset_s=1)
    assert await api.bot_open_id() == fake.bot_open_id
    assert fake.rate_limited == 1

    with pytest.raises(FeishuApiError, match="code 230011"):
        await api.patch_card("om_no_such_message", {"schema": "2.0", "body": {"elements": []}})


async def test_a_failed_card_update_finishes_the_card_with_the_error_footer(api: FeishuApi, fake: FakeFeishu) -> None:
    fake.fail("/elements/answer/content")
    message_id = new_message_id()

    await Replier(api, interval_s=0.0).stream(message_id, words("so far so good"), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == "so" + ERROR_FOOTER
    assert not fake.card_of(reply).streaming


async def test_a_cancelled_answer_finishes_the_card_with_the_error_footer(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()

    async def stalled() -> AsyncIterator[str]:
        yield "Thinking hard"
        await asyncio.Event().wait()  # the engine never produces another token
        yield "never"

    answering = asyncio.create_task(Replier(api, interval_s=0.0).stream(message_id, stalled(), in_thread=False))
    deadline = time.monotonic() + 15
    while not (fake.replies_to(message_id) and fake.text_of(fake.replies_to(message_id)[0]) == "Thinking hard"):
        assert not answering.done() and time.monotonic() < deadline, "the card never showed the first words"
        await asyncio.sleep(0.01)
    answering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answering

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == "Thinking hard" + ERROR_FOOTER
    assert not fake.card_of(reply).streaming


async def test_a_card_left_streaming_is_closed_and_the_resumed_answer_gets_a_card_of_its_own(
    api: FeishuApi, fake: FakeFeishu
) -> None:
    message_id = new_message_id()
    opened: list[str] = []

    async def record(card: str) -> None:
        opened.append(card)

    fake.fail("/settings", times=2)  # the card can be neither finished nor given its error line
    with pytest.raises(FeishuApiError):
        await Replier(api, interval_s=0.0).stream(message_id, words("lost half"), in_thread=False, opened=record)
    (stuck,) = fake.replies_to(message_id)
    assert fake.card_of(stuck).streaming and opened == [CARDKIT_CARD + fake.card_of(stuck).card_id]

    await Replier(api, interval_s=0.0).close_interrupted(opened[0])
    await Replier(api, interval_s=0.0).stream(message_id, words("found again"), in_thread=False, attempt="resumed")

    stuck, resumed = fake.replies_to(message_id)
    assert not fake.card_of(stuck).streaming
    assert fake.text_of(stuck) == INTERRUPTED
    assert fake.text_of(resumed) == "found again"
    assert not fake.card_of(resumed).streaming


async def test_a_patched_card_left_unfinished_is_closed_by_its_message_id(api: FeishuApi, fake: FakeFeishu) -> None:
    fake.refuse_cardkit = True
    message_id = new_message_id()
    opened: list[str] = []

    async def record(card: str) -> None:
        opened.append(card)

    await Replier(api, interval_s=0.0).stream(message_id, words("an answer"), in_thread=False, opened=record)
    (reply,) = fake.replies_to(message_id)
    assert opened == [PATCHED_CARD + reply.message_id]

    await Replier(api, interval_s=0.0).close_interrupted(opened[0])

    assert fake.text_of(reply) == INTERRUPTED
