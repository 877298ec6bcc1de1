from typing import Protocol

import numpy as np
import pytest

from engine import BACKGROUND_PRIORITY, EngineConfig, SamplingParams
from engine.kv_pool import KVPool
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus

BLOCK = 4


class NewSeq(Protocol):
    def __call__(self, num_tokens: int, priority: int = 0, first_token: int = 0) -> Sequence: ...


@pytest.fixture
def new_seq() -> NewSeq:
    arrivals = iter(range(1000))

    def make(num_tokens: int, priority: int = 0, first_token: int = 0) -> Sequence:
        arrival = next(arrivals)
        return Sequence(
            request_id=f"r{arrival}",
            prompt_token_ids=np.arange(first_token, first_token + num_tokens, dtype=np.int32),
            params=SamplingParams(),
            priority=priority,
            arrival=arrival,
            seed=0,
        )

    return make


def make_scheduler(
    num_blocks: int,
    budget: int,
    max_num_seqs: int = 8,
    num_speculative_tokens: int = 0,
    max_background_prefill_tokens: int = EngineConfig.max_background_prefill_tokens,
) -> Scheduler:
    config = EngineConfig(
        block_size=BLOCK,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        num_speculative_tokens=num_speculative_tokens,
        max_background_prefill_tokens=max_background_prefill_tokens,
    )
    return Scheduler(config, KVPool(num_blocks, BLOCK, enable_prefix_caching=True), max_model_len=1000)


def step(scheduler: Scheduler) -> dict[str, int]:
    """One engine step without the model: every sequence that finished its tokens gets one more."""
    batch = scheduler.schedule()
    scheduler.postprocess(batch)
    for seq, _ in batch:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(1)
    return {seq.request_id: n for seq, n in batch}


def test_long_prefill_is_chunked_and_decodes_keep_running(new_seq: NewSeq) -> None:
    scheduler = make_scheduler(num_blocks=64, budget=32)
    short, long = new_seq(8), new_seq(100, first_token=1000)
    scheduler.add(short)
    assert step(scheduler) == {"r0": 8}
    scheduler.add(long)
    assert step(scheduler) == {"r0": 1, "r1": 31}
    assert step(scheduler) == {"r0": 1, "r1": 31}
    assert step(scheduler) == {"r0": 1, "r1": 31}
    assert step(scheduler) == {"r0": 1, "r1": 7}
    assert step(scheduler) == {"r0": 1, "r1": 1}
    assert long.num_output_tokens == 2


def test_waiting_requests_join_by_priority_and_max_num_seqs(new_seq: NewSeq) -> None:
    scheduler = make_scheduler(num_blocks=64, budget=64, max_num_seqs=2)
    low, high, mid = (
        new_seq(4, priority=5),
        new_seq(4, priority=-1, first_token=10),
        new_seq(4, priority=0, first_token=20),
    )
    for seq in (low, high, mid):
        scheduler.add(seq)
    assert step(scheduler) == {high.request_id: 4, mid.request_id: 4}
    assert low.status == SequenceStatus.WAITING


def test_background_prefill_takes_short_chunks_and_none_while_a_users_prompt_prefills(new_seq: NewSeq) -> None:
    scheduler = make_scheduler(num_blocks=64, budget=32, max_background_prefill_tokens=8)
    summary = new_seq(40, priority=BACKGROUND_PRIORITY)
    scheduler.add(summary)
    assert step(scheduler) == {"r0": 8}
    user = new_seq(20, first_token=1000)
    scheduler.add(user)
    assert step(scheduler) == {"r1": 20}  # it waits for one 8-token step at most, not a 32-token one
    assert step(scheduler) == {"r1": 1, "r0": 8}  # the user's decodes do not hold it back
    late_summary = new_seq(40, priority=BACKGROUND_PRIORITY + 1, first_token=2000)
    scheduler.add(late_summary)
    assert step(scheduler) == {"r1": 1, "r0": 8}  # the budget is the step's, not each sequence's
    assert step(scheduler) == {"r1": 1, "r0": 8}
    assert step(scheduler) == {"r1": 1, "r0": 8}
    assert step(scheduler) == {"r1": 1, "r0": 1, "r2": 8}  # a decode is not a prefill: it takes none of it


def test_pool_exhaustion_preempts_the_newest_and_recomputes_it(new_seq: NewSeq) -> None:
    scheduler = make_scheduler(num_blocks=4, budget=64)
    old, new = new_seq(7), new_seq(7, first_token=100)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)
    step(scheduler)  # both at 9 tokens: each needs a third block, there are none
    assert scheduler.num_preemptions == 0
    batch = step(scheduler)
    assert batch == {old.request_id: 1}
    assert new.status == SequenceStatus.WAITING and not new.block_table and new.num_computed_tokens == 0
    scheduler.finish(old)
    # old's third block evicted new's last one; new's first block is still cached
    num_uncached = new.num_tokens - BLOCK
    assert step(scheduler) == {new.request_id: num_uncached}
    assert scheduler.kv_pool.num_free_blocks == 1


def test_higher_priority_arrival_preempts_a_lower_priority_runner(new_seq: NewSeq) -> None:
    scheduler = make_scheduler(num_blocks=4, budget=64)
    background = new_seq(15, priority=10)
    scheduler.add(background)
    step(scheduler)
    urgent = new_seq(6, priority=0, first_token=100)
    scheduler.add(urgent)
    assert step(scheduler) == {urgent.request_id: 6}
    assert background.status == SequenceStatus.WAITING and background.num_preemptions == 1
