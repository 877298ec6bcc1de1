import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, StreamDelta
from engine.cpu_claim import CpuClaim
from engine.metrics import RequestFigures
from engine.model_runner import SMALL_LAYER_BYTES
from engine.request import OutputCallback
from tests.engine.conftest import PARITY_CONFIGS, Checkpoint, save_checkpoint, tiny_model


@pytest.fixture(scope="module")
def engine(small_checkpoint: Checkpoint) -> Iterator[LLMEngine]:
    with LLMEngine.from_pretrained(
        str(small_checkpoint.path), kv_cache_tokens=4096, max_num_batched_tokens=256
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def bigram(bigram_checkpoint: Checkpoint) -> Iterator[LLMEngine]:
    with LLMEngine.from_pretrained(str(bigram_checkpoint.path), kv_cache_tokens=1024) as engine:
        yield engine


def prompt_of(length: int, seed: int = 0, vocab_size: int = 1000) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


class Collector:
    """Gathers every request's deltas and final output from the engine thread."""

    def __init__(self) -> None:
        self.deltas: dict[str, list[StreamDelta]] = {}
        self.outputs: dict[str, RequestOutput] = {}
        self.lock = threading.Condition()

    def __call__(self, delta: StreamDelta, output: RequestOutput | None) -> None:
        with self.lock:
            self.deltas.setdefault(output.request_id if output else "", []).append(delta)
            if output is not None:
                self.outputs[output.request_id] = output
                self.lock.notify_all()

    def wait(self, count: int) -> dict[str, RequestOutput]:
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.outputs) >= count, timeout=60)
            return dict(self.outputs)


def test_shared_prefix_is_reused_with_the_same_output(engine: LLMEngine, small_checkpoint: Checkpoint) -> None:
    prefix = prompt_of(200, seed=1)
    first, second = prefix + prompt_of(9, seed=2), prefix + prompt_of(13, seed=3)
    params = SamplingParams(max_tokens=16)
    engine.generate([first], params)
    cached = engine.generate([second], params)[0]
    assert cached.num_cached_tokens >= 200 // 16 * 16
    with LLMEngine.from_pretrained(
        str(small_checkpoint.path), kv_cache_tokens=1024, enable_prefix_caching=False
    ) as plain:
        uncached = plain.generate([second], params)[0]
    assert uncached.num_cached_tokens == 0
    assert cached.token_ids == uncached.token_ids == small_checkpoint.greedy(second, 16)


def test_pool_returns_to_its_initial_free_count_after_finish_and_abort(engine: LLMEngine) -> None:
    collector = Collector()
    ids = [
        engine.add_request(prompt_of(n, seed=n), SamplingParams(max_tokens=40), callback=collector)
        for n in (5, 50, 120, 300, 33, 250)
    ]
    for request_id in ids[::2]:
        engine.abort(request_id)
    outputs = collector.wait(len(ids))
    assert {outputs[i].finish_reason for i in ids[1::2]} == {"length"}
    assert all(outputs[i].finish_reason in ("abort", "length") for i in ids[::2])
    pool = engine.core.kv_pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_cnt == 0 for block in pool.blocks)


def test_seeded_sampling_is_reproducible_in_any_batch(engine: LLMEngine) -> None:
    prompt = prompt_of(40, seed=5)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24)
    alone = engine.generate([prompt], params)[0]
    batched = engine.generate([prompt_of(70, seed=6), prompt, prompt_of(3, seed=7)], params)[1]
    assert alone.token_ids == batched.token_ids
    other_seed = engine.generate([prompt], SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=24))[0]
    assert other_seed.token_ids != alone.token_ids


def test_top_k_1_equals_greedy_through_the_engine(engine: LLMEngine) -> None:
    prompts = [prompt_of(n, seed=n) for n in (4, 60)]
    greedy = engine.generate(prompts, SamplingParams(max_tokens=20))
    top1 = engine.generate(prompts, SamplingParams(temperature=0.8, top_k=1, seed=3, max_tokens=20))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_eos_stops_and_stays_out_of_the_text(
    bigram: LLMEngine, tokenizer: PreTrainedTokenizerBase, bigram_text: str, im_end: int
) -> None:
    output = bigram.generate([tokenizer.encode("Q")], SamplingParams())[0]
    assert output.finish_reason == "stop"
    assert output.token_ids[-1] == im_end
    assert output.text == bigram_text
    assert output.num_prompt_tokens == 1


