"""Engine benchmark: our engine against transformers on one seeded ~40M-parameter Qwen3.

    python bench/engine_bench.py            # full run (several minutes on a laptop CPU)
    python bench/engine_bench.py --quick    # fewer, shorter prompts: a smoke test
    OMP_NUM_THREADS=1 python bench/engine_bench.py   # every thread of every variant on one core

(OMP_NUM_THREADS rather than torch.set_num_threads: transformers' generate_batch() runs its loop
on a thread of its own, which would not see the latter.)

Throughput: 16 concurrent greedy requests (prompts 256-1024 tokens, 64 new tokens) through
(a) transformers generate() one at a time, (b) transformers generate_batch() continuous batching
with our block size, block count and token budget, (c) our engine. Multi-turn: 8 sessions x 6
turns, each turn = previous prompt + reply + a new 64-token user message; time to first token of
the last turn with our prefix cache on and off. Decode scaling: the time of a decode step for 1,
4, 16 and 64 sequences. The last line is JSON.
"""

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import LLMEngine, SamplingParams

T = TypeVar("T")

BENCH_CONFIG: dict[str, Any] = dict(
    vocab_size=32768,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    initializer_range=0.1,
)
BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 1024
KV_CACHE_TOKENS = 32768


@dataclass
class Workload:
    num_requests: int
    min_prompt: int
    max_prompt: int
    new_tokens: int
    sessions: int
    turns: int
    first_turn: int
    user_tokens: int
    reply_tokens: int


FULL = Workload(16, 256, 1024, 64, 8, 6, 256, 64, 64)
QUICK = Workload(4, 64, 256, 16, 2, 3, 64, 32, 16)


def make_checkpoint(path: Path) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**BENCH_CONFIG)).eval()
    model.save_pretrained(path)
    return model


