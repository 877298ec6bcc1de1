"""N-gram speculative decoding: drafts from the sequence's own tokens, kept only where the sampler
agrees, so the output is the one decoding token by token gives."""

from collections.abc import Iterator

import numpy as np
import pytest
from transformers import PreTrainedTokenizerBase

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kv_pool import KVPool
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.speculation import accept_draft, propose_draft
from tests.engine.conftest import Checkpoint

BLOCK = 4


def sequence(prompt: list[int], output: list[int] | None = None, max_tokens: int = 256) -> Sequence:
    seq = Sequence("r", np.array(prompt, np.int32), SamplingParams(max_tokens=max_tokens), 0, 0, 0)
    seq.output_token_ids = list(output or [])
    return seq


def test_a_draft_is_what_followed_the_latest_earlier_match_of_the_last_tokens() -> None:
    # "7 8" occurs twice before the end; the latest occurrence was followed by 9 4
    seq = sequence([7, 8, 1, 2, 7, 8, 9, 4, 5], output=[7, 8])
    assert propose_draft(seq, 2) == [9, 4]
    assert propose_draft(seq, 0) == []
    # three tokens are tried before two: "1 7 8" occurred only once, followed by 3
    assert propose_draft(sequence([1, 7, 8, 3, 2, 7, 8, 9, 1, 7, 8]), 1) == [3]
    assert propose_draft(sequence([1, 2, 3, 4, 5]), 4) == []
    assert propose_draft(sequence([5]), 4) == []


def test_a_loop_is_drafted_past_the_end_of_the_sequence() -> None:
    assert propose_draft(sequence([3, 1, 2, 3, 1, 2, 3, 1, 2]), 5) == [3, 1, 2, 3, 1]
    assert propose_draft(sequence([9], output=[6, 6, 6]), 4) == [6, 6, 6, 6]


