import bisect
from collections import deque

from .config import EngineConfig
from .kv_pool import KVPool, cdiv
from .sampling_params import BACKGROUND_PRIORITY
from .sequence import Sequence, SequenceStatus
from .speculation import propose_draft

ScheduledBatch = list[tuple[Sequence, int]]


class Scheduler:
    """Continuous batching: each step picks who runs and how many of their tokens.

    Running decodes go first, then running prefills in chunks, then waiting requests, each group
    in priority order, until the token budget is spent. A chunked prefill therefore never
    starves the decodes. Work no user waits for (BACKGROUND_PRIORITY and above: a summary, a
    prefill ahead of a turn) computes at most `max_background_prefill_tokens` prompt tokens a
    step, and none in a step that prefills a user's prompt: a whole chunk of a summary's prompt
    would hold a user's new turn for its step (SmolLM2 on 2 cores, 1,500 tokens: 2.5 s). In a
    step that prefills no user's prompt, a decode also takes draft tokens to verify
    (speculation.py) where the budget and the free blocks leave room. When the pool runs dry the
    lowest-priority, newest running sequence is preempted: its blocks are freed and it is
    recomputed later (its full blocks usually still sit in the prefix cache).
    """

    def __init__(self, config: EngineConfig, kv_pool: KVPool, max_model_len: int) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_background_prefill_tokens = config.max_background_prefill_tokens
        self.max_model_len = max_model_len
        self.kv_pool = kv_pool
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        assert seq.status == SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def finish(self, seq: Sequence) -> None:
        queue = self.running if seq.status == SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.kv_pool.deallocate(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        self._preempt_for_priority()
        budget = self.max_num_batched_tokens
        # a step that prefills a user's prompt takes no drafts and no background prompt tokens: the
        # prompt's first token waits for nobody's guesses
        prefilling_user = self._prefilling_user()
        background_budget = 0 if prefilling_user else self.max_background_prefill_tokens
        drafting = self.num_speculative_tokens > 0 and not prefilling_user
        scheduled: ScheduledBatch = []
        num_preemptions = self.num_preemptions
        queue = deque(sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.sort_key)))
        self.running = []
        while queue and budget:
            seq = queue.popleft()
            num_new_tokens = min(seq.num_uncomputed_tokens, budget)
            if _is_background(seq) and num_new_tokens > 1:
                num_new_tokens = min(num_new_tokens, background_budget)
                if not num_new_tokens:
                    self.running.append(seq)
                    continue
                background_budget -= num_new_tokens
            if drafting and seq.num_uncomputed_tokens == 1:
                num_new_tokens += self._draft(seq, budget - 1, queue)
            if not self._reserve(seq, num_new_tokens, queue):
                continue
            self.running.append(seq)
            scheduled.append((seq, num_new_tokens))
            budget -= num_new_tokens
        self.running.extend(queue)
        # admitting while preempting would only thrash the pool
        while (
            self.waiting
            and budget
            and len(self.running) < self.max_num_seqs
            and num_preemptions == self.num_preemptions
        ):
            seq = self.waiting[0]
            prefix = self.kv_pool.cached_prefix(seq)
            num_new_tokens = min(seq.num_tokens - prefix.num_tokens, budget)
            if _is_background(seq):
                # the waiting are in priority order: the rest are background work too
                num_new_tokens = min(num_new_tokens, background_budget)
                if not num_new_tokens:
                    break
                background_budget -= num_new_tokens
            if not self.kv_pool.allocate(seq, prefix, num_new_tokens):
                break
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = prefix.num_tokens
            self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append((seq, num_new_tokens))
            budget -= num_new_tokens
        return scheduled

    def _prefilling_user(self) -> bool:
        """Whether a user's prompt (not background work's) waits or is being prefilled."""
        if self.waiting and not _is_background(self.waiting[0]):  # the waiting are in priority order
            return True
        return any(not _is_background(seq) and seq.num_uncomputed_tokens > 1 for seq in self.running)

    def postprocess(self, computed: ScheduledBatch) -> None:
        """`computed`: the tokens of each scheduled sequence whose KV this step computed and kept,
        its rejected draft tokens left out."""
        for seq, num_computed_tokens in computed:
            num_computed_before = seq.num_computed_tokens
            seq.num_computed_tokens += num_computed_tokens
            self.kv_pool.cache_full_blocks(seq, num_computed_before)
            if seq.draft_token_ids:
                self.kv_pool.free_unused_blocks(seq)
                seq.draft_token_ids = []

    def _draft(self, seq: Sequence, budget: int, queue: deque[Sequence]) -> int:
        """Proposes the draft tokens of a decoding `seq` and grows its block table for them;
        returns how many. A draft stops at the budget, at `seq`'s max_tokens and at the model
        length, and takes a block only if one stays free for each sequence still to be scheduled:
        a guess never preempts a sequence."""
        last_accepted = seq.num_accepted_draft_tokens
        num_room = min(
            self.num_speculative_tokens,
            # one token more than the last draft kept: after a miss a guess costs one row, not k
            self.num_speculative_tokens if last_accepted is None else last_accepted + 1,
            budget,
            seq.params.max_tokens - seq.num_output_tokens - 1,
            self.max_model_len - seq.num_tokens - 1,
        )
        draft = propose_draft(seq, num_room)
        if draft and self.kv_pool.may_append(seq, 1 + len(draft), keep_free=len(queue)):
            seq.draft_token_ids = draft
        return len(seq.draft_token_ids)

    def _reserve(self, seq: Sequence, num_new_tokens: int, queue: deque[Sequence]) -> bool:
        """Finds blocks for `seq`, preempting worse sequences not yet scheduled this step, or `seq` itself."""
        while not self.kv_pool.may_append(seq, num_new_tokens):
            victim = max(queue, key=lambda s: s.sort_key, default=None)
            if victim is None or victim.sort_key < seq.sort_key:
                self._preempt(seq)
                return False
            queue.remove(victim)
            self._preempt(victim)
        return True

    def _preempt_for_priority(self) -> None:
        """A waiting request of strictly higher priority than a running one takes its place."""
        if not self.waiting:
            return
        head = self.waiting[0]
        num_blocks_needed = cdiv(min(head.num_tokens, self.max_num_batched_tokens), self.kv_pool.block_size)
        while self.running and (
            self.kv_pool.num_free_blocks < num_blocks_needed or len(self.running) >= self.max_num_seqs
        ):
            victim = max(self.running, key=lambda s: s.sort_key)
            if victim.priority <= head.priority:
                return
            self.running.remove(victim)
            self._preempt(victim)

    def _preempt(self, seq: Sequence) -> None:
        self.kv_pool.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)


def _is_background(seq: Sequence) -> bool:
    return seq.priority >= BACKGROUND_PRIORITY
