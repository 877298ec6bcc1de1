"""Engine benchmark: our engine against transformers on one seeded ~40M-parameter Qwen3 and on the
real SmolLM2-135M-Instruct.

    python bench/engine_bench.py            # full run (several minutes on a laptop CPU)
    python bench/engine_bench.py --quick    # fewer, shorter prompts: a smoke test
    python bench/engine_bench.py --data-dir DIR   # SmolLM2 from DIR/models, fetched there once (default: data)
    python bench/engine_bench.py --device cuda --no-smollm2   # on the GPU (bf16), the seeded Qwen3 alone
    OMP_NUM_THREADS=1 python bench/engine_bench.py   # every thread of every variant on one core

(OMP_NUM_THREADS rather than torch.set_num_threads: transformers' generate_batch() runs its loop
on a thread of its own, which would not see the latter.)

Throughput: 16 concurrent greedy requests (prompts 256-1024 tokens, 64 new tokens) through (a)
transformers generate() one at a time, (b) transformers generate_batch() continuous batching with
our block size, block count and token budget, (c) our engine, one token a step, (d) our engine with
n-gram speculative decoding (engine.num_speculative_tokens 4, the app's default). Multi-turn: 8
sessions x 6 turns, each turn = previous prompt + reply + a new 64-token user message; time to
first token of the last turn with our prefix cache on and off. Decode scaling: the time of a decode
step for 1, 4, 16 and 64 sequences. Decode attention: a decode step of 8 sequences at 256 to 2,048
tokens of context, the paged kernel against gathering for SDPA. Greedy head: a decode step of 1, 8
and 32 sequences on the demo model and on SmolLM2, the greedy pick (an 8-bit screen of the LM head,
then the few ids left exactly) against the LM head's logits and argmax. Projection libraries: a
decode step of 1 and 8 sequences on both models, each projection on the library the engine chose
for its weight shape as it started (MKL or oneDNN), against oneDNN for all of them. Background
work: the time to first token of a user's 40-token prompt sent 50 ms after a 1,500-token prompt of
background priority (a summary's), on both models, background prefill in short chunks
(engine.max_background_prefill_tokens) against chunks of the whole token budget. SmolLM2: (a), (b)
and (c) again on 16 chat prompts framed by the model's own chat template with the app's default
system prompt, 8 questions alone and 8 after pasted documentation (Python's own module docstrings,
cut to 256-1024 tokens); at most 64 new tokens, each reply ending at the model's end of turn as in
the app. Every variant runs where `--device` and `--dtype` put the engine (as engine.device and
engine.dtype: CUDA in bfloat16 where present, else CPU in float32); the paged kernel and the greedy
head are CPU kernels, their sections skipped elsewhere. The last line is JSON.
"""

import argparse
import importlib
import inspect
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import torch
from transformers import GenerationConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import BACKGROUND_PRIORITY, ChatFormat, EngineConfig, LLMEngine, RequestOutput, SamplingParams, StreamDelta
from engine.builtin_models import DEMO_MODEL, SMOLLM2_MODEL, ModelFetchError, ensure_smollm2
from engine.config import Device, DType
from engine.model import Linear
from engine.weights import resolve_device, resolve_dtype
from settings.sections import ContextSettings

T = TypeVar("T")
CausalLM = Qwen3ForCausalLM | LlamaForCausalLM

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


@dataclass(frozen=True)
class Question:
    text: str
    # a standard-library module whose documentation the user pastes above the question
    document: str | None = None


SYSTEM_PROMPT = ContextSettings().system_prompt  # the app's default

# Alone and after a document by turns, so that the quick run's first four hold both kinds; the
# documents grow down the list, as the token budgets they are cut to do.
QUESTIONS = (
    Question("What is the capital of France?"),
    Question("What is a heap, and which function gives me its smallest item?", "heapq"),
    Question("Explain in two sentences what a compiler does."),
    Question("Why is splitting lines on commas not enough to read a CSV file?", "csv"),
    Question("Write a haiku about the sea."),
    Question("Summarize what this library does in three bullet points.", "argparse"),
    Question("What is the difference between a list and a tuple in Python?"),
    Question("What can a shelf store, and what must its keys be?", "shelve"),
    Question("Give me three tips for running a productive team meeting."),
    Question("Which function should I call for a random identifier, and why not uuid1()?", "uuid"),
    Question("Why is the sky blue?"),
    Question("How do I create a cookie and print its Set-Cookie header?", "http.cookies"),
    Question("Write a short, polite reply declining a meeting invitation."),
    Question("What is the difference between the mean and the median?", "statistics"),
    Question("How does photosynthesis work, in simple terms?"),
    Question("How do I write a Python dictionary to a file as JSON?", "json"),
)