def test_draft_tokens_are_kept_up_to_the_first_the_sampler_did_not_pick() -> None:
    # sampled[i] is the token after the draft's first i tokens
    assert accept_draft([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert accept_draft([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert accept_draft([5, 6, 7], [4, 6, 7, 8]) == [4]
    assert accept_draft([], [3]) == [3]


def test_a_draft_takes_blocks_only_while_one_stays_free_for_each_other_decode() -> None:
    config = EngineConfig(block_size=BLOCK, max_num_batched_tokens=64, num_speculative_tokens=4)
    pool = KVPool(num_blocks=5, block_size=BLOCK, enable_prefix_caching=True)
    scheduler = Scheduler(config, pool, max_model_len=1000)
    looping, other = sequence([1, 2, 1, 2, 1, 2, 1]), sequence([10, 11, 12, 13, 14, 15, 16, 17])
    other.request_id, other.arrival = "other", 1
    for seq in (looping, other):
        scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule())  # both prompts computed: 2 blocks each, one free
    looping.append_token(2)
    other.append_token(18)  # its 9th token needs a third block
    assert {seq.request_id: n for seq, n in scheduler.schedule()} == {"r": 1, "other": 1}
    assert looping.draft_token_ids == []  # its draft would have taken the block `other` needs
    assert scheduler.num_preemptions == 0

    scheduler = Scheduler(config, KVPool(num_blocks=6, block_size=BLOCK, enable_prefix_caching=True), 1000)
    looping = sequence([1, 2, 1, 2, 1, 2, 1])
    scheduler.add(looping)
    scheduler.postprocess(scheduler.schedule())
    looping.append_token(2)
    assert scheduler.schedule() == [(looping, 5)]
    assert looping.draft_token_ids == [1, 2, 1, 2]
    assert len(looping.block_table) == 3  # positions 7 to 11
    # the sampler kept one draft token and picked another after it: the block taken for the rest returns
    for token_id in accept_draft(looping.draft_token_ids, [1, 5, 1, 2, 1]):
        looping.append_token(token_id)
    scheduler.postprocess([(looping, 2)])
    assert (looping.num_computed_tokens, len(looping.block_table), looping.draft_token_ids) == (9, 3, [])
    assert scheduler.kv_pool.num_free_blocks == 3


def test_a_draft_is_one_token_longer_than_the_last_one_kept() -> None:
    config = EngineConfig(block_size=BLOCK, num_speculative_tokens=4)
    scheduler = Scheduler(config, KVPool(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True), 1000)
    seq = sequence([1, 2, 1, 2, 1, 2, 1])
    scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule())
    seq.append_token(2)
    for num_accepted_before, num_draft_tokens in ((None, 4), (0, 1), (2, 3), (4, 4)):
        seq.num_accepted_draft_tokens = num_accepted_before
        assert scheduler.schedule() == [(seq, 1 + num_draft_tokens)]
        scheduler.postprocess([(seq, 0)])  # as if nothing were kept: the draft's blocks return
        assert len(seq.block_table) == 2


def test_a_draft_stops_at_max_tokens() -> None:
    config = EngineConfig(block_size=BLOCK, num_speculative_tokens=4)
    scheduler = Scheduler(config, KVPool(num_blocks=8, block_size=BLOCK, enable_prefix_caching=True), 1000)
    seq = sequence([1, 2, 1, 2, 1, 2, 1], max_tokens=3)
    scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule())
    seq.append_token(2)
    assert scheduler.schedule() == [(seq, 2)]  # the one token due, and one draft token to reach 3


def test_a_step_that_prefills_takes_no_draft() -> None:
    config = EngineConfig(block_size=BLOCK, num_speculative_tokens=4)
    scheduler = Scheduler(config, KVPool(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True), 1000)
    looping, arriving = sequence([1, 2, 1, 2, 1, 2, 1]), sequence([10, 11, 12])
    arriving.request_id, arriving.arrival = "arriving", 1
    scheduler.add(looping)
    scheduler.postprocess(scheduler.schedule())
    looping.append_token(2)
    scheduler.add(arriving)
    # the new request's first token comes after this step: it waits for no draft
    assert scheduler.schedule() == [(looping, 1), (arriving, 3)]


@pytest.fixture(scope="module")
def engines(bigram_checkpoint: Checkpoint) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    path = str(bigram_checkpoint.path)
    with (
        LLMEngine.from_pretrained(path, kv_cache_tokens=1024, num_speculative_tokens=0) as plain,
        LLMEngine.from_pretrained(path, kv_cache_tokens=1024, num_speculative_tokens=4) as speculating,
    ):
        yield plain, speculating


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(stop=["世界！流"]),  # a stop string inside an accepted draft
        SamplingParams(stop=["测试"], max_tokens=30),
        SamplingParams(max_tokens=7),
        SamplingParams(temperature=0.8, seed=5),
    ],
    ids=["greedy", "stop-string", "stop-string-2", "max-tokens", "seeded"],
)
def test_speculation_changes_no_output_only_the_steps(
    engines: tuple[LLMEngine, LLMEngine],
    tokenizer: PreTrainedTokenizerBase,
    bigram_text: str,
    params: SamplingParams,
) -> None:
    plain, speculating = engines
    # the prompt holds the reply already: every draft after its first tokens is right
    prompt = tokenizer.encode("Q" + bigram_text + "Q")
    accepted_before = speculating.figures().activity.draft_tokens.accepted
    expected = plain.generate([prompt], params)[0]
    output = speculating.generate([prompt], params)[0]
    assert (output.token_ids, output.text, output.finish_reason) == (
        expected.token_ids,
        expected.text,
        expected.finish_reason,
    )
    assert speculating.figures().activity.draft_tokens.accepted > accepted_before
    assert speculating.core.kv_pool.num_free_blocks == speculating.core.kv_pool.num_blocks


async def test_a_stream_gets_the_accepted_tokens_of_a_step_in_one_delta(
    engines: tuple[LLMEngine, LLMEngine], tokenizer: PreTrainedTokenizerBase, bigram_text: str, im_end: int
) -> None:
    _, speculating = engines
    deltas = [d async for d in speculating.stream(tokenizer.encode("Q" + bigram_text + "Q"), SamplingParams())]
    assert [t for d in deltas for t in d.token_ids] == [*tokenizer.encode(bigram_text), im_end]
    assert "".join(d.text for d in deltas) == bigram_text
    assert max(len(d.token_ids) for d in deltas) == 5  # the token due and 4 draft tokens
