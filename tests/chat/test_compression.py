"""The compression plan and its stand-ins, on histories built to the token."""

from __future__ import annotations

import os
import threading

from cache.embeddings import CachedEmbedder, Embedder
from chat.compression import STAND_IN_PREFIX, Compressor, Span, plan_compression
from chat.history import Role, TokenHistory
from chat.summarizer import SUMMARY_PREFIX, Summarizer, carries_more
from engine import LLMEngine
from tests.chat.chat_support import small_context


def history_of(*messages: tuple[Role, str, int]) -> TokenHistory:
    """A history of (role, text, tokens) messages, a turn per user message."""
    history = TokenHistory()
    history.append("system", [1] * 8, text="You are a test bot.", turn_index=-1, seq=-1)
    turn = -1
    for seq, (role, text, num_tokens) in enumerate(messages):
        turn += role == "user"
        history.append(role, [seq + 2] * num_tokens, text=text, turn_index=turn, seq=seq)
    return history


def compressor_of(
    engine: LLMEngine, embedder: CachedEmbedder, max_prompt_tokens: int, summary_max_tokens: int = 32
) -> Compressor:
    """A compressor that protects the last turn, its summaries written by `engine`."""
    context = small_context(max_prompt_tokens, keep_last_turns=1, summary_max_tokens=summary_max_tokens)
    chat_format = engine.chat_format()
    summarizer = Summarizer(engine, chat_format, context.summary_max_tokens, context.summary_cache_entries)
    return Compressor(context, embedder, summarizer, chat_format)


def test_a_last_turn_too_big_to_keep_beside_a_summary_is_summarized_too(embedder: Embedder) -> None:
    context = small_context(512)
    history = history_of(("user", "a pasted log", 240), ("assistant", "It is a log.", 8))
    plan = plan_compression(history, "another log", 240, 1, embedder, context)
    assert [type(item) for item in plan.layout] == [type(history.records[0]), Span]
    assert plan.spans[0].records == tuple(history.records[1:])


async def test_a_stand_in_folds_an_earlier_one_in_without_repeating_its_prefix(
    engine: LLMEngine, embedder: Embedder
) -> None:
    compressor = compressor_of(engine, CachedEmbedder(embedder), max_prompt_tokens=512)
    earlier = STAND_IN_PREFIX + "user: My dog is called Bruno."
    history = history_of(
        ("summary", earlier, 16),
        ("user", "How do I center a div in CSS?", 150),
        ("assistant", "Use flexbox.", 8),
        ("user", "Recommend a science fiction novel.", 150),
        ("assistant", "Try Dune.", 8),
    )
    compression = await compressor.compress(history, "Which planets have rings?", 200, 2, 10)
    assert compression is not None
    [stand_in] = [record.text for record in compression.history.records if record.role == "summary"]
    assert stand_in.count(STAND_IN_PREFIX) == 1 and "My dog is called Bruno." in stand_in


async def test_a_turn_waiting_for_its_compression_judges_relevance_by_shared_words_and_embeds_nothing(
    engine: LLMEngine, embedder: Embedder
) -> None:
    cached = CachedEmbedder(embedder)
    compressor = compressor_of(engine, cached, max_prompt_tokens=600)
    fact = "My dog is called Bruno and he is a beagle."
    history = history_of(
        ("user", fact, 80),
        ("assistant", "Noted.", 8),
        ("user", "How do I center a div in CSS?", 80),
        ("assistant", "Use flexbox.", 8),
        ("user", "Recommend a science fiction novel.", 100),
        ("assistant", "Try Dune.", 8),
    )
    # Room for one of the two older questions: by recency alone, the CSS one would stay.
    compression = await compressor.compress(history, "What breed is my dog?", 40, 3, 10, instant=True)
    assert compression is not None
    kept = {record.text for record in compression.history.records}
    assert fact in kept and "How do I center a div in CSS?" not in kept
    assert len(cached) == 0


async def test_embeddings_no_turn_waits_for_run_at_the_lowest_cpu_priority(
    engine: LLMEngine, embedder: Embedder
) -> None:
    cached = CachedEmbedder(embedder)
    compressor = compressor_of(engine, cached, max_prompt_tokens=512)
    history = history_of(("user", "A pasted log: disk full on /var.", 80), ("assistant", "Clean /var/log.", 8))
    before = set(threading.enumerate())
    await compressor.prepare(history)
    assert len(cached) == 2
    [thread] = [thread for thread in set(threading.enumerate()) - before if thread.name.startswith("compression")]
    assert thread.native_id is not None and os.getpriority(os.PRIO_PROCESS, thread.native_id) == 19
    compressor.close()