@dataclass(frozen=True)
class Decoding:
    """Greedy, the same for every variant."""

    new_tokens: int
    # False: every request generates new_tokens, past any EOS (random weights end no answer)
    stop_at_eos: bool

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.new_tokens, ignore_eos=not self.stop_at_eos)

    def hf_config(self, model: CausalLM) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.new_tokens,
            do_sample=False,
            eos_token_id=model.generation_config.eos_token_id if self.stop_at_eos else None,
            # never used: prompts run one at a time, or packed without padding by generate_batch()
            pad_token_id=0,
        )


@dataclass(frozen=True)
class Placement:
    """Where every variant runs: our engine's device and dtype, and transformers' model moved there."""

    device: torch.device
    dtype: torch.dtype

    @classmethod
    def resolve(cls, device: Device, dtype: DType) -> "Placement":
        resolved = resolve_device(device)
        return cls(resolved, resolve_dtype(dtype, resolved))

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} on {self.device.type}"

    def engine_options(self) -> dict[str, Any]:
        options: dict[str, Any] = dict(device=self.device.type, dtype=str(self.dtype).removeprefix("torch."))
        if self.device.type == "cuda":
            # The pool takes gpu_memory_fraction of the card less what is in use: this fraction
            # leaves it 2 GiB (~500k tokens here), however many engines are alive at once.
            free, total = torch.cuda.mem_get_info(self.device)
            options["gpu_memory_fraction"] = min(1.0, (total - free + 2 * 2**30) / total)
        return options

    def hf_model(self, model: CausalLM) -> CausalLM:
        """`model`, moved here in place (transformers types its own `to` too narrowly for mypy)."""
        torch.nn.Module.to(model, self.device, self.dtype)
        return model


@dataclass(frozen=True)
class Variant:
    name: str
    outputs: list[list[int]]
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.outputs)) / self.seconds


@dataclass(frozen=True)
class Throughput:
    sequential: Variant
    batch: Variant
    ours: Variant
    speculating: Variant

    @property
    def vs_sequential(self) -> float:
        return self.ours.tokens_per_s / self.sequential.tokens_per_s

    @property
    def vs_batch(self) -> float:
        return self.ours.tokens_per_s / self.batch.tokens_per_s

    @property
    def speculation_speedup(self) -> float:
        return self.speculating.tokens_per_s / self.ours.tokens_per_s

    @property
    def parity(self) -> bool:
        return self.ours.outputs == self.speculating.outputs == self.sequential.outputs

    def tokens_per_s(self) -> dict[str, float]:
        return {
            "hf_sequential": round(self.sequential.tokens_per_s, 1),
            "hf_generate_batch": round(self.batch.tokens_per_s, 1),
            "ours": round(self.ours.tokens_per_s, 1),
            "ours_speculating": round(self.speculating.tokens_per_s, 1),
        }


def make_checkpoint(path: Path) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**BENCH_CONFIG)).eval()
    model.save_pretrained(path)
    return model


def random_tokens(generator: torch.Generator, length: int, vocab_size: int = BENCH_CONFIG["vocab_size"]) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def random_prompts(work: Workload) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(work.min_prompt, work.max_prompt + 1, (work.num_requests,), generator=generator).tolist()
    return [random_tokens(generator, n) for n in lengths]


