"""Tensorized history: prompt assembly, resident memory, and engine admission of a long context.

    python bench/history_bench.py [--turns 100] [--repeat 200] [--sessions 2000] [--session-tokens 6000]

1. Assembly for turn 101 of a 100-turn conversation. Naive: keep a list of message dicts, and
   every turn render it with the chat template and tokenize the whole text. Ours: every message
   was tokenized once when it arrived; the prompt is a slice of the token buffer plus the new
   message and the generation prompt. Both produce the same ids (checked).
2. Resident memory of `--sessions` conversations of `--session-tokens` ids each (messages of
   20-180 tokens), measured with tracemalloc: as TokenHistory holds them, beside the same ids
   held as Python lists of ints.
3. Admission of a `--session-tokens` prompt whose context the previous turn left in the prefix
   cache: validation, the Sequence, and the scheduler's step that hashes its blocks, finds them
   cached and allocates the rest. No model runs. The prompt as an array (what TokenHistory gives)
   beside the same prompt as a list.

Prints medians, the ratios, and a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
from transformers import BatchEncoding, PreTrainedTokenizerBase

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.history import TokenHistory
from engine import ChatFormat, EngineConfig, SamplingParams
from engine.builtin_models import bundled_tokenizer_dir
from engine.checkpoints import load_tokenizer
from engine.kv_pool import KVPool, cdiv
from engine.request import InputProcessor
from engine.scheduler import Scheduler

VOCAB_SIZE = 151_936  # Qwen3's
T = TypeVar("T")

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


def random_messages(rng: np.random.Generator, num_tokens: int) -> list[np.ndarray]:
    """Messages of 20-180 random ids (100 on average) adding up to `num_tokens`."""
    ids = rng.integers(0, VOCAB_SIZE, size=num_tokens)
    bounds = np.cumsum(rng.integers(20, 181, size=num_tokens // 20 + 1))
    return np.split(ids, bounds[bounds < num_tokens])


def conversation(messages: list[np.ndarray]) -> TokenHistory:
    history = TokenHistory()
    for seq, ids in enumerate(messages):
        # Each message's ids as a tokenizer hands them over, a list of new ints; one shared text:
        # the figure is the ids' and the message index's, not the texts'.
        history.append("user" if seq % 2 == 0 else "assistant", ids.tolist(), text="", turn_index=seq // 2, seq=seq)
    return history


def id_list(messages: list[np.ndarray]) -> list[int]:
    ids: list[int] = []
    for piece in messages:
        ids.extend(piece.tolist())
    return ids


def traced_bytes(build: Callable[[], T]) -> tuple[T, int]:
    """What `build` returns and the bytes it leaves allocated."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return built, after - before