async def test_a_stand_in_excerpts_each_message_past_the_greeting_it_opens_with(
    engine: LLMEngine, embedder: Embedder
) -> None:
    compressor = compressor_of(engine, CachedEmbedder(embedder), max_prompt_tokens=512, summary_max_tokens=96)
    history = history_of(
        ("user", "Hi! I'm Priya Raman and I just joined the payments team. My employee number is 48213.", 150),
        ("assistant", "Welcome!", 8),
        ("user", "工单12一直没有人处理。应该找谁？", 150),
        ("assistant", "找值班的同事。", 8),
        ("user", "Recommend a science fiction novel.", 150),
        ("assistant", "Try Dune.", 8),
    )
    compression = await compressor.compress(history, "Which planets have rings?", 200, 3, 10)
    assert compression is not None
    [stand_in] = [record.text for record in compression.history.records if record.role == "summary"]
    # each opening runs to the first sentence end with 8 words before it (a Chinese character is one)
    assert "user: Hi! I'm Priya Raman and I just joined the payments team. / assistant: Welcome!" in stand_in
    assert "48213" not in stand_in
    assert "user: 工单12一直没有人处理。 / assistant: 找值班的同事。" in stand_in


SPAN = (
    "user: Hi! I'm Priya Raman and I just joined the payments team. My employee number is 48213, "
    "and the product launch is on March 14.\nassistant: Welcome to the team!"
)
STAND_IN = STAND_IN_PREFIX + "user: Hi! I'm Priya Raman and I just joined the payments team. / assistant: Welcome!"


def test_a_summary_is_kept_only_where_it_carries_more_of_its_span_than_the_stand_in() -> None:
    faithful = "Priya Raman joined the payments team; employee number 48213; the product launch is on March 14."
    assert carries_more(faithful, STAND_IN, SPAN)
    assert not carries_more("I'm sorry for the confusion. " * 8, STAND_IN, SPAN)  # a loop
    assert not carries_more("The team is launching a product. What is the launch date?", STAND_IN, SPAN)
    # Chinese by pairs of characters: the same facts in other words still count
    span = "user: 我叫王芳，工号48213，下周三入职支付组。\nassistant: 欢迎！"
    assert carries_more("王芳，工号48213，下周三入职支付组。", STAND_IN_PREFIX + "user: 我叫王芳，工号48213，", span)
    assert not carries_more("支付支付支付支付", STAND_IN_PREFIX + "user: 我叫王芳，工号48213，", span)


async def test_the_models_summary_replaces_a_stand_in_only_where_it_carries_more(
    engine: LLMEngine, embedder: Embedder
) -> None:
    compressor = compressor_of(engine, CachedEmbedder(embedder), max_prompt_tokens=512)
    history = history_of(
        ("user", SPAN.removeprefix("user: ").split("\n")[0], 150),
        ("assistant", "Welcome to the team!", 8),
        ("user", "Recommend a science fiction novel.", 150),
        ("assistant", "Try Dune.", 8),
    )
    compression = await compressor.compress(history, "Which planets have rings?", 200, 2, 10)
    assert compression is not None
    [pending] = compression.pending
    # The demo model's summary is meaningless text: the span keeps its stand-in, and is not summarized again.
    summaries = await compressor.write_summaries(compression.pending)
    assert summaries == {pending.digest: pending.stand_in}
    assert compressor.with_summaries(compression.history, compression.pending, summaries, 20) is None
    again = await compressor.compress(history, "Which planets have rings?", 200, 2, 30)
    assert again is not None and not again.pending
    assert [r.text for r in again.history.records] == [r.text for r in compression.history.records]
    # A summary that says more takes the stand-in's place, in a new record.
    written = SUMMARY_PREFIX + "Priya Raman, employee number 48213, joined the payments team; launch on March 14."
    rewritten = compressor.with_summaries(compression.history, compression.pending, {pending.digest: written}, 20)
    assert rewritten is not None and [record.seq for record in rewritten.summaries] == [20]
    assert [r.text for r in rewritten.history.records if r.role == "summary"] == [written]
