from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.embeddings import CachedEmbedder, Embedder
from cache.judge import LLMJudge
from cache.response_cache import ResponseCache
from chat import ChatManager, Conversation, SessionStore, TurnResult
from chat.compression import Compressor
from chat.merging import RequestMerger
from chat.sessions import SessionState
from chat.summarizer import Summarizer
from engine import Engine, LLMEngine, StreamDelta
from settings import CacheSettings, ContextSettings, GenerationSettings
from storage import Database
from tests.support import SHARED_DATA_DIR

CONTEXT = ContextSettings(system_prompt="You are a test bot.")
GREEDY = GenerationSettings(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="session")
def engine() -> Iterator[LLMEngine]:
    with LLMEngine.from_pretrained("builtin:tiny-qwen3", data_dir=str(SHARED_DATA_DIR), kv_cache_tokens=16384) as llm:
        yield llm


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir: Path) -> Iterator[LLMEngine]:
    with LLMEngine.from_pretrained(str(smollm2_dir), kv_cache_tokens=8192) as llm:
        yield llm


class ManagerFactory:
    """Builds ChatManagers over one database, as the app would after each restart."""

    def __init__(self, engine: Engine, embedder: Embedder, db: Database) -> None:
        self.engine, self.embedder, self.db = engine, embedder, db

    async def __call__(
        self,
        *,
        cache: bool = False,
        judge: bool = False,
        context: ContextSettings = CONTEXT,
        generation: GenerationSettings = GREEDY,
        max_message_chars: int = 8000,
        race_model: bool = False,
    ) -> ChatManager:
        chat_format = self.engine.chat_format(enable_thinking=context.enable_thinking)
        direct_format = self.engine.chat_format()
        response_cache = ResponseCache(
            # what is found, not how fast: a lookup waits for its embedding, however soon the model begins
            CacheSettings(enabled=cache, lookup_budget_ms=60_000, race_model=race_model),
            self.embedder,
            self.db,
            judge=LLMJudge(self.engine, direct_format) if judge else None,
        )
        await response_cache.load()
        summarizer = Summarizer(self.engine, direct_format, context.summary_max_tokens, context.summary_cache_entries)
        return ChatManager(
            self.engine,
            chat_format,
            SessionStore(self.db, chat_format, context),
            response_cache,
            Compressor(context, CachedEmbedder(self.embedder), summarizer, chat_format),
            RequestMerger[StreamDelta](),
            context=context,
            generation=generation,
            max_message_chars=max_message_chars,
        )


@pytest.fixture
def managers(engine: LLMEngine, embedder: Embedder, db: Database) -> ManagerFactory:
    return ManagerFactory(engine, embedder, db)


def small_context(max_prompt_tokens: int = 512, **overrides: object) -> ContextSettings:
    return ContextSettings.model_validate(
        CONTEXT.model_dump() | {"max_prompt_tokens": max_prompt_tokens, "summary_max_tokens": 32, **overrides}
    )


async def ask(manager: ChatManager, conversation: Conversation, text: str) -> TurnResult:
    return await manager.turn(conversation, text).collect()


def session_of(manager: ChatManager, conversation: Conversation) -> SessionState:
    """The conversation's session, which a turn has loaded."""
    session = manager.sessions.loaded(conversation)
    assert session is not None
    return session
