"""EngineProcess: the app's engine in a process of its own, checked through its interface against
transformers' own greedy output and against what LLMEngine does in this process."""

import asyncio
import logging
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest
from transformers import PreTrainedTokenizerBase

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.cpu_claim import CpuClaim
from engine.engine_process import EngineProcess
from engine.metrics import RequestFigures
from engine.process_main import spawn
from tests.engine.conftest import Checkpoint
from tests.engine.test_engine import Collector, prompt_of


@pytest.fixture(scope="module")
def engine(small_checkpoint: Checkpoint) -> Iterator[EngineProcess]:
    with EngineProcess.from_pretrained(
        str(small_checkpoint.path), kv_cache_tokens=4096, max_num_batched_tokens=256
    ) as engine:
        yield engine


def test_greedy_output_is_transformers_own_through_the_process(
    engine: EngineProcess, small_checkpoint: Checkpoint
) -> None:
    prefix = prompt_of(200, seed=1)
    prompts = [prompt_of(7, seed=2), prefix + prompt_of(9, seed=3), prefix + prompt_of(13, seed=4)]
    outputs = engine.generate(prompts[:2], SamplingParams(max_tokens=24))
    outputs += engine.generate(prompts[2:], SamplingParams(max_tokens=24))
    assert [o.token_ids for o in outputs] == [small_checkpoint.greedy(p, 24) for p in prompts]
    assert outputs[2].num_cached_tokens >= 200 // 16 * 16  # the prefix cache lives on in the process
    assert outputs[2].num_prompt_tokens == len(prompts[2]) and outputs[2].ttft_s is not None


def test_a_stream_yields_what_generate_returns(engine: EngineProcess) -> None:
    prompt = prompt_of(30, seed=5)
    whole = engine.generate([prompt], SamplingParams(max_tokens=20))[0]

    async def stream() -> list[int]:
        return [
            token_id
            async for delta in engine.stream(prompt, SamplingParams(max_tokens=20))
            for token_id in delta.token_ids
        ]

    assert asyncio.run(stream()) == whole.token_ids


def test_the_engines_process_starts_no_step_while_the_app_claims_the_cpu(small_checkpoint: Checkpoint) -> None:
    config = EngineConfig(model=str(small_checkpoint.path), kv_cache_tokens=1024)
    with EngineProcess(spawn(config, CpuClaim(max_hold_s=60))) as engine:
        expected = engine.generate([prompt_of(10)], SamplingParams(max_tokens=4))[0].token_ids
        collector = Collector()
        with engine.claim_cpu():  # shared memory: the process reads what this one holds
            engine.add_request(prompt_of(10), SamplingParams(max_tokens=4), callback=collector)
            time.sleep(0.5)  # a step of the small model takes milliseconds
            assert collector.deltas == {}
        assert next(iter(collector.wait(1).values())).token_ids == expected


