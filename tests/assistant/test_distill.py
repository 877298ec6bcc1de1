"""Distilling closed private sessions into memories: each taken once, by one of several replicas;
group sessions and the demo model's never."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from assistant.distill import Distiller
from assistant.memory import MemoryStore, owner_of
from cache.embeddings import Embedder
from chat import Conversation
from engine import LLMEngine
from settings import AssistantSettings
from storage import ChatSession, Database
from tests.chat.chat_support import ManagerFactory

PRIVATE = Conversation("feishu", "oc_wei_dm", "p2p", "ou_wei")
GROUP = Conversation("feishu", "oc_payments", "group", "ou_wei")


async def closed_sessions(managers: ManagerFactory) -> None:
    manager = await managers()
    for conversation in (PRIVATE, GROUP):
        await manager.turn(conversation, "Hi, I'm Wei from the payments team. I prefer PostgreSQL.").collect()
        await manager.sessions.reset(conversation)


def distilled_marks(db: Database) -> list[bool]:
    with db.session() as session:
        return [mark is not None for mark in session.scalars(select(ChatSession.distilled_at).order_by(ChatSession.id))]


async def test_the_demo_models_sessions_are_not_distilled(
    managers: ManagerFactory, engine: LLMEngine, embedder: Embedder, db: Database
) -> None:
    await closed_sessions(managers)
    settings = AssistantSettings(distill_on_close=True)
    distiller = Distiller(engine, engine.chat_format(), MemoryStore(db, embedder, settings), db, settings)
    assert not distiller.enabled
    assert await distiller.run() == 0
    assert distilled_marks(db) == [False, False]


@pytest.mark.downloads_model
async def test_a_closed_private_session_is_distilled_once_across_replicas(
    smollm2_engine: LLMEngine, embedder: Embedder, db: Database
) -> None:
    managers = ManagerFactory(smollm2_engine, embedder, db)
    await closed_sessions(managers)
    settings = AssistantSettings(distill_on_close=True, distill_max_facts=2)
    memory = MemoryStore(db, embedder, settings)
    replicas = [Distiller(smollm2_engine, smollm2_engine.chat_format(), memory, db, settings) for _ in range(2)]
    assert not Distiller(
        smollm2_engine, smollm2_engine.chat_format(), memory, db, AssistantSettings()
    ).enabled  # auto: too small

    kept = [await replica.run() for replica in replicas]

    assert distilled_marks(db) == [True, False]  # the group's session is never taken
    assert kept[1] == 0  # the second replica found nothing left to take
    facts = await memory.memories(owner_of(PRIVATE))
    assert len(facts) == kept[0] <= 2 and all(fact.source == "distilled" for fact in facts)
    assert await memory.memories(owner_of(GROUP)) == []
