"""The pipeline on the real model (SmolLM2-135M-Instruct): what a user reads, not only which ids."""

from __future__ import annotations

import pytest

from cache.embeddings import Embedder
from chat import Conversation
from engine import LLMEngine
from settings import GenerationSettings
from storage import Database
from tests.chat.chat_support import ManagerFactory, ask, session_of, small_context

pytestmark = pytest.mark.downloads_model

SHORT_REPLIES = GenerationSettings(temperature=0.0, max_tokens=48)
# Long notes about other things: together they push the first message past a 512-token budget.
NOTES = [
    "Notes from the design review: the team compared two layouts for the settings page. The first "
    "keeps every option on one long page; the second groups them into tabs. Most people preferred "
    "tabs because the page felt shorter, but two engineers worried that search would be harder. We "
    "agreed to build a prototype of each and ask five users to find three settings. Can you summarize that?",
    "Notes from the hiring sync: we interviewed four candidates for the support role this week. Two "
    "had strong writing samples, one had deep product knowledge, and one had led a small team before. "
    "The panel wants a second conversation with the two writers, focused on handling an angry "
    "customer, before making an offer. What questions should we ask them?",
    "Notes from the office committee: the kitchen will get a new coffee machine, the plants on the "
    "third floor need a watering rota, and people asked for quieter phone booths. The budget covers "
    "the coffee machine and the rota this quarter; the booths wait for next year. How should we "
    "announce this to everyone?",
    "Notes from the security training: everyone must turn on two-factor sign-in by the end of the "
    "month, report suspicious emails with the button in the mail client, and lock their screen when "
    "they leave their desk. The trainer said most incidents start with a rushed click. Can you "
    "turn this into three short reminders?",
]


@pytest.fixture
def real_managers(smollm2_engine: LLMEngine, embedder: Embedder, db: Database) -> ManagerFactory:
    return ManagerFactory(smollm2_engine, embedder, db)


async def test_a_fact_given_early_is_kept_through_compression(real_managers: ManagerFactory) -> None:
    """Truncating the oldest turns would drop the fact; compression keeps it, and the model answers."""
    context = small_context(512, system_prompt="You are a helpful assistant. Answer briefly.")
    manager = await real_managers(context=context, generation=SHORT_REPLIES)
    alice = Conversation(channel="web", chat_id="alice")
    fact = "The launch is on March 14."
    turns = [await ask(manager, alice, text) for text in [fact, *NOTES]]
    answer = await ask(manager, alice, "When is the launch?")
    history = session_of(manager, alice).history
    assert any(turn.compressed for turn in [*turns, answer]) and history.num_tokens <= context.max_prompt_tokens
    texts = [record.text for record in history.records]
    assert any("March 14" in text for text in texts) and not all(note in texts for note in NOTES)
    assert "March 14" in answer.reply


@pytest.mark.parametrize(
    "question",
    ["Write two sentences about the sea.", "用中文写两句关于大海的话。"],
    ids=["english", "chinese"],
)
async def test_a_streamed_reply_never_shows_a_broken_character(real_managers: ManagerFactory, question: str) -> None:
    manager = await real_managers(generation=GenerationSettings(temperature=0.0, max_tokens=64))
    turn = manager.turn(Conversation(channel="web", chat_id="carol"), question)
    pieces = [piece async for piece in turn]
    assert pieces and all("\ufffd" not in piece for piece in pieces)
    assert turn.result is not None and "".join(pieces) == turn.result.reply
    assert turn.result.completion_tokens > len(pieces) // 2