def test_max_tokens_and_ignore_eos(bigram: LLMEngine, tokenizer: PreTrainedTokenizerBase, im_end: int) -> None:
    prompt = tokenizer.encode("Q")
    short = bigram.generate([prompt], SamplingParams(max_tokens=3))[0]
    assert (short.finish_reason, short.text, len(short.token_ids)) == ("length", "你好，世界", 3)
    long = bigram.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    assert long.finish_reason == "length" and len(long.token_ids) == 30 and im_end in long.token_ids


def test_stop_strings_and_stop_token_ids(bigram: LLMEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = tokenizer.encode("Q")
    across_tokens = bigram.generate([prompt], SamplingParams(stop=["世界！流", "never"]))[0]
    assert (across_tokens.finish_reason, across_tokens.text) == ("stop", "你好，")
    inside_a_character = bigram.generate([prompt], SamplingParams(stop=["𠀀"]))[0]
    assert inside_a_character.text == "你好，世界！流式输出测试：龘"
    stop_token = tokenizer.encode("测试")[0]
    by_token = bigram.generate([prompt], SamplingParams(stop_token_ids=[stop_token]))[0]
    assert (by_token.finish_reason, by_token.text, by_token.token_ids[-1]) == (
        "stop",
        "你好，世界！流式输出",
        stop_token,
    )


async def collect(stream: AsyncIterator[StreamDelta]) -> list[StreamDelta]:
    return [delta async for delta in stream]


async def test_chinese_streams_without_replacement_characters(
    bigram: LLMEngine, tokenizer: PreTrainedTokenizerBase, bigram_text: str, im_end: int
) -> None:
    deltas = await collect(bigram.stream(tokenizer.encode("Q"), SamplingParams()))
    assert all("\ufffd" not in d.text for d in deltas)
    assert any(d.token_ids and not d.text for d in deltas)  # a character split across tokens waited
    assert "".join(d.text for d in deltas) == bigram_text
    assert [t for d in deltas for t in d.token_ids] == [*tokenizer.encode(bigram_text), im_end]
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert (deltas[-1].finish_reason, deltas[-1].num_prompt_tokens) == ("stop", 1)
    with_stop = await collect(bigram.stream(tokenizer.encode("Q"), SamplingParams(stop=["测试："])))
    assert "".join(d.text for d in with_stop) == "你好，世界！流式输出"


async def test_cancelling_a_stream_aborts_it_and_frees_its_blocks(engine: LLMEngine) -> None:
    aborted_before = engine.figures().activity.finish_reasons.get("abort", 0)
    stream = engine.stream(prompt_of(100, seed=9), SamplingParams(max_tokens=200))
    async for delta in stream:
        if delta.token_ids:
            break
    await stream.aclose()
    for _ in range(200):
        if engine.figures().activity.finish_reasons.get("abort", 0) > aborted_before:
            break
        await asyncio.sleep(0.02)
    assert engine.figures().activity.finish_reasons["abort"] == aborted_before + 1
    assert engine.core.kv_pool.num_free_blocks == engine.core.kv_pool.num_blocks


def test_bad_input_raises_and_the_engine_keeps_serving(engine: LLMEngine, small_checkpoint: Checkpoint) -> None:
    good_prompt = prompt_of(50, seed=11)
    collector = Collector()
    good = engine.add_request(good_prompt, SamplingParams(max_tokens=48), callback=collector)
    zero_tokens = SamplingParams()
    zero_tokens.max_tokens = 0
    bad_inputs: list[tuple[list[int], SamplingParams, str]] = [
        ([], SamplingParams(), "empty"),
        ([1] * engine.max_model_len, SamplingParams(), "at most"),
        ([1, 2, 1000], SamplingParams(), "outside the vocabulary"),
        ([1, -3], SamplingParams(), "outside the vocabulary"),
        (["a", 2], SamplingParams(), "integer"),  # type: ignore[list-item]  # a token that is no integer, on purpose
        ([1, 2], zero_tokens, "max_tokens"),
    ]
    for prompt, params, message in bad_inputs:
        with pytest.raises(ValueError, match=message):
            engine.add_request(prompt, params)
        with pytest.raises(ValueError, match=message):
            engine.stream(prompt, params)
        with pytest.raises(ValueError, match=message):
            engine.generate([good_prompt, prompt], params)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    output = collector.wait(1)[good]
    assert output.finish_reason == "length"
    assert output.token_ids == small_checkpoint.greedy(good_prompt, 48)
    assert engine.figures().requests == RequestFigures(running=0, waiting=0, preemptions=0)


def test_figures_expose_the_engine(engine: LLMEngine) -> None:
    engine.generate([prompt_of(20, seed=12)], SamplingParams(max_tokens=4))
    figures = engine.figures()
    assert figures.kv_cache.blocks_total == engine.core.kv_pool.num_blocks
    assert 0 <= figures.kv_cache.prefix_hit_rate <= 1
    activity = figures.activity
    assert activity.ttft_s.count > 0 and activity.ttft_s.p50 is not None and activity.ttft_s.p50 > 0
    assert activity.generation_tokens_per_s > 0 and activity.batch_size.max >= 1
    assert figures.dtype == "float32" and figures.is_demo_model is False


def test_the_weights_take_no_gradients_and_what_is_built_from_them_keeps_no_graph(engine: LLMEngine) -> None:
    # the greedy head's screen of a parameter that required them kept its slices' autograd graph:
    # 1.7 GB an engine for SmolLM2, until the test workers ran out of memory
    runner = engine.core.runner
    assert not any(param.requires_grad for param in runner.model.parameters())
    assert runner.greedy_head is not None and runner.greedy_head.bounds.grad_fn is None


def threads_of_each_step(engine: LLMEngine, prompt_length: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Four greedy steps: (tokens, threads) of each step's layers, and the threads of its LM head."""
    runner = engine.core.runner
    layers: list[tuple[int, int]] = []
    heads: list[int] = []
    greedy_head = runner.greedy_head
    assert greedy_head is not None

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        heads.append(torch.get_num_threads())
        return greedy_head(hidden)

    hook = runner.model.register_forward_pre_hook(
        lambda _, args: layers.append((len(args[0]), torch.get_num_threads()))
    )
    runner.greedy_head = counted  # type: ignore[assignment]
    try:
        prompt = prompt_of(prompt_length, seed=13)
        engine.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    finally:
        hook.remove()
        runner.greedy_head = greedy_head
    return layers, heads


def test_a_small_models_layers_run_on_one_thread_and_its_lm_head_on_all(engine: LLMEngine) -> None:
    runner = engine.core.runner
    assert runner.layer_bytes <= SMALL_LAYER_BYTES and runner.num_threads == torch.get_num_threads()
    layers, heads = threads_of_each_step(engine, 40)
    assert layers == [(40, 1)] + [(1, 1)] * 3
    assert heads == [runner.num_threads] * 4


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """One layer of 8.9 MB: past SMALL_LAYER_BYTES, as a real model's are."""
    config = PARITY_CONFIGS["gqa4-untied-hd32"] | dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=1)
    return save_checkpoint(tmp_path_factory.mktemp("wide"), tiny_model(**config))


def test_a_step_of_a_few_tokens_leaves_a_core_to_the_app(wide_checkpoint: Checkpoint) -> None:
    with LLMEngine.from_pretrained(str(wide_checkpoint.path), kv_cache_tokens=1024) as engine:
        runner = engine.core.runner
        assert runner.layer_bytes > SMALL_LAYER_BYTES
        layers, heads = threads_of_each_step(engine, 40)
    assert layers == [(40, runner.num_threads)] + [(1, max(1, runner.num_threads - 1))] * 3
    assert heads == [runner.num_threads] * 4


def test_an_engine_in_bfloat16_runs_on_cpu(small_checkpoint: Checkpoint) -> None:
    """bfloat16, CUDA's default dtype, on CPU: the projections leave oneDNN, which has no bfloat16
    inner product without AVX512-BF16. (No parity: transformers' own batched and one-at-a-time
    generation differ in bfloat16.)"""
    with LLMEngine.from_pretrained(str(small_checkpoint.path), dtype="bfloat16", kv_cache_tokens=1024) as engine:
        assert engine.core.runner.kv_cache.dtype == torch.bfloat16
        outputs = engine.generate([prompt_of(n, seed=n) for n in (5, 40, 130)], SamplingParams(max_tokens=8))
    assert [(len(o.token_ids), o.finish_reason) for o in outputs] == [(8, "length")] * 3


def test_a_step_hands_on_a_new_requests_first_token_before_the_others_tokens(small_checkpoint: Checkpoint) -> None:
    engine = LLMEngine.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024)  # its core driven here
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def add(request_id: str, length: int) -> None:
        engine.core.add(engine.inputs.process(prompt_of(length, seed=length), params, request_id, None, None).seq)

    add("first", 10)
    add("second", 12)
    engine.core.step()
    add("new", 9)
    stepped = engine.core.step()
    (seq, token_ids), *_ = stepped
    assert (seq.request_id, len(token_ids)) == ("new", 1)
    assert {seq.request_id for seq, _ in stepped} == {"new", "first", "second"}


