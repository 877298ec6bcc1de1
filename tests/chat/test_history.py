from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from transformers import BatchEncoding, PreTrainedTokenizerBase

from chat import Conversation, SessionStore
from chat.history import MIN_CAPACITY, TokenHistory
from engine import ChatFormat
from settings import ContextSettings
from storage import Database
from tests.support import TEST_DATA

MESSAGES = [
    "你好，今天北京天气怎么样？",
    "Write a haiku about the sea.\nMake it sad.",
    "  leading and trailing spaces are the caller's business  ",
    "emoji 😀 and symbols <b>&amp;</b> and numbers 3.14159",
]


def template_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], thinking: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=thinking, tokenize=True
    )
    assert isinstance(encoded, BatchEncoding)
    return list(encoded["input_ids"])


@pytest.fixture(params=["qwen3", pytest.param("smollm2", marks=pytest.mark.downloads_model)])
def chat_tokenizer(request: pytest.FixtureRequest, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The Qwen3 tokenizer and SmolLM2's, each with its own chat template."""
    if request.param == "qwen3":
        return tokenizer
    smollm2_tokenizer: PreTrainedTokenizerBase = request.getfixturevalue("smollm2_tokenizer")
    return smollm2_tokenizer


@pytest.mark.parametrize("text", MESSAGES)
@pytest.mark.parametrize("system", ["", "You are a helpful assistant. 回答要简洁。"])
@pytest.mark.parametrize("thinking", [False, True])
def test_one_turn_prompt_equals_the_chat_template(
    chat_tokenizer: PreTrainedTokenizerBase, text: str, system: str, thinking: bool
) -> None:
    chat_format = ChatFormat.for_tokenizer(chat_tokenizer, enable_thinking=thinking)
    history = TokenHistory()
    messages = []
    if opening := chat_format.system(system):
        history.append("system", opening, text=system, turn_index=-1, seq=-1)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    prompt = history.prompt(chat_format.message("user", text), chat_format.generation_prompt)
    assert prompt.dtype == np.int32
    assert prompt.tolist() == template_ids(chat_tokenizer, messages, thinking)


def test_append_grows_without_rewriting_earlier_tokens() -> None:
    history = TokenHistory()
    expected: list[int] = []
    views = []
    for index in range(400):
        ids = list(range(index, index + index % 7 + 1))
        views.append(history.token_ids)
        history.append("user", ids, text=str(index), turn_index=index, seq=index)
        expected += ids
    assert history.token_ids.tolist() == expected
    # a view handed out before the buffer grew still holds what it held
    assert all(view.tolist() == expected[: len(view)] for view in views)
    assert history.prompt([1, 2], (3,)).tolist() == [*expected, 1, 2, 3]
    record = history.records[50]
    assert history.ids_of(record).tolist() == list(range(50, 50 + 50 % 7 + 1))


def test_the_buffer_stays_within_an_eighth_of_its_tokens() -> None:
    history = TokenHistory()
    for index in range(600):
        history.append("user", [index % 1000] * 10, text="", turn_index=index, seq=index)
        assert history.nbytes <= max(4 * history.num_tokens * 9 / 8 + 4 * 10, 4 * MIN_CAPACITY)


def test_nothing_outside_can_change_the_history() -> None:
    history = TokenHistory()
    history.append("user", [1, 2, 3], text="u", turn_index=0, seq=0)
    for view in (history.token_ids, history.ids_of(history.records[0])):
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 5
    prompt = history.prompt([4])
    prompt[0] = 9  # a new array: the caller's to change
    assert history.token_ids.tolist() == [1, 2, 3]


def test_ids_outside_int32_are_refused_and_change_nothing() -> None:
    history = TokenHistory()
    history.append("user", [1, 2], text="u", turn_index=0, seq=0)
    digest = history.context_digest()
    with pytest.raises(OverflowError):
        history.append("user", [3, 2**40], text="v", turn_index=1, seq=1)
    assert (history.token_ids.tolist(), len(history.records), history.context_digest()) == ([1, 2], 1, digest)


def test_context_digest_ignores_the_system_prompt_only() -> None:
    history = TokenHistory()
    assert history.context_digest() == ""
    history.append("system", [1, 2, 3], text="s", turn_index=-1, seq=-1)
    assert history.context_digest() == ""
    history.append("user", [4, 5], text="u", turn_index=0, seq=0)
    other = TokenHistory()
    other.append("system", [9, 9], text="t", turn_index=-1, seq=-1)
    other.append("user", [4, 5], text="u", turn_index=0, seq=0)
    assert history.context_digest() == other.context_digest() != ""
    other.append("assistant", [6], text="a", turn_index=0, seq=1)
    assert other.context_digest() != history.context_digest()


# Written by the list version of TokenHistory (tests/data/README.md); the digest it reported.
LIST_VERSION_SESSION = TEST_DATA / "list_history_session.sql"
LIST_VERSION_DIGEST, LIST_VERSION_TOKENS = "b1eb0fb194ab5c39e4a58677d8a30d90", 136
LIST_VERSION_CONVERSATION = Conversation(channel="api", chat_id="legacy", user_id="u1")
LIST_VERSION_CONTEXT = ContextSettings(system_prompt="You are a test bot. 回答要简洁。")
LIST_VERSION_TURNS = [
    ("今天北京天气怎么样？适合出去跑步吗？", "北京今天晴，最高气温18度，适合户外跑步。"),
    ("And in English? Use an emoji 😀 please.", "Sunny, 18 °C: a good day for a run 🏃."),
    ("```python\nprint('x')\n```  what does this print?", "It prints `x` followed by a newline."),
]


async def test_a_session_stored_by_the_list_version_loads_with_its_digest(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    path = tmp_path / "list_version.sqlite"
    with closing(sqlite3.connect(path)) as connection:
        connection.executescript(LIST_VERSION_SESSION.read_text(encoding="utf-8"))
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    state = await SessionStore(db, chat_format, LIST_VERSION_CONTEXT).open(LIST_VERSION_CONVERSATION)
    history = state.history
    assert (history.context_digest(), history.num_tokens) == (LIST_VERSION_DIGEST, LIST_VERSION_TOKENS)
    expected = list(chat_format.system(LIST_VERSION_CONTEXT.system_prompt))
    for question, answer in LIST_VERSION_TURNS:
        expected += [*chat_format.message("user", question), *chat_format.reply(chat_format.encode(answer))]
    assert history.token_ids.tolist() == expected


async def test_the_same_turns_stored_today_give_the_list_version_digest(
    db: Database, tokenizer: PreTrainedTokenizerBase
) -> None:
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    store = SessionStore(db, chat_format, LIST_VERSION_CONTEXT)
    state = await store.open(LIST_VERSION_CONVERSATION)
    for question, answer in LIST_VERSION_TURNS:
        await store.save_turn(
            state,
            (question, chat_format.message("user", question)),
            (answer, chat_format.reply(chat_format.encode(answer))),
            None,
        )
    assert state.history.context_digest() == LIST_VERSION_DIGEST
