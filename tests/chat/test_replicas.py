"""Several bot replicas on one database: each a ChatManager with its own sessions in memory, as
separate processes would have, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chat import ChatManager, Conversation, SessionStore
from settings import GenerationSettings
from storage import Database, Message
from tests.chat.chat_support import GREEDY, ManagerFactory, ask, session_of
from tests.chat.test_chat_manager import engine_finished

pytestmark = pytest.mark.both_databases

ANN = Conversation(channel="feishu", chat_id="oc_team", chat_type="group", user_id="ou_ann")


def stored_texts(db: Database) -> list[str]:
    with db.session() as session:
        return [m.text for m in session.query(Message).order_by(Message.session_id, Message.seq)]


@pytest.fixture
async def replicas(
    managers: ManagerFactory, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[ChatManager, ChatManager]]:
    """Two replicas, each with a database handle of its own (its connections, its locks), as two
    processes have; their generation settings `request.param` where a test gives them."""
    generation: GenerationSettings = getattr(request, "param", GREEDY)
    handles = [Database(managers.db.url.render_as_string(hide_password=False)) for _ in range(2)]
    try:
        first, second = [ManagerFactory(managers.engine, managers.embedder, handle) for handle in handles]
        yield await first(generation=generation), await second(generation=generation)
    finally:
        for handle in handles:
            handle.close()


async def fresh_history_ids(manager: ChatManager, conversation: Conversation) -> list[int]:
    """The session's ids as a replica that never saw it loads them."""
    fresh = SessionStore(manager.sessions.db, manager.sessions.chat_format, manager.sessions.settings)
    return (await fresh.open(conversation)).history.token_ids.tolist()


async def test_a_conversation_alternating_between_replicas_keeps_its_whole_history(
    replicas: tuple[ChatManager, ChatManager],
) -> None:
    first, second = replicas
    questions = ["My name is Ann.", "I work on payments.", "What is my name?", "And my team?"]
    for number, question in enumerate(questions):
        replica = (first, second)[number % 2]
        await ask(replica, ANN, question)
        history = session_of(replica, ANN).history
        said = [record.text for record in history.records if record.role == "user"]
        assert said == questions[: number + 1]  # every earlier turn, whichever replica answered it
        assert history.token_ids.tolist() == await fresh_history_ids(replica, ANN)
    assert session_of(first, ANN).id == session_of(second, ANN).id


# Replies far longer than the database's answer takes: with GREEDY's 8 tokens the generation begun
# on the copy that was behind could end on its own first (on PostgreSQL under CI's load), and
# nothing was left to stop; a check held 0.1 s failed it every time. 2,048 tokens outlast a check
# held 0.3 s.
@pytest.mark.parametrize("replicas", [GREEDY.model_copy(update={"max_tokens": 2048})], indirect=True, ids=["long"])
async def test_the_generation_begun_on_a_copy_that_was_behind_stops(
    replicas: tuple[ChatManager, ChatManager],
) -> None:
    """A follow-up's generation begins while the database is asked whether the session's copy
    is behind; where it was (the other replica answered the turn before), that generation stops
    and the turn is answered on the session as stored."""
    first, second = replicas
    await ask(first, ANN, "My name is Ann.")
    await ask(second, ANN, "I work on payments.")
    aborts = first.engine.figures().activity.finish_reasons.get("abort", 0)
    await ask(first, ANN, "What is my name?")
    await engine_finished(first, "abort", aborts + 1)
    history = session_of(first, ANN).history
    assert [record.text for record in history.records if record.role == "user"] == [
        "My name is Ann.",
        "I work on payments.",
        "What is my name?",
    ]


async def test_a_reset_on_one_replica_starts_the_new_session_on_the_other(
    replicas: tuple[ChatManager, ChatManager],
) -> None:
    first, second = replicas
    await ask(first, ANN, "Remember the number 7.")
    before = (await ask(second, ANN, "And 8.")).session_id
    await first.sessions.reset(ANN)
    result = await ask(second, ANN, "Which numbers?")
    history = session_of(second, ANN).history
    assert [record.text for record in history.records if record.role == "user"] == ["Which numbers?"]
    assert result.session_id == session_of(second, ANN).id != before
    assert await fresh_history_ids(second, ANN) == history.token_ids.tolist()


async def test_turns_of_one_session_on_two_replicas_at_once_take_turns(
    replicas: tuple[ChatManager, ChatManager], db: Database
) -> None:
    if db.url.get_backend_name() != "postgresql":
        pytest.skip("on SQLite a session's turns are serialized within one process only")
    first, second = replicas
    await ask(first, ANN, "Hello.")
    await ask(second, ANN, "Hello again.")  # both replicas hold the session in memory
    await asyncio.gather(ask(first, ANN, "Question from the first."), ask(second, ANN, "Question from the second."))

    texts = stored_texts(db)
    assert len(texts) == 8  # four turns, none lost or overwritten
    later = max((first, second), key=lambda replica: session_of(replica, ANN).next_seq)
    said = [record.text for record in session_of(later, ANN).history.records if record.role == "user"]
    assert said[:2] == ["Hello.", "Hello again."]
    assert sorted(said[2:]) == ["Question from the first.", "Question from the second."]  # one after the other
    assert session_of(later, ANN).history.token_ids.tolist() == await fresh_history_ids(later, ANN)