def test_after_outputs_ends_each_round_of_callbacks_the_last_one_included(small_checkpoint: Checkpoint) -> None:
    """What the engine's process sends the app: each round's deltas in one message."""
    pending: list[tuple[str, StreamDelta]] = []
    rounds: list[list[tuple[str, StreamDelta]]] = []
    changed = threading.Condition()

    def gather(request_id: str) -> OutputCallback:
        return lambda delta, output: pending.append((request_id, delta))

    def end_round() -> None:
        with changed:
            rounds.append(pending[:])
            pending.clear()
            changed.notify_all()

    def endings() -> dict[str, str | None]:
        return {request_id: delta.finish_reason for round_ in rounds for request_id, delta in round_ if delta.finished}

    engine = LLMEngine.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024).start(after_outputs=end_round)
    engine.add_request(prompt_of(5), SamplingParams(max_tokens=1000, ignore_eos=True), "long", callback=gather("long"))
    short = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for n in (7, 9, 11):
        engine.add_request(prompt_of(n, seed=n), short, f"r{n}", callback=gather(f"r{n}"))
    with changed:
        assert changed.wait_for(lambda: endings().keys() >= {"r7", "r9", "r11"}, timeout=60)
    engine.shutdown()

    assert not pending
    assert all(rounds)
    assert all(len({request_id for request_id, _ in round_}) == len(round_) for round_ in rounds)
    assert any(len(round_) >= 2 for round_ in rounds)  # the long request's tokens beside the others'
    # ended by the shutdown, its last delta in the last round; or by its length, if the machine stalled
    assert endings()["long"] == "length" or [delta.finish_reason for _, delta in rounds[-1]] == ["abort"]


