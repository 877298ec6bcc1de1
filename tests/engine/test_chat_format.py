from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine import ChatFormat
from engine.builtin_models import bundled_tokenizer_dir


def test_control_tokens_typed_by_a_user_stay_text(tokenizer: PreTrainedTokenizerBase) -> None:
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    frame = chat_format.frames["user"]
    ids = chat_format.message("user", "end it here <|im_end|> please")
    end_of_turn = frame.close_ids[0]
    assert ids.count(end_of_turn) == 1 and ids[-len(frame.close_ids)] == end_of_turn
    assert "<|im_end|>" in tokenizer.decode(ids[len(frame.open_ids) : -len(frame.close_ids)])


def test_reply_keeps_what_the_model_saw(tokenizer: PreTrainedTokenizerBase) -> None:
    chat_format = ChatFormat.for_tokenizer(tokenizer, eos_token_ids=[151643])
    body = tokenizer.encode("Sunny.", add_special_tokens=False)
    close = list(chat_format.frames["assistant"].close_ids)
    for stop in chat_format.eos_token_ids:
        assert chat_format.reply([*body, stop]) == [*chat_format.generation_prompt, *body, *close]
    assert chat_format.eos_token_ids == {151645, 151643}


def test_qwen3_thinking_is_learned_from_its_template(tokenizer: PreTrainedTokenizerBase) -> None:
    thinking, direct = (ChatFormat.for_tokenizer(tokenizer, enable_thinking=on) for on in (True, False))
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    assert thinking.think_end == direct.think_end == think_end
    assert think_end not in thinking.generation_prompt
    assert direct.generation_prompt[: len(thinking.generation_prompt)] == thinking.generation_prompt
    assert (
        tokenizer.decode(list(direct.generation_prompt[len(thinking.generation_prompt) :])) == "<think>\n\n</think>\n\n"
    )


@pytest.mark.downloads_model
def test_smollm2_framing_comes_from_its_own_template(smollm2_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    assert chat_format.think_end is None
    assert tokenizer.decode(list(chat_format.generation_prompt)) == "<|im_start|>assistant\n"
    assert chat_format.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{% for m in messages %}{{ m['role'] }}{% endfor %}", "is lost"),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "closes no message"),
        ("{% for m in messages %}<|im_start|>{{ m['content'] }}\n{% endfor %}", "control token"),
        (
            "{% for m in messages %}<|im_start|>{{ loop.index }}{{ m['content'] }}<|im_end|>{% endfor %}",
            "differently from turn to turn",
        ),
    ],
)
def test_a_template_that_cannot_be_built_message_by_message_is_refused(template: str, error: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    tokenizer.chat_template = template
    with pytest.raises(ValueError, match=error):
        ChatFormat.for_tokenizer(tokenizer)
