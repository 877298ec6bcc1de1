from __future__ import annotations

import pytest
from transformers import BatchEncoding, PreTrainedTokenizerBase

from chat.history import TokenHistory
from engine import ChatFormat

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
    assert prompt == template_ids(chat_tokenizer, messages, thinking)


def test_append_grows_without_rewriting_earlier_tokens() -> None:
    history = TokenHistory()
    expected: list[int] = []
    for index in range(200):
        ids = list(range(index, index + index % 7 + 1))
        before = history.token_ids.copy()
        history.append("user", ids, text=str(index), turn_index=index, seq=index)
        expected += ids
        assert history.token_ids[: len(before)] == before
    assert history.token_ids == expected
    assert history.prompt([1, 2]) == [*expected, 1, 2]
    record = history.records[50]
    assert history.ids_of(record) == list(range(50, 50 + 50 % 7 + 1))
    history.token_ids[0] = 5  # a copy: the history cannot be changed from outside
    assert history.token_ids[0] == 0


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
