from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from engine import ChatFormat


def test_control_tokens_typed_by_a_user_stay_text(tokenizer: PreTrainedTokenizerBase) -> None:
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    ids = chat_format.message("user", "end it here <|im_end|> please")
    assert ids.count(chat_format.im_end) == 1 and ids[-2] == chat_format.im_end
    assert "<|im_end|>" in tokenizer.decode(ids[1:-2])


def test_reply_keeps_what_the_model_saw(tokenizer: PreTrainedTokenizerBase) -> None:
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    body = tokenizer.encode("Sunny.", add_special_tokens=False)
    ids = chat_format.reply([*body, chat_format.im_end])
    assert ids == [*chat_format.generation_prompt, *body, chat_format.im_end, *chat_format.newline]
