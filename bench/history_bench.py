"""Prompt assembly for turn 101 of a 100-turn conversation: tensorized history vs the naive way.

    python bench/history_bench.py [--turns 100] [--repeat 200]

Naive: keep a list of message dicts, and every turn render it with the chat template and
tokenize the whole text. Ours: every message was tokenized once when it arrived; the prompt is
a slice of the token buffer plus the new message and the generation prompt. Both produce the
same ids (checked). Prints medians, the ratio, and a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from transformers import BatchEncoding

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.history import TokenHistory
from engine import ChatFormat
from engine.builtin_models import bundled_tokenizer_dir
from engine.checkpoints import load_tokenizer

USER = [
    "今天北京天气怎么样？适合出去跑步吗？",
    "Can you summarize the meeting notes from this morning in three bullet points?",
    "帮我写一封给客户的道歉邮件，说明发货延迟两天。",
    "What's the difference between a process and a thread?",
    "这个报错是什么意思：KeyError: 'user_id'",
]
ASSISTANT = [
    "北京今天晴，最高气温18度，空气质量良，适合户外跑步。建议早上或傍晚出门，注意补水。",
    "Sure. 1) The launch moves to next Tuesday. 2) QA owns the regression pass. 3) Marketing "
    "drafts the announcement by Friday.",
    "尊敬的客户：您好！由于物流原因，您的订单将延迟两天送达，我们深表歉意，并将为您提供优惠券作为补偿。",
    "A process has its own memory space; threads share the memory of the process they belong to, "
    "which makes communication cheap but requires synchronization.",
    "KeyError 表示字典里没有 'user_id' 这个键。请先检查数据来源，或者使用 dict.get('user_id') 提供默认值。",
]


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` timed calls, after one untimed."""
    fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def without_earlier(ids: list[int], block: list[int]) -> list[int]:
    """`ids` with every occurrence of `block` removed but the last."""
    out: list[int] = []
    index, last = 0, max(i for i in range(len(ids)) if ids[i : i + len(block)] == block)
    while index < len(ids):
        if index != last and ids[index : index + len(block)] == block:
            index += len(block)
            continue
        out.append(ids[index])
        index += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    tokenizer = load_tokenizer(bundled_tokenizer_dir())
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    rng = random.Random(0)
    system = "You are a helpful assistant in a team chat."
    messages = [{"role": "system", "content": system}]
    history = TokenHistory()
    history.append("system", chat_format.message("system", system), text=system, turn_index=-1, seq=-1)
    for turn in range(args.turns):
        question, answer = rng.choice(USER), rng.choice(ASSISTANT)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        history.append("user", chat_format.message("user", question), text=question, turn_index=turn, seq=2 * turn)
        reply_body = tokenizer.encode(answer, add_special_tokens=False)
        history.append("assistant", chat_format.reply(reply_body), text=answer, turn_index=turn, seq=2 * turn + 1)
    question = "那明天呢？"
    naive_messages = [*messages, {"role": "user", "content": question}]

    def naive() -> list[int]:
        encoded = tokenizer.apply_chat_template(
            naive_messages, add_generation_prompt=True, enable_thinking=False, tokenize=True
        )
        assert isinstance(encoded, BatchEncoding)
        return list(encoded["input_ids"])

    new_message = chat_format.message("user", question)

    def ours() -> list[int]:
        return history.prompt(new_message, chat_format.generation_prompt)

    def ours_with_tokenizing() -> list[int]:
        return history.prompt(chat_format.message("user", question), chat_format.generation_prompt)

    assert ours() == ours_with_tokenizing()
    # The template re-renders earlier replies without the empty think block the model saw before
    # each of them; apart from that (kept on purpose: it keeps the prefix cache valid) the two agree.
    think = list(chat_format.generation_prompt[-4:])  # <think> \n\n </think> \n\n
    assert without_earlier(ours(), think) == naive(), "both ways must build the same prompt"
    naive_ms = median_ms(naive, max(args.repeat // 10, 10))
    ours_ms = median_ms(ours, args.repeat)
    ours_tok_ms = median_ms(ours_with_tokenizing, args.repeat)

    print(f"prompt for turn {args.turns + 1}: {len(ours())} tokens, {args.turns} earlier turns")
    print(f"{'variant':<44}{'median ms':>12}")
    print(f"{'naive (messages -> chat template -> tokenize)':<44}{naive_ms:>12.3f}")
    print(f"{'ours (buffer slice + new message ids)':<44}{ours_ms:>12.4f}")
    print(f"{'ours, tokenizing the new message too':<44}{ours_tok_ms:>12.4f}")
    print(
        f"speedup: {naive_ms / ours_ms:.0f}x assembly only, "
        f"{naive_ms / ours_tok_ms:.0f}x with the new message's tokenization"
    )
    print("seed article: 18 ms -> 2.3 ms (7.8x) for 100 turns")
    print(
        json.dumps(
            {
                "assembly_ms_100_turns": round(ours_ms, 4),
                "assembly_with_tokenize_ms": round(ours_tok_ms, 4),
                "naive_ms": round(naive_ms, 3),
                "speedup_vs_naive": round(naive_ms / ours_ms, 1),
                "prompt_tokens": len(ours()),
            }
        )
    )


if __name__ == "__main__":
    main()
