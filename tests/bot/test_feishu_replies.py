"""Streamed replies against the fake Feishu: splitting, the patch fallback, the error footer."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from bot.feishu_api import FeishuApi, FeishuApiError
from bot.replies import ERROR_FOOTER, Replier
from tests.fakes.events import new_message_id
from tests.fakes.feishu import FakeFeishu

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


async def test_a_failed_generation_ends_with_the_error_footer(api: FeishuApi, fake: FakeFeishu) -> None:
    message_id = new_message_id()

    await Replier(api, interval_s=0.0).stream(message_id, words("so far so good", fail_after=2), in_thread=False)

    (reply,) = fake.replies_to(message_id)
    assert fake.text_of(reply) == "so far" + ERROR_FOOTER
    assert not fake.card_of(reply).streaming


async def test_rate_limits_are_waited_out_and_others_fail_loudly(api: FeishuApi, fake: FakeFeishu) -> None:
    fake.rate_limit(1, reset_s=1)
    assert await api.bot_open_id() == fake.bot_open_id
    assert fake.rate_limited == 1

    with pytest.raises(FeishuApiError, match="code 230011"):
        await api.patch_card("om_no_such_message", {"schema": "2.0", "body": {"elements": []}})