def random_tokens(generator: torch.Generator, length: int) -> list[int]:
    return torch.randint(0, BENCH_CONFIG["vocab_size"], (length,), generator=generator).tolist()


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def hf_sequential(model: Qwen3ForCausalLM, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            input_ids = torch.tensor([prompt])
            generated = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def hf_prefill(model: Qwen3ForCausalLM, prompts: list[list[int]]) -> None:
    """The prompts' forward passes alone: the part of (a) that batching cannot shorten."""
    with torch.inference_mode():
        for prompt in prompts:
            model(torch.tensor([prompt]), logits_to_keep=1)


def hf_generate_batch(model: Qwen3ForCausalLM, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    generation_config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(
        page_size=BLOCK_SIZE, num_blocks=KV_CACHE_TOKENS // BLOCK_SIZE, max_batch_tokens=MAX_BATCHED_TOKENS
    )
    with torch.inference_mode():
        outputs = model.generate_batch(
            prompts, generation_config=generation_config, continuous_batching_config=batching
        )
    return [outputs[f"req_{i}"].generated_tokens for i in range(len(prompts))]


def ours(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    outputs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    return [o.token_ids for o in outputs]


def multiturn_last_ttft(engine: LLMEngine, work: Workload, seed: int) -> tuple[float, list[list[int]]]:
    """Runs the sessions turn by turn (all sessions of a turn together); returns the mean TTFT of
    the last turn and every reply."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [random_tokens(generator, work.first_turn) for _ in range(work.sessions)]
    params = SamplingParams(max_tokens=work.reply_tokens, ignore_eos=True)
    replies = []
    for turn in range(work.turns):
        outputs = engine.generate(prompts, params)
        replies += [o.token_ids for o in outputs]
        if turn == work.turns - 1:
            ttfts = [o.ttft_s for o in outputs if o.ttft_s is not None]
            assert len(ttfts) == len(outputs)
            return statistics.fmean(ttfts), replies
        prompts = [
            p + o.token_ids + random_tokens(generator, work.user_tokens) for p, o in zip(prompts, outputs, strict=True)
        ]
    raise AssertionError("unreachable")


def build_engine(path: Path, prefix_caching: bool = True) -> LLMEngine:
    engine = LLMEngine.from_pretrained(
        str(path),
        block_size=BLOCK_SIZE,
        kv_cache_tokens=KV_CACHE_TOKENS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_num_seqs=64,
        enable_prefix_caching=prefix_caching,
    ).start()
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    return engine


def throughput(path: Path, hf_model: Qwen3ForCausalLM, work: Workload, profile: bool) -> dict:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(work.min_prompt, work.max_prompt + 1, (work.num_requests,), generator=generator).tolist()
    prompts = [random_tokens(generator, n) for n in lengths]
    print(
        f"throughput: {work.num_requests} concurrent requests, prompts {min(lengths)}-{max(lengths)} tokens, "
        f"{work.new_tokens} new tokens each, greedy"
    )
    hf_sequential(hf_model, prompts[:1], 2)
    reference, sequential_s = timed(lambda: hf_sequential(hf_model, prompts, work.new_tokens))
    hf_generate_batch(hf_model, prompts[:1], 2)
    batched, batch_s = timed(lambda: hf_generate_batch(hf_model, prompts, work.new_tokens))
    engine = build_engine(path)
    num_warmup_steps = len(engine.core.metrics.steps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else nullcontext() as prof:
        generated, ours_s = timed(lambda: ours(engine, prompts, work.new_tokens))
    if profile:
        assert prof is not None
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    batch_size = engine.figures().activity.batch_size
    steps = list(engine.core.metrics.steps)[num_warmup_steps:]
    engine.shutdown()
    _, prefill_s = timed(lambda: hf_prefill(hf_model, prompts))

    num_generated = work.num_requests * work.new_tokens
    print(f"\n{'variant':<46} {'seconds':>9} {'tokens/s':>10}  same tokens as (a)")
    for name, seconds, outputs in (
        ("(a) transformers generate(), one at a time", sequential_s, reference),
        ("(b) transformers generate_batch()", batch_s, batched),
        ("(c) our LLMEngine", ours_s, generated),
    ):
        print(f"{name:<46} {seconds:>9.2f} {num_generated / seconds:>10.1f}  {outputs == reference}")
    result = {"vs_sequential": sequential_s / ours_s, "vs_batch": batch_s / ours_s, "parity": generated == reference}
    print(
        f"ratio c/a: {result['vs_sequential']:.2f}x (target >= 4)   "
        f"ratio c/b: {result['vs_batch']:.2f}x (target >= 1.5)\n"
        f"our engine: mean batch {batch_size.mean:.1f} sequences, {batch_size.mean_tokens:.0f} tokens per step"
    )
    ours_prefill_s = sum(s.duration_s for s in steps if s.num_batched_tokens > s.num_seqs)
    decode_steps = [s.duration_s for s in steps if s.num_batched_tokens == s.num_seqs]
    print(
        f"profile: (a) spends {prefill_s:.1f} s in the prompts' forward passes alone and "
        f"{(sequential_s - prefill_s) / num_generated * 1e3:.0f} ms per generated token after them;\n"
        f"  (c) spends {ours_prefill_s:.1f} s in steps with prompt tokens (the same FLOPs) and "
        f"{statistics.fmean(decode_steps) * 1e3:.0f} ms per decode-only step of ~{work.num_requests} sequences.\n"
        f"  Prefill compute does not batch away: c/a <= (a) / (c's prefill time) = "
        f"{sequential_s / ours_prefill_s:.1f}x on this machine."
    )
    return result


def multiturn(path: Path, work: Workload) -> dict:
    last_prompt = work.first_turn + (work.turns - 1) * (work.reply_tokens + work.user_tokens)
    print(
        f"\nmulti-turn: {work.sessions} sessions x {work.turns} turns, {work.user_tokens}-token user messages, "
        f"{work.reply_tokens}-token replies; the last prompt has {last_prompt} tokens"
    )
    ttfts, replies, hit_rates = {}, {}, {}
    for caching in (True, False):
        engine = build_engine(path, prefix_caching=caching)
        ttfts[caching], replies[caching] = multiturn_last_ttft(engine, work, seed=2)
        hit_rates[caching] = engine.figures().kv_cache.prefix_hit_rate
        engine.shutdown()
    print(f"{'prefix cache':<14} {'last-turn TTFT (s)':>20} {'hit rate':>10}")
    for caching in (True, False):
        print(f"{'on' if caching else 'off':<14} {ttfts[caching]:>20.3f} {hit_rates[caching]:>10.1%}")
    result = {"speedup": ttfts[False] / ttfts[True], "parity": replies[True] == replies[False]}
    print(f"TTFT speedup: {result['speedup']:.2f}x (target >= 5); same replies either way: {result['parity']}")
    return result


def decode_scaling(path: Path, quick: bool) -> dict[str, float]:
    """Decode steps alone, for batches of 1 to 64 sequences of 128-token prompts."""
    batches = (1, 4) if quick else (1, 4, 16, 64)
    engine = build_engine(path)
    generator = torch.Generator().manual_seed(5)
    print("\ndecode scaling: 128-token prompts, 32 new tokens each")
    print(f"{'sequences':>10} {'ms a step':>10} {'tokens/s':>10}")
    tokens_per_s = {}
    for batch in batches:
        num_steps = len(engine.core.metrics.steps)
        ours(engine, [random_tokens(generator, 128) for _ in range(batch)], 32)
        steps = list(engine.core.metrics.steps)[num_steps:]
        step_s = statistics.median(s.duration_s for s in steps if s.num_batched_tokens == s.num_seqs == batch)
        tokens_per_s[str(batch)] = round(batch / step_s, 1)
        print(f"{batch:>10} {step_s * 1e3:>10.1f} {batch / step_s:>10.1f}")
    engine.shutdown()
    return tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small workload, for a smoke test")
    parser.add_argument("--profile", action="store_true", help="print where our engine spends its time")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_grad_enabled(False)
    work = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-qwen3"
        hf_model = make_checkpoint(path)
        print(
            f"model: seeded Qwen3, {sum(p.numel() for p in hf_model.parameters()) / 1e6:.1f}M parameters, hidden 512, "
            f"8 layers, 8 query / 2 KV heads, fp32 on CPU, {torch.get_num_threads()} threads"
        )
        speed = throughput(path, hf_model, work, args.profile)
        turns = multiturn(path, work)
        decode = decode_scaling(path, args.quick)
    summary = {
        "throughput_vs_hf_sequential": round(speed["vs_sequential"], 2),
        "throughput_vs_hf_generate_batch": round(speed["vs_batch"], 2),
        "multiturn_ttft_speedup": round(turns["speedup"], 2),
        "parity": speed["parity"] and turns["parity"],
        "decode_tokens_per_s_by_batch": decode,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