def resident_memory(num_sessions: int, session_tokens: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    sessions = [random_messages(rng, session_tokens) for _ in range(num_sessions)]
    num_tokens = num_sessions * session_tokens
    histories, history_bytes = traced_bytes(lambda: [conversation(messages) for messages in sessions])
    lists, list_bytes = traced_bytes(lambda: [id_list(messages) for messages in sessions])
    assert all(list(map(int, history.token_ids)) == ids for history, ids in zip(histories, lists, strict=True))
    return {
        "ids_bytes_per_token": sum(history.nbytes for history in histories) / num_tokens,
        "history_bytes_per_token": history_bytes / num_tokens,
        "list_bytes_per_token": list_bytes / num_tokens,
        "history_mb": history_bytes / 2**20,
        "list_mb": list_bytes / 2**20,
    }


def admission(tokenizer: PreTrainedTokenizerBase, session_tokens: int, repeat: int) -> dict[str, float]:
    """Median ms to admit the next turn's prompt after the context's KV is cached, per prompt form."""
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    history = conversation(random_messages(np.random.default_rng(1), session_tokens))
    prompt = history.prompt(chat_format.message("user", "那明天呢？"), chat_format.generation_prompt)
    config = EngineConfig(kv_cache_tokens=2 * session_tokens)
    pool = KVPool(cdiv(config.kv_cache_tokens, config.block_size), config.block_size, enable_prefix_caching=True)
    scheduler = Scheduler(config, pool, config.kv_cache_tokens)
    inputs = InputProcessor(tokenizer, VOCAB_SIZE, config.kv_cache_tokens)
    params = SamplingParams(max_tokens=64)

    # the previous turn: the whole context computed, its full blocks left in the prefix cache
    previous = inputs.process(history.token_ids, params, None, None, None).seq
    scheduler.add(previous)
    while previous.num_computed_tokens < previous.num_tokens:
        scheduler.postprocess(scheduler.schedule())
    scheduler.finish(previous)

    def admit_ms(prompt_ids: list[int] | np.ndarray) -> float:
        """The median over `repeat` admissions, after one untimed; each ends untimed, its blocks
        back in the pool."""
        samples = []
        for _ in range(repeat + 1):
            started = time.perf_counter()
            seq = inputs.process(prompt_ids, params, None, None, None).seq
            scheduler.add(seq)
            scheduler.schedule()
            samples.append(time.perf_counter() - started)
            assert seq.num_cached_tokens >= previous.num_tokens - config.block_size
            scheduler.finish(seq)
        return statistics.median(samples[1:]) * 1000

    return {
        "prompt_tokens": len(prompt),
        "list_ms": admit_ms([int(token_id) for token_id in prompt]),
        "array_ms": admit_ms(prompt),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--session-tokens", type=int, default=6000)
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

    def ours() -> object:
        return history.prompt(new_message, chat_format.generation_prompt)

    def ours_with_tokenizing() -> object:
        return history.prompt(chat_format.message("user", question), chat_format.generation_prompt)

    prompt = [int(token_id) for token_id in ours()]  # type: ignore[attr-defined]
    assert prompt == [int(token_id) for token_id in ours_with_tokenizing()]  # type: ignore[attr-defined]
    # The template re-renders earlier replies without the empty think block the model saw before
    # each of them; apart from that (kept on purpose: it keeps the prefix cache valid) the two agree.
    think = list(chat_format.generation_prompt[-4:])  # <think> \n\n </think> \n\n
    assert without_earlier(prompt, think) == naive(), "both ways must build the same prompt"
    naive_ms = median_ms(naive, max(args.repeat // 10, 10))
    ours_ms = median_ms(ours, args.repeat)
    ours_tok_ms = median_ms(ours_with_tokenizing, args.repeat)

    memory = resident_memory(args.sessions, args.session_tokens)
    admitted = admission(tokenizer, args.session_tokens, args.repeat)

    print(f"prompt for turn {args.turns + 1}: {len(prompt)} tokens, {args.turns} earlier turns")
    print(f"{'variant':<44}{'median ms':>12}")
    print(f"{'naive (messages -> chat template -> tokenize)':<44}{naive_ms:>12.3f}")
    print(f"{'ours (buffer slice + new message ids)':<44}{ours_ms:>12.4f}")
    print(f"{'ours, tokenizing the new message too':<44}{ours_tok_ms:>12.4f}")
    print(
        f"speedup: {naive_ms / ours_ms:.0f}x assembly only, "
        f"{naive_ms / ours_tok_ms:.0f}x with the new message's tokenization"
    )
    print("seed article: 18 ms -> 2.3 ms (7.8x) for 100 turns")
    print(f"\n{args.sessions:,} sessions x {args.session_tokens:,} tokens resident")
    print(f"{'variant':<44}{'bytes/token':>12}{'MB':>10}")
    for label, key in (("TokenHistory (ids + message index)", "history"), ("the ids as Python lists of ints", "list")):
        print(f"{label:<44}{memory[f'{key}_bytes_per_token']:>12.2f}{memory[f'{key}_mb']:>10.1f}")
    print(f"{'  of which the int32 buffers':<44}{memory['ids_bytes_per_token']:>12.2f}")
    print(f"\nadmission of a {admitted['prompt_tokens']:,}-token prompt, its context in the prefix cache")
    print(f"{'variant':<44}{'median ms':>12}")
    print(f"{'prompt as a list of ints':<44}{admitted['list_ms']:>12.3f}")
    print(f"{'prompt as an int32 array (TokenHistory)':<44}{admitted['array_ms']:>12.3f}")
    print(
        json.dumps(
            {
                "assembly_ms_100_turns": round(ours_ms, 4),
                "assembly_with_tokenize_ms": round(ours_tok_ms, 4),
                "naive_ms": round(naive_ms, 3),
                "speedup_vs_naive": round(naive_ms / ours_ms, 1),
                "prompt_tokens": len(prompt),
                "ids_bytes_per_token": round(memory["ids_bytes_per_token"], 2),
                "history_bytes_per_token": round(memory["history_bytes_per_token"], 2),
                "list_bytes_per_token": round(memory["list_bytes_per_token"], 2),
                "resident_mb": round(memory["history_mb"], 1),
                "list_resident_mb": round(memory["list_mb"], 1),
                "admission_ms_list": round(admitted["list_ms"], 3),
                "admission_ms_array": round(admitted["array_ms"], 3),
                "admission_speedup": round(admitted["list_ms"] / admitted["array_ms"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
