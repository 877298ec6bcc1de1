"""The tool loop on a real engine and ChatManager: a model that says a sentence, then calls
`current_time`, after every generation prompt. What the user sees is each round's text as a
paragraph of its own, never a call, then the note of the step cap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from transformers import PreTrainedTokenizerBase

from assistant.reminders import Reminders
from assistant.tools import BuiltinTools
from bot.tool_loop import ToolLoop
from cache.embeddings import Embedder
from chat import Conversation
from engine import LLMEngine
from settings import AssistantSettings, GenerationSettings
from storage import Database
from tests.chat.chat_support import ManagerFactory
from tests.models import IM_END, chained_model

SAID = "Let me check."
CALL = '<tool_call>\n{"name":"current_time","arguments":{}}\n</tool_call>'


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerBase) -> Iterator[LLMEngine]:
    path = tmp_path_factory.mktemp("says-then-calls")
    generation_prompt_end = tokenizer.encode("</think>\n\n")[-1]
    chained_model([[generation_prompt_end, *tokenizer.encode(SAID + CALL), IM_END]]).save_pretrained(path)
    tokenizer.save_pretrained(path)
    with LLMEngine.from_pretrained(str(path), kv_cache_tokens=4096) as llm:
        yield llm


async def test_each_rounds_text_is_shown_and_its_calls_are_not(
    engine: LLMEngine, embedder: Embedder, db: Database
) -> None:
    manager = await ManagerFactory(engine, embedder, db)(generation=GenerationSettings(temperature=0.0, max_tokens=32))
    settings = AssistantSettings(tool_max_steps=2)
    scheduler = AsyncIOScheduler(timezone="UTC")

    async def never(*_: object) -> None:
        raise AssertionError("no reminder is due")

    tools = BuiltinTools(None, Reminders(scheduler, db, never), settings, None)
    loop = ToolLoop.offered(manager, tools, settings)
    assert loop is not None
    conversation = Conversation("feishu", "oc_loop", "p2p", "ou_loop")

    shown = "".join(
        [piece async for piece in loop.answer(conversation, manager.turn(conversation, "What time is it?"))]
    )

    stopped = "(I stopped using tools here: 2 rounds of calls is the most I make for one message.)"
    assert shown == "\n\n".join([SAID] * 3 + [stopped])
    state = manager.sessions.loaded(conversation)
    assert state is not None and '"name": "current_time"' in state.system_prompt
