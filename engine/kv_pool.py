import hashlib
from dataclasses import dataclass

import numpy as np

from .sequence import Sequence
from .token_ids import TokenArray


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    # a partial block a sequence left: the int32 bytes of the tokens whose KV it holds, and the
    # hash of the full block before it (b"" for a first block), its key in KVPool.tail_blocks
    tail: bytes | None = None
    tail_parent: bytes = b""
    prev: "Block | None" = None
    next: "Block | None" = None


class FreeBlockQueue:
    """Doubly linked list of the blocks nobody references, least recently used first.

    Unlike a deque it removes a block from the middle in O(1): a cached block leaves the queue
    when a prefix hit revives it.
    """

    def __init__(self, blocks: list[Block]) -> None:
        self.head = Block(-1)
        self.tail = Block(-1)
        self.head.next, self.tail.prev = self.tail, self.head
        self.num_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_blocks

    def popleft(self) -> Block:
        block = self.head.next
        assert self.num_blocks > 0 and block is not None
        self.remove(block)
        return block

    def append(self, block: Block) -> None:
        assert self.tail.prev is not None
        self._insert(block, self.tail.prev)

    def appendleft(self, block: Block) -> None:
        self._insert(block, self.head)

    def remove(self, block: Block) -> None:
        assert block.prev is not None and block.next is not None
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_blocks -= 1

    def _insert(self, block: Block, after: Block) -> None:
        assert block.prev is None and block.next is None and after.next is not None
        block.prev, block.next = after, after.next
        after.next.prev = block
        after.next = block
        self.num_blocks += 1


def hash_block_tokens(parent_hash: bytes | None, token_ids: memoryview) -> bytes:
    """Chained: a block's hash covers every token before it, so equal hashes mean equal prefixes.
    Hashes the ids' int32 bytes."""
    digest = hashlib.sha256(parent_hash or b"")
    digest.update(token_ids)
    return digest.digest()


def common_prefix_length(a: TokenArray, b: TokenArray) -> int:
    mismatches = np.flatnonzero(a != b)
    return int(mismatches[0]) if mismatches.size else len(a)


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass(frozen=True)
class CachedPrefix:
    """The start of a sequence whose KV the pool holds: shared full blocks, then perhaps the
    partial block a finished sequence left, whose first tokens match."""

    blocks: list[Block]
    num_tokens: int


@dataclass(frozen=True)
class KVPoolFigures:
    block_size: int
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    usage: float
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    prefix_hit_rate: float