def chat_prompts(chat_format: ChatFormat, work: Workload) -> list[list[int]]:
    """The first `work.num_requests` questions, as the app frames them; the documents are cut to
    budgets spread evenly from the workload's shortest prompt to its longest."""
    questions = QUESTIONS[: work.num_requests]
    num_pasted = sum(q.document is not None for q in questions)
    budgets = iter(torch.linspace(work.min_prompt, work.max_prompt, num_pasted).round().int().tolist())
    return [
        chat_format.prompt(SYSTEM_PROMPT, q.text)
        if q.document is None
        else pasted_prompt(chat_format, q.text, q.document, next(budgets))
        for q in questions
    ]


def pasted_prompt(chat_format: ChatFormat, question: str, module: str, budget: int) -> list[int]:
    """The question after as many of the module documentation's first lines as fit in `budget` tokens."""
    lines = (inspect.getdoc(importlib.import_module(module)) or "").splitlines()
    for num_lines in range(len(lines), 0, -1):
        document = "\n".join(lines[:num_lines])
        prompt = chat_format.prompt(SYSTEM_PROMPT, f"{document}\n\n{question}")
        if len(prompt) <= budget:
            return prompt
    raise ValueError(f"not one line of {module}'s documentation fits in {budget} tokens with the question")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def hf_sequential(model: CausalLM, prompts: list[list[int]], decoding: Decoding) -> list[list[int]]:
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            input_ids = torch.tensor([prompt], device=model.device)
            generated = model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=decoding.hf_config(model)
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def hf_prefill(model: CausalLM, prompts: list[list[int]]) -> None:
    """The prompts' forward passes alone: the part of (a) that batching cannot shorten."""
    with torch.inference_mode():
        for prompt in prompts:
            model(torch.tensor([prompt], device=model.device), logits_to_keep=1)


def hf_generate_batch(model: CausalLM, prompts: list[list[int]], decoding: Decoding) -> list[list[int]]:
    batching = ContinuousBatchingConfig(
        page_size=BLOCK_SIZE, num_blocks=KV_CACHE_TOKENS // BLOCK_SIZE, max_batch_tokens=MAX_BATCHED_TOKENS
    )
    with torch.inference_mode():
        outputs = model.generate_batch(
            prompts, generation_config=decoding.hf_config(model), continuous_batching_config=batching
        )
    return [outputs[f"req_{i}"].generated_tokens for i in range(len(prompts))]


def ours(engine: LLMEngine, prompts: list[list[int]], decoding: Decoding) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, decoding.params())]


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


def build_engine(
    model: str | Path,
    placement: Placement,
    data_dir: str = EngineConfig.data_dir,
    prefix_caching: bool = True,
    num_speculative_tokens: int = 0,
) -> LLMEngine:
    """One token a step unless `num_speculative_tokens`: (a), (b) and (c) do the same work."""
    engine = LLMEngine.from_pretrained(
        str(model),
        **placement.engine_options(),
        data_dir=data_dir,
        block_size=BLOCK_SIZE,
        kv_cache_tokens=KV_CACHE_TOKENS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_num_seqs=64,
        enable_prefix_caching=prefix_caching,
        num_speculative_tokens=num_speculative_tokens,
    ).start()
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    return engine