def test_text_and_stop_strings_are_as_in_this_process(
    bigram_checkpoint: Checkpoint, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode("Q")
    params = [SamplingParams(), SamplingParams(stop=["世界！流", "never"]), SamplingParams(max_tokens=3)]
    with LLMEngine.from_pretrained(str(bigram_checkpoint.path), kv_cache_tokens=1024) as here:
        expected = [here.generate([prompt], p)[0] for p in params]
    with EngineProcess.from_pretrained(str(bigram_checkpoint.path), kv_cache_tokens=1024) as there:
        outputs = [there.generate([prompt], p)[0] for p in params]
    assert [(o.text, o.finish_reason, o.token_ids) for o in outputs] == [
        (o.text, o.finish_reason, o.token_ids) for o in expected
    ]
    assert outputs[1].text == "你好，"


def test_bad_input_raises_at_once_and_the_process_keeps_serving(
    engine: EngineProcess, small_checkpoint: Checkpoint
) -> None:
    for prompt, message in [([], "empty"), ([1] * engine.max_model_len, "at most"), ([1, 2, 1000], "vocabulary")]:
        with pytest.raises(ValueError, match=message):
            engine.stream(prompt, SamplingParams())
        with pytest.raises(ValueError, match=message):
            engine.generate([prompt_of(5), prompt], SamplingParams())
    assert engine.figures().requests == RequestFigures(running=0, waiting=0, preemptions=0)
    assert engine.num_waiting_requests == 0
    prompt = prompt_of(50, seed=11)
    assert engine.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids == small_checkpoint.greedy(prompt, 8)


def test_closing_a_stream_aborts_its_request_in_the_process(engine: EngineProcess) -> None:
    aborted_before = engine.figures().activity.finish_reasons.get("abort", 0)

    async def read_one_delta() -> None:
        deltas = engine.stream(prompt_of(10, seed=6), SamplingParams(max_tokens=2000, ignore_eos=True))
        await anext(deltas)
        await deltas.aclose()

    asyncio.run(read_one_delta())
    for _ in range(200):
        figures = engine.figures()
        if figures.activity.finish_reasons.get("abort", 0) > aborted_before:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert figures.activity.finish_reasons["abort"] == aborted_before + 1
    assert figures.requests.running == 0
    assert figures.kv_cache.blocks_free == figures.kv_cache.blocks_total


def test_a_failing_callback_aborts_only_its_request(engine: EngineProcess) -> None:
    def failing(*_: object) -> None:
        raise RuntimeError("the caller went away")

    engine.add_request(prompt_of(10, seed=7), SamplingParams(max_tokens=2000, ignore_eos=True), callback=failing)
    collector = Collector()
    request_id = engine.add_request(prompt_of(10, seed=8), SamplingParams(max_tokens=8), callback=collector)
    assert collector.wait(1)[request_id].finish_reason == "length"
    for _ in range(200):
        if engine.figures().requests.running == 0:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert engine.figures().requests.running == 0


def test_the_process_logs_through_this_process(small_checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    engine = EngineProcess.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=256)
    try:
        with pytest.raises(RuntimeError, match="not started"):
            engine.add_request(prompt_of(10), SamplingParams())
        assert not engine.is_running()
    finally:
        assert engine.shutdown(5)
    loaded = [r for r in caplog.records if r.name == "engine.llm_engine" and r.getMessage().startswith("loaded ")]
    assert len(loaded) == 1 and str(small_checkpoint.path) in loaded[0].getMessage()
    assert loaded[0].process != os.getpid()  # the record is the process's own, handled here


def test_the_process_workers_sleep_between_steps_whatever_the_app_spins(
    small_checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app's OpenMP spin count reaches the process with the environment, and libgomp takes it
    # over OMP_WAIT_POLICY. 10^10 spins keep a worker busy for minutes after its last op: plain to see.
    monkeypatch.setenv("GOMP_SPINCOUNT", str(10**10))
    with EngineProcess.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024) as engine:
        engine.generate([prompt_of(600, seed=6)], SamplingParams(max_tokens=8))
        assert engine.pid is not None
        before = _cpu_seconds(engine.pid)
        time.sleep(0.5)
        assert _cpu_seconds(engine.pid) - before < 0.1


def _cpu_seconds(pid: int) -> float:
    """The CPU time a process has used, all its threads together (/proc/PID/stat: utime, stime)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_shutdown_aborts_requests_in_flight_and_refuses_new_ones(small_checkpoint: Checkpoint) -> None:
    engine = EngineProcess.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024).start()
    collector = Collector()
    request_id = engine.add_request(prompt_of(10), SamplingParams(max_tokens=2000, ignore_eos=True), callback=collector)
    assert engine.is_running()
    assert engine.shutdown(10)
    assert not engine.is_running()
    assert collector.wait(1)[request_id].finish_reason == "abort"
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request(prompt_of(10), SamplingParams())
    assert engine.figures().kv_cache.blocks_total > 0  # the last figures it sent
    assert engine.pid is not None and not os.path.exists(f"/proc/{engine.pid}/status")


def test_a_process_that_dies_ends_its_requests_with_error(
    small_checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    engine = EngineProcess.from_pretrained(str(small_checkpoint.path), kv_cache_tokens=1024).start()
    collector = Collector()
    request_id = engine.add_request(prompt_of(10), SamplingParams(max_tokens=2000, ignore_eos=True), callback=collector)
    assert engine.pid is not None
    os.kill(engine.pid, signal.SIGKILL)
    assert collector.wait(1)[request_id].finish_reason == "error"
    assert not engine.is_running()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request(prompt_of(10), SamplingParams())
    assert any("the engine process exited" in r.getMessage() for r in caplog.records)
    engine.shutdown(5)


def test_a_model_that_fails_to_load_raises_its_error_here(tmp_path: os.PathLike[str]) -> None:
    missing = str(tmp_path) + "/no-such-checkpoint"
    with pytest.raises(Exception) as here:
        LLMEngine.from_pretrained(missing)
    with pytest.raises(type(here.value), match=re.escape(str(here.value))):
        EngineProcess.from_pretrained(missing)