class KVPool:
    """Paged KV blocks: block tables, reference counts and the prefix cache.

    A full block is registered under its chained hash once its KV is computed. When its last
    user leaves it stays cached, at the back of the free queue; blocks are taken from the front,
    so cached blocks are evicted least recently used first, after the uncached ones.

    A sequence's last, partial block is kept too when the sequence leaves, under the hash of the
    block before it: a conversation's next turn starts with every token of the last one, and
    those of its partial block are 7.5 on average, a sixth of what a turn of ~45 new tokens
    prefills. The sequence that matches its first tokens takes it over and writes on in it.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        assert num_blocks > 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks = FreeBlockQueue(self.blocks)
        self.cached_blocks: dict[bytes, Block] = {}
        self.tail_blocks: dict[bytes, Block] = {}
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def cached_prefix(self, seq: Sequence) -> CachedPrefix:
        """The longest start of `seq` whose KV the pool holds, short of its last token, whose logits
        the model must still produce."""
        if not self.enable_prefix_caching:
            return CachedPrefix([], 0)
        max_tokens = seq.num_tokens - 1
        hits = []
        for block_hash in self._block_hashes(seq, max_tokens // self.block_size):
            block = self.cached_blocks.get(block_hash)
            if block is None:
                break
            hits.append(block)
        num_tokens = len(hits) * self.block_size
        tail = self.tail_blocks.get(seq.block_hashes[len(hits) - 1] if hits else b"")
        if tail is not None and num_tokens < max_tokens:
            assert tail.tail is not None and tail.ref_cnt == 0
            kept = np.frombuffer(tail.tail, np.int32)[: max_tokens - num_tokens]
            num_matching = common_prefix_length(kept, seq.token_ids(num_tokens, num_tokens + len(kept)))
            if num_matching:
                hits.append(tail)
                num_tokens += num_matching
        return CachedPrefix(hits, num_tokens)

    def allocate(self, seq: Sequence, prefix: CachedPrefix, num_new_tokens: int) -> bool:
        """Admits `seq` with its cached prefix and room for `num_new_tokens` more; False, and no
        change, when the free blocks do not suffice."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        num_new_blocks = cdiv(prefix.num_tokens + num_new_tokens, self.block_size) - len(prefix.blocks)
        num_revived = sum(block.ref_cnt == 0 for block in prefix.blocks)
        if num_new_blocks + num_revived > self.num_free_blocks:
            return False
        for block in prefix.blocks:
            if block.ref_cnt == 0:
                self.free_blocks.remove(block)
            if block.tail is not None:
                self._forget_tail(block)  # `seq` writes on in it: it is no longer what was kept
            block.ref_cnt += 1
            seq.block_table.append(block.block_id)
        seq.num_computed_tokens = prefix.num_tokens
        self._append_blocks(seq, num_new_blocks)
        if self.enable_prefix_caching:
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += prefix.num_tokens
        return True

    def may_append(self, seq: Sequence, num_new_tokens: int, keep_free: int = 0) -> bool:
        """Grows the block table of a running `seq` to hold `num_new_tokens` more, if `keep_free`
        blocks stay free besides."""
        num_new_blocks = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table)
        if num_new_blocks + keep_free > self.num_free_blocks:
            return False
        self._append_blocks(seq, num_new_blocks)
        return True

    def cache_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Registers the blocks that the last step filled, so that later requests can share them."""
        if not self.enable_prefix_caching:
            return
        first, end = num_computed_before // self.block_size, seq.num_computed_tokens // self.block_size
        for i, block_hash in enumerate(self._block_hashes(seq, end)[first:], start=first):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                self.cached_blocks[block_hash] = block

    def free_unused_blocks(self, seq: Sequence) -> None:
        """Frees the blocks past `seq`'s computed tokens: they were taken for draft tokens that the
        step rejected."""
        num_used = cdiv(seq.num_computed_tokens, self.block_size)
        self._release(seq.block_table[num_used:])
        del seq.block_table[num_used:]

    def deallocate(self, seq: Sequence) -> None:
        if self.enable_prefix_caching:
            self._keep_tail(seq)
        self._release(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _keep_tail(self, seq: Sequence) -> None:
        """Keeps the KV of `seq`'s partial last block for a sequence that starts with its tokens
        (`seq`'s next turn, or `seq` again after a preemption)."""
        # a stop string cuts the tokens after it, whose KV stays computed: it serves none
        num_tokens = min(seq.num_computed_tokens, seq.num_tokens)
        num_full = num_tokens // self.block_size
        if num_tokens == num_full * self.block_size:
            return
        block = self.blocks[seq.block_table[num_full]]
        if block.block_hash is not None:
            return  # full and registered before a stop string cut the tokens at its end
        assert block.ref_cnt == 1, "a partial block belongs to one sequence"
        parent = self._block_hashes(seq, num_full)[-1] if num_full else b""
        replaced = self.tail_blocks.get(parent)
        if replaced is not None:  # unused, as every kept block is: now taken first, like any other
            self._forget_tail(replaced)
            self.free_blocks.remove(replaced)
            self.free_blocks.appendleft(replaced)
        block.tail, block.tail_parent = seq.token_ids(num_full * self.block_size, num_tokens).tobytes(), parent
        self.tail_blocks[parent] = block

    def _forget_tail(self, block: Block) -> None:
        del self.tail_blocks[block.tail_parent]
        block.tail = None

    def _release(self, block_ids: list[int]) -> None:
        # a sequence's last blocks are freed first, so they are evicted before its shared prefix
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            assert block.ref_cnt > 0
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            if block.block_hash is None and block.tail is None:
                self.free_blocks.appendleft(block)
            else:
                self.free_blocks.append(block)

    def figures(self) -> KVPoolFigures:
        num_free = self.num_free_blocks
        return KVPoolFigures(
            block_size=self.block_size,
            blocks_total=self.num_blocks,
            blocks_used=self.num_blocks - num_free,
            blocks_free=num_free,
            blocks_cached=len(self.cached_blocks),
            usage=(self.num_blocks - num_free) / self.num_blocks,
            prefix_queried_tokens=self.num_queried_tokens,
            prefix_hit_tokens=self.num_hit_tokens,
            prefix_hit_rate=self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0,
        )

    def _append_blocks(self, seq: Sequence, num_blocks: int) -> None:
        for _ in range(num_blocks):
            block = self.free_blocks.popleft()
            assert block.ref_cnt == 0
            if block.block_hash is not None:
                del self.cached_blocks[block.block_hash]
                block.block_hash = None
            if block.tail is not None:
                self._forget_tail(block)
            block.ref_cnt = 1
            seq.block_table.append(block.block_id)

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        hashes = seq.block_hashes
        first = len(hashes)
        if first < num_blocks:
            # one view of the new blocks' ids, sliced block by block: no Python int per token
            tokens = seq.token_ids(first * self.block_size, num_blocks * self.block_size).data
            for start in range(0, len(tokens), self.block_size):
                hashes.append(
                    hash_block_tokens(hashes[-1] if hashes else None, tokens[start : start + self.block_size])
                )
        return hashes[:num_blocks]