def throughput(
    engines: tuple[LLMEngine, LLMEngine],
    hf_model: CausalLM,
    prompts: list[list[int]],
    decoding: Decoding,
    profile: bool,
) -> Throughput:
    """The prompts through (a), (b), (c) and (d), the last two on `engines`; shuts them down once done."""
    engine, speculating_engine = engines
    lengths = [len(p) for p in prompts]
    print(
        f"throughput: {len(prompts)} concurrent requests, prompts {min(lengths)}-{max(lengths)} tokens "
        f"({sum(lengths)} in all), {'at most ' if decoding.stop_at_eos else ''}{decoding.new_tokens} new tokens "
        "each, greedy"
    )
    hf_sequential(hf_model, prompts[:1], Decoding(2, decoding.stop_at_eos))
    sequential = Variant(
        "(a) transformers generate(), one at a time", *timed(lambda: hf_sequential(hf_model, prompts, decoding))
    )
    hf_generate_batch(hf_model, prompts[:1], Decoding(2, decoding.stop_at_eos))
    batch = Variant("(b) transformers generate_batch()", *timed(lambda: hf_generate_batch(hf_model, prompts, decoding)))
    num_warmup_steps = len(engine.core.metrics.steps)
    # all threads: the engine's ops run on its loop thread, which the profiler skips by default
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True),
    )
    with profiler if profile else nullcontext() as prof:
        ours_variant = Variant("(c) our LLMEngine", *timed(lambda: ours(engine, prompts, decoding)))
    if profile:
        assert prof is not None
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    batch_size = engine.figures().activity.batch_size
    steps = list(engine.core.metrics.steps)[num_warmup_steps:]
    engine.shutdown()
    speculating = Variant(
        "(d) our LLMEngine, n-gram speculation", *timed(lambda: ours(speculating_engine, prompts, decoding))
    )
    drafts = speculating_engine.figures().activity.draft_tokens
    speculating_engine.shutdown()
    _, prefill_s = timed(lambda: hf_prefill(hf_model, prompts))
    result = Throughput(sequential, batch, ours_variant, speculating)

    print(f"\n{'variant':<46} {'seconds':>9} {'tokens':>7} {'tokens/s':>10}  prompts with (a)'s tokens")
    for variant in (sequential, batch, ours_variant, speculating):
        same = sum(o == r for o, r in zip(variant.outputs, sequential.outputs, strict=True))
        print(
            f"{variant.name:<46} {variant.seconds:>9.2f} {sum(map(len, variant.outputs)):>7} "
            f"{variant.tokens_per_s:>10.1f}  {same}/{len(prompts)}"
        )
    print(
        f"ratio c/a: {result.vs_sequential:.2f}x (target >= 4)   ratio c/b: {result.vs_batch:.2f}x (target >= 1.5)\n"
        f"our engine: mean batch {batch_size.mean:.1f} sequences, {batch_size.mean_tokens:.0f} tokens per step\n"
        f"speculation d/c: {result.speculation_speedup:.2f}x, {drafts.accepted} of {drafts.proposed} draft tokens "
        "accepted"
    )
    ours_prefill_s = sum(s.duration_s for s in steps if s.num_batched_tokens > s.num_seqs)
    decode_steps = [s for s in steps if s.num_batched_tokens == s.num_seqs]
    num_generated = sum(map(len, sequential.outputs))
    print(
        f"profile: (a) spends {prefill_s:.1f} s in the prompts' forward passes alone and "
        f"{(sequential.seconds - prefill_s) / num_generated * 1e3:.0f} ms per generated token after them;\n"
        f"  (c) spends {ours_prefill_s:.1f} s in steps with prompt tokens (the same FLOPs) and "
        f"{statistics.fmean(s.duration_s for s in decode_steps) * 1e3:.0f} ms per decode-only step of "
        f"{statistics.fmean(s.num_seqs for s in decode_steps):.1f} sequences on average.\n"
        f"  Prefill compute does not batch away: c/a <= (a) / (c's prefill time) = "
        f"{sequential.seconds / ours_prefill_s:.1f}x on this machine."
    )
    return result