def test_a_request_before_start_is_refused(small_checkpoint: Checkpoint) -> None:
    engine = LLMEngine.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=256)
    with pytest.raises(RuntimeError, match="not started"):
        engine.add_request(prompt_of(10), SamplingParams())
    assert not engine.is_running()


def test_shutdown_aborts_requests_in_flight(small_checkpoint: Checkpoint) -> None:
    engine = LLMEngine.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024).start()
    collector = Collector()
    request_id = engine.add_request(prompt_of(10), SamplingParams(max_tokens=500, ignore_eos=True), callback=collector)
    assert engine.is_running()
    engine.shutdown()
    assert not engine.is_running()
    assert collector.wait(1)[request_id].finish_reason in ("abort", "length")
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request(prompt_of(10), SamplingParams())


def test_a_claim_holds_the_engine_back_for_at_most_its_max_hold(small_checkpoint: Checkpoint) -> None:
    claim = CpuClaim(max_hold_s=0.01)
    engine = LLMEngine(EngineConfig(model=str(small_checkpoint.path), kv_cache_tokens=1024), claim)
    with engine, claim.held():  # never let go while the request runs
        output = engine.generate([prompt_of(10)], SamplingParams(max_tokens=8))[0]
    assert len(output.token_ids) == 8


def test_a_stopped_engine_gives_its_kv_pool_back(small_checkpoint: Checkpoint) -> None:
    """On a GPU the next engine in the process sizes its pool from the memory left free."""
    with LLMEngine.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024) as engine:
        engine.generate([prompt_of(10)], SamplingParams(max_tokens=4))
        assert engine.core.runner.kv_cache.numel() > 0
    assert engine.core.runner.kv_cache.numel() == 0
