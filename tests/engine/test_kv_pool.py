from typing import Protocol

import numpy as np
import pytest

from engine import SamplingParams
from engine.kv_pool import Block, FreeBlockQueue, KVPool
from engine.sequence import Sequence

BLOCK = 4


class NewSeq(Protocol):
    def __call__(self, token_ids: list[int], priority: int = 0) -> Sequence: ...


@pytest.fixture
def new_seq() -> NewSeq:
    arrivals = iter(range(1000))

    def make(token_ids: list[int], priority: int = 0) -> Sequence:
        return Sequence(
            request_id=f"r{token_ids[:3]}",
            prompt_token_ids=np.array(token_ids, np.int32),
            params=SamplingParams(),
            priority=priority,
            arrival=next(arrivals),
            seed=0,
        )

    return make


def admit(pool: KVPool, seq: Sequence) -> int:
    """Admits `seq` with its whole prompt, as if computed in one step; returns its cached tokens."""
    prefix = pool.cached_prefix(seq)
    assert pool.allocate(seq, prefix, seq.num_tokens - prefix.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    pool.cache_full_blocks(seq, prefix.num_tokens)
    return prefix.num_tokens


def test_free_block_queue_removes_from_the_middle_in_order() -> None:
    blocks = [Block(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.appendleft(blocks[2])
    queue.remove(blocks[4])
    queue.append(blocks[4])
    assert [queue.popleft().block_id for _ in range(len(queue))] == [2, 0, 1, 3, 4]


def test_prefix_hits_share_blocks_and_stop_short_of_the_last_token(new_seq: NewSeq) -> None:
    pool = KVPool(16, BLOCK, enable_prefix_caching=True)
    first = new_seq(list(range(10)))
    assert admit(pool, first) == 0
    second = new_seq([*range(9), 99, 100])
    assert admit(pool, second) == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert pool.blocks[first.block_table[0]].ref_cnt == 2
    # an identical 8-token prompt may reuse only its first block: the last token needs logits
    assert admit(pool, new_seq(list(range(8)))) == 4
    assert pool.figures().prefix_hit_tokens == 12


def test_freed_cached_blocks_are_evicted_least_recently_used_first(new_seq: NewSeq) -> None:
    pool = KVPool(4, BLOCK, enable_prefix_caching=True)
    old, recent = new_seq([1] * 5), new_seq([2] * 5)
    for seq in (old, recent):
        admit(pool, seq)
        pool.deallocate(seq)
    assert pool.num_free_blocks == 4 and len(pool.cached_blocks) == 2
    # each left a full block and a partial one; three blocks are taken: `old`'s two, then the
    # partial block of `recent`, not its full one
    admit(pool, new_seq([3] * 12))
    assert pool.cached_prefix(new_seq([2] * 5)).num_tokens == BLOCK
    assert pool.cached_prefix(new_seq([1] * 5)).num_tokens == 0


def test_deallocate_returns_every_block(new_seq: NewSeq) -> None:
    pool = KVPool(8, BLOCK, enable_prefix_caching=True)
    seqs = [new_seq(list(range(n))) for n in (3, 9, 9, 14)]
    for seq in seqs[:3]:
        admit(pool, seq)
    assert not pool.allocate(seqs[3], pool.cached_prefix(seqs[3]), 14)
    assert not seqs[3].block_table
    for seq in seqs[:3]:
        pool.deallocate(seq)
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_cnt == 0 for block in pool.blocks)


def test_may_append_grows_block_by_block(new_seq: NewSeq) -> None:
    pool = KVPool(3, BLOCK, enable_prefix_caching=False)
    seq = new_seq(list(range(4)))
    admit(pool, seq)
    assert len(seq.block_table) == 1
    assert pool.may_append(seq, 1) and len(seq.block_table) == 2
    seq.num_computed_tokens = 8
    assert pool.may_append(seq, 4) and len(seq.block_table) == 3
    seq.num_computed_tokens = 12
    assert not pool.may_append(seq, 1)
    assert pool.cached_prefix(seq).blocks == [] and not pool.cached_blocks


def test_a_sequences_partial_block_serves_the_next_turn(new_seq: NewSeq) -> None:
    pool = KVPool(8, BLOCK, enable_prefix_caching=True)
    turn = new_seq(list(range(10)))
    admit(pool, turn)
    block_table = list(turn.block_table)
    pool.deallocate(turn)
    assert len(pool.tail_blocks) == 1
    follow_up = new_seq([*range(10), 20, 21])
    assert admit(pool, follow_up) == 10
    # its third block is the one the first turn left, and it writes on in it
    assert follow_up.block_table == block_table
    assert not pool.tail_blocks and pool.figures().prefix_hit_tokens == 10


def test_a_partial_block_serves_the_tokens_that_match(new_seq: NewSeq) -> None:
    pool = KVPool(8, BLOCK, enable_prefix_caching=True)
    turn = new_seq(list(range(11)))
    admit(pool, turn)
    pool.deallocate(turn)
    assert pool.cached_prefix(new_seq([*range(9), 50, 51])).num_tokens == 9
    assert pool.cached_prefix(new_seq([*range(8), 50, 51])).num_tokens == 8
    # short of the last token, whose logits the model must produce
    assert pool.cached_prefix(new_seq(list(range(10)))).num_tokens == 9
    assert len(pool.tail_blocks) == 1  # looked at, not taken


def test_an_evicted_partial_block_is_forgotten(new_seq: NewSeq) -> None:
    pool = KVPool(3, BLOCK, enable_prefix_caching=True)
    turn = new_seq(list(range(6)))
    admit(pool, turn)
    pool.deallocate(turn)
    admit(pool, new_seq([9] * 12))
    assert not pool.tail_blocks
    assert pool.cached_prefix(new_seq(list(range(8)))).num_tokens == 0


def test_a_newer_partial_block_after_the_same_prefix_replaces_the_older(new_seq: NewSeq) -> None:
    pool = KVPool(8, BLOCK, enable_prefix_caching=True)
    older, newer = new_seq([*range(4), 7, 7]), new_seq([*range(4), 8, 8])
    admit(pool, older)
    older_partial = older.block_table[1]
    pool.deallocate(older)
    admit(pool, newer)
    pool.deallocate(newer)
    assert pool.cached_prefix(new_seq([*range(4), 7, 7, 1])).num_tokens == 4
    assert pool.cached_prefix(new_seq([*range(4), 8, 8, 1])).num_tokens == 6
    # the older one is an unused block again, the first to be taken
    assert pool.free_blocks.popleft().block_id == older_partial


def test_a_block_a_stop_string_left_partial_stays_a_full_cached_one(new_seq: NewSeq) -> None:
    pool = KVPool(8, BLOCK, enable_prefix_caching=True)
    seq = new_seq(list(range(6)))
    admit(pool, seq)
    seq.append_token(6)
    seq.append_token(7)
    seq.num_computed_tokens = 8
    pool.cache_full_blocks(seq, 6)
    del seq.output_token_ids[-1]  # the text held a stop string before the last token
    pool.deallocate(seq)
    assert not pool.tail_blocks and len(pool.cached_blocks) == 2