def smollm2_throughput(data_dir: Path, work: Workload, placement: Placement, profile: bool) -> Throughput:
    try:
        folder = ensure_smollm2(data_dir)
    except ModelFetchError as error:
        sys.exit(f"error: {error}")
    hf_model = placement.hf_model(LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    print(
        f"\nmodel: {SMOLLM2_MODEL} ({folder}), {sum(p.numel() for p in hf_model.parameters()) / 1e6:.1f}M "
        f"parameters, Llama, hidden 576, 30 layers, 9 query / 3 KV heads, {placement}"
    )
    engines = (
        build_engine(SMOLLM2_MODEL, placement, str(data_dir)),
        build_engine(SMOLLM2_MODEL, placement, str(data_dir), True, 4),
    )
    chat_format = engines[0].chat_format()
    prompts = chat_prompts(chat_format, work)
    result = throughput(engines, hf_model, prompts, Decoding(work.new_tokens, stop_at_eos=True), profile)
    print("the first two replies:")
    for question, answer in zip(QUESTIONS[:2], result.ours.outputs, strict=False):
        print(f"  {question.text!r} -> {chat_format.decode(answer)!r}")
    return result


def multiturn(path: Path, work: Workload, placement: Placement) -> dict:
    last_prompt = work.first_turn + (work.turns - 1) * (work.reply_tokens + work.user_tokens)
    print(
        f"\nmulti-turn: {work.sessions} sessions x {work.turns} turns, {work.user_tokens}-token user messages, "
        f"{work.reply_tokens}-token replies; the last prompt has {last_prompt} tokens"
    )
    ttfts, replies, hit_rates = {}, {}, {}
    for caching in (True, False):
        engine = build_engine(path, placement, prefix_caching=caching)
        ttfts[caching], replies[caching] = multiturn_last_ttft(engine, work, seed=2)
        hit_rates[caching] = engine.figures().kv_cache.prefix_hit_rate
        engine.shutdown()
    print(f"{'prefix cache':<14} {'last-turn TTFT (s)':>20} {'hit rate':>10}")
    for caching in (True, False):
        print(f"{'on' if caching else 'off':<14} {ttfts[caching]:>20.3f} {hit_rates[caching]:>10.1%}")
    result = {"speedup": ttfts[False] / ttfts[True], "parity": replies[True] == replies[False]}
    print(f"TTFT speedup: {result['speedup']:.2f}x (target >= 5); same replies either way: {result['parity']}")
    return result


def decode_scaling(path: Path, quick: bool, placement: Placement) -> dict[str, float]:
    """Decode steps alone, for batches of 1 to 64 sequences of 128-token prompts."""
    batches = (1, 4) if quick else (1, 4, 16, 64)
    engine = build_engine(path, placement)
    generator = torch.Generator().manual_seed(5)
    print("\ndecode scaling: 128-token prompts, 32 new tokens each")
    print(f"{'sequences':>10} {'ms a step':>10} {'tokens/s':>10}")
    tokens_per_s = {}
    for batch in batches:
        num_steps = len(engine.core.metrics.steps)
        ours(engine, [random_tokens(generator, 128) for _ in range(batch)], Decoding(32, stop_at_eos=False))
        steps = list(engine.core.metrics.steps)[num_steps:]
        step_s = statistics.median(s.duration_s for s in steps if s.num_batched_tokens == s.num_seqs == batch)
        tokens_per_s[str(batch)] = round(batch / step_s, 1)
        print(f"{batch:>10} {step_s * 1e3:>10.1f} {batch / step_s:>10.1f}")
    engine.shutdown()
    return tokens_per_s


def alternated_decode_steps(
    engine: LLMEngine, prompts: list[list[int]], variants: tuple[Callable[[], None], Callable[[], None]]
) -> tuple[tuple[float, float], bool]:
    """16 decode steps of `prompts` after calling `variants[0]`, then after `variants[1]`, 3 times
    over: the median seconds a step with each, and whether both gave the same tokens."""
    step_s: dict[int, list[float]] = {0: [], 1: []}
    outputs = {}
    for variant in (0, 1) * 3:
        variants[variant]()
        num_steps = len(engine.core.metrics.steps)
        outputs[variant] = ours(engine, prompts, Decoding(16, stop_at_eos=False))
        steps = list(engine.core.metrics.steps)[num_steps:]
        step_s[variant] += [s.duration_s for s in steps if s.num_batched_tokens == s.num_seqs == len(prompts)]
    return (statistics.median(step_s[0]), statistics.median(step_s[1])), outputs[0] == outputs[1]


def decode_steps_by_batch(
    engine: LLMEngine,
    batches: tuple[int, ...],
    variants: tuple[Callable[[], None], Callable[[], None]],
    labels: tuple[str, str],
    seed: int,
) -> tuple[dict[str, float], bool]:
    """Decode steps of each batch of 128-token prompts with `variants` alternated (a row printed
    each): how many times faster the first's steps are, by batch, and whether both gave the same tokens."""
    generator = torch.Generator().manual_seed(seed)
    print(f"{'sequences':>10} {labels[0]:>10} {labels[1]:>10} {'speedup':>10}")
    speedups, parity = {}, True
    for batch in batches:
        prompts = [random_tokens(generator, 128) for _ in range(batch)]
        ours(engine, prompts, Decoding(1, stop_at_eos=False))
        (first_s, second_s), same = alternated_decode_steps(engine, prompts, variants)
        parity = parity and same
        speedups[str(batch)] = round(second_s / first_s, 2)
        print(f"{batch:>10} {first_s * 1e3:>10.1f} {second_s * 1e3:>10.1f} {second_s / first_s:>9.2f}x")
    return speedups, parity


def runner_attribute(engine: LLMEngine, name: str, value: object) -> Callable[[], None]:
    return lambda: setattr(engine.core.runner, name, value)


def decode_attention(path: Path, quick: bool, placement: Placement) -> dict:
    """Decode steps of 8 sequences at growing contexts: attention read in place by the paged kernel,
    against the KV gathered into padded buckets for SDPA. One engine, the two alternated 3 times."""
    contexts = (256,) if quick else (256, 1024, 2048)
    engine = build_engine(path, placement)
    if not engine.core.runner.paged_kernel:
        print(
            f"\ndecode attention: the paged kernel serves float32 on CPU, built by a C compiler; {placement}: skipped"
        )
        engine.shutdown()
        return {"speedup_by_context": {}, "parity": True}
    generator = torch.Generator().manual_seed(6)
    print("\ndecode attention: 8 sequences, 16 new tokens each; median ms a decode step")
    print(f"{'context':>10} {'kernel':>10} {'gathered':>10} {'speedup':>10}")
    speedups, parity = {}, True
    for context in contexts:
        prompts = [random_tokens(generator, context) for _ in range(8)]
        # the prompts in the prefix cache first, so that every run starts its 8 decodes together
        ours(engine, prompts, Decoding(1, stop_at_eos=False))
        variants = (runner_attribute(engine, "paged_kernel", True), runner_attribute(engine, "paged_kernel", False))
        (kernel_s, gathered_s), same = alternated_decode_steps(engine, prompts, variants)
        parity = parity and same
        speedups[str(context)] = round(gathered_s / kernel_s, 2)
        print(f"{context:>10} {kernel_s * 1e3:>10.1f} {gathered_s * 1e3:>10.1f} {gathered_s / kernel_s:>9.2f}x")
    print(f"same tokens either way: {parity}")
    engine.shutdown()
    return {"speedup_by_context": speedups, "parity": parity}


def greedy_head(data_dir: Path, quick: bool, placement: Placement, models: tuple[str, ...]) -> dict:
    """Decode steps of 1 to 32 sequences, one token each: the LM head and the greedy pick
    (greedy_head.c: an 8-bit screen, then the few ids left exactly) against the LM head's logits
    (MKL's or oneDNN's, as the engine chose) and argmax, on the demo model and on SmolLM2. One
    engine each, the two alternated 3 times."""
    batches = (8,) if quick else (1, 8, 32)
    skipped = f"\ngreedy head: the kernel serves float32 on CPU, built by a C compiler; {placement}: skipped"
    if placement.device.type != "cpu":  # no engine to build
        print(skipped)
        return {"speedup_by_batch": {}, "parity": True}
    speedups: dict[str, dict[str, float]] = {}
    parity = True
    for model in models:
        engine = build_engine(model, placement, str(data_dir))
        head = engine.core.runner.greedy_head
        if head is None:
            print(skipped)
            engine.shutdown()
            return {"speedup_by_batch": {}, "parity": True}
        kind = "screened in 8 bits" if head.screened else "float32 alone"
        print(f"\ngreedy head, {model}: LM head {head.vocab_size:,} x {head.hidden_size}, {kind}; median ms a step")
        variants = (runner_attribute(engine, "greedy_head", head), runner_attribute(engine, "greedy_head", None))
        speedups[model], same = decode_steps_by_batch(engine, batches, variants, ("kernel", "logits"), seed=7)
        parity = parity and same
        engine.shutdown()
    print(f"same tokens either way: {parity}")
    return {"speedup_by_batch": speedups, "parity": parity}


def use_libraries(engine: LLMEngine, projections: list[Linear], rows: list[int], head_rows: int) -> Callable[[], None]:
    """Sets each projection's `mkl_max_rows` (engine/cpu_linear.py) to `rows`, the LM head's to `head_rows`."""
    model = engine.core.runner.model

    def set_rows() -> None:
        for module, most in zip(projections, rows, strict=True):
            module.mkl_max_rows = most
        model.lm_head_mkl_max_rows = head_rows

    return set_rows


def projection_libraries(data_dir: Path, quick: bool, placement: Placement, models: tuple[str, ...]) -> dict:
    """Decode steps of 1 and 8 sequences, one token each: every projection on the library the
    engine chose for its weight shape as it started (engine/cpu_linear.py), against all of them on
    oneDNN, the code before that choice. One engine each, the two alternated 3 times."""
    batches = (8,) if quick else (1, 8)
    if placement.device.type != "cpu" or placement.dtype != torch.float32:
        print(f"\nprojection libraries: MKL or oneDNN serve float32 on CPU; {placement}: skipped")
        return {"speedup_by_batch": {}, "parity": True}
    speedups: dict[str, dict[str, float]] = {}
    parity = True
    for model in models:
        engine = build_engine(model, placement, str(data_dir))
        causal_lm = engine.core.runner.model
        projections = [module for module in causal_lm.modules() if isinstance(module, Linear)]
        rows = [module.mkl_max_rows for module in projections]
        chosen = use_libraries(engine, projections, rows, causal_lm.lm_head_mkl_max_rows)
        onednn = use_libraries(engine, projections, [0] * len(projections), 0)
        print(f"\nprojection libraries, {model}: the engine's choice against oneDNN's alone; median ms a decode step")
        speedups[model], same = decode_steps_by_batch(engine, batches, (chosen, onednn), ("chosen", "oneDNN"), seed=8)
        parity = parity and same
        engine.shutdown()
    print(f"same tokens either way: {parity}")
    return {"speedup_by_batch": speedups, "parity": parity}


def background_work(data_dir: Path, quick: bool, placement: Placement, models: tuple[str, ...]) -> dict:
    """A user's 40-token prompt sent 50 ms after a 1,500-token one of background priority (what a
    compression's summary sends), greedy: the user's time to first token and the background
    prompt's time to its end, with background prefill in chunks of at most
    `max_background_prefill_tokens` and none while a user's prompt prefills (the engine's way)
    against chunks of the whole token budget (MAX_BATCHED_TOKENS), as any prompt's. One engine
    each, alternated."""
    trials = 2 if quick else 6
    print(
        "\nbackground work: a user's 40-token prompt sent 50 ms after a 1,500-token prompt of background priority; "
        f"medians of {trials} alternated"
    )
    print(f"{'model':>32} {'chunks':>8} {'user TTFT ms':>13} {'background ms':>14}")
    speedups: dict[str, float] = {}
    slowdowns: dict[str, float] = {}
    for model in models:
        engine = build_engine(model, placement, str(data_dir))
        vocab_size = engine.core.runner.model.arch.vocab_size
        generator = torch.Generator().manual_seed(9)
        seconds: dict[int, list[tuple[float, float]]] = {}
        for chunk in (EngineConfig.max_background_prefill_tokens, MAX_BATCHED_TOKENS) * trials:
            engine.core.scheduler.max_background_prefill_tokens = chunk
            background, user = random_tokens(generator, 1500, vocab_size), random_tokens(generator, 40, vocab_size)
            seconds.setdefault(chunk, []).append(user_ttft_beside(engine, background, user))
        rows = {chunk: tuple(statistics.median(s[i] for s in runs) for i in (0, 1)) for chunk, runs in seconds.items()}
        for chunk, (ttft_s, background_s) in rows.items():
            print(f"{model:>32} {chunk:>8} {ttft_s * 1e3:>13.0f} {background_s * 1e3:>14.0f}")
        (short_ttft, short_background), (whole_ttft, whole_background) = rows.values()
        speedups[model] = round(whole_ttft / short_ttft, 2)
        slowdowns[model] = round(short_background / whole_background, 2)
        engine.shutdown()
    return {"user_ttft_speedup": speedups, "background_slowdown": slowdowns}


def user_ttft_beside(engine: LLMEngine, background: list[int], user: list[int]) -> tuple[float, float]:
    """Seconds from sending `user` to its first token, and from sending `background` to its end."""
    user_done, background_done = threading.Event(), threading.Event()
    times: dict[str, float] = {}

    def on_user(delta: StreamDelta, output: RequestOutput | None) -> None:
        times.setdefault("first", time.perf_counter())
        if output is not None:
            user_done.set()

    def on_background(delta: StreamDelta, output: RequestOutput | None) -> None:
        if output is not None:
            times["done"] = time.perf_counter()
            background_done.set()

    started = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    engine.add_request(background, params, priority=BACKGROUND_PRIORITY, callback=on_background)
    time.sleep(0.05)
    sent = time.perf_counter()
    engine.add_request(user, SamplingParams(temperature=0.0, max_tokens=4), callback=on_user)
    user_done.wait()
    background_done.wait()
    return times["first"] - sent, times["done"] - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small workload, for a smoke test")
    parser.add_argument("--profile", action="store_true", help="print where our engine spends its time")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(EngineConfig.data_dir),
        help=f"engine.data_dir (default {EngineConfig.data_dir}): SmolLM2 is fetched into its models/ folder once",
    )
    parser.add_argument("--device", default=EngineConfig.device, choices=get_args(Device), help="as engine.device")
    parser.add_argument("--dtype", default=EngineConfig.dtype, choices=get_args(DType), help="as engine.dtype")
    parser.add_argument("--no-smollm2", action="store_true", help="the seeded Qwen3 alone: no SmolLM2 sections")
    args = parser.parse_args()
    placement = Placement.resolve(args.device, args.dtype)
    logging.basicConfig(level=logging.ERROR)
    torch.set_grad_enabled(False)
    work = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-qwen3"
        hf_model = placement.hf_model(make_checkpoint(path))
        print(
            f"model: seeded Qwen3, {sum(p.numel() for p in hf_model.parameters()) / 1e6:.1f}M parameters, hidden 512, "
            f"8 layers, 8 query / 2 KV heads, {placement}, {torch.get_num_threads()} CPU threads"
        )
        decoding = Decoding(work.new_tokens, stop_at_eos=False)
        engines = build_engine(path, placement), build_engine(path, placement, num_speculative_tokens=4)
        speed = throughput(engines, hf_model, random_prompts(work), decoding, args.profile)
        turns = multiturn(path, work, placement)
        decode = decode_scaling(path, args.quick, placement)
        attention = decode_attention(path, args.quick, placement)
    models = (DEMO_MODEL,) if args.no_smollm2 else (DEMO_MODEL, SMOLLM2_MODEL)
    head = greedy_head(args.data_dir, args.quick, placement, models)
    libraries = projection_libraries(args.data_dir, args.quick, placement, models)
    background = background_work(args.data_dir, args.quick, placement, models)
    summary: dict[str, Any] = {
        "placement": str(placement),
        "throughput_vs_hf_sequential": round(speed.vs_sequential, 2),
        "throughput_vs_hf_generate_batch": round(speed.vs_batch, 2),
        "speculation_speedup": round(speed.speculation_speedup, 2),
        "multiturn_ttft_speedup": round(turns["speedup"], 2),
        "parity": speed.parity and turns["parity"],
        "decode_tokens_per_s_by_batch": decode,
        "decode_attention_kernel_speedup_by_context": attention["speedup_by_context"],
        "decode_attention_parity": attention["parity"],
        "greedy_head_speedup_by_batch": head["speedup_by_batch"],
        "greedy_head_parity": head["parity"],
        "projection_libraries_speedup_by_batch": libraries["speedup_by_batch"],
        "projection_libraries_parity": libraries["parity"],
        "background_user_ttft_speedup": background["user_ttft_speedup"],
        "background_prefill_slowdown": background["background_slowdown"],
    }
    if not args.no_smollm2:
        smollm2 = smollm2_throughput(args.data_dir, work, placement, args.profile)
        summary |= {
            "smollm2_throughput_vs_hf_sequential": round(smollm2.vs_sequential, 2),
            "smollm2_throughput_vs_hf_generate_batch": round(smollm2.vs_batch, 2),
            "smollm2_speculation_speedup": round(smollm2.speculation_speedup, 2),
            "smollm2_tokens_per_s": smollm2.tokens_per_s(),
            "smollm2_parity": smollm2.parity,
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
