import time

from .config import EngineConfig
from .kv_pool import KVPool
from .metrics import EngineMetrics
from .model import CausalLM
from .model_runner import ModelRunner
from .outputs import FinishReason
from .scheduler import Scheduler
from .sequence import Sequence
from .speculation import accept_draft


class EngineCore:
    """The engine without threads or text: sequences in, one batch per `step()`, token ids out.

    Not thread-safe: one thread drives it (LLMEngine's loop). A sequence ends here on what its
    tokens say (EOS, a stop token id, `max_tokens`, the model length); stop strings need the text,
    so LLMEngine ends those.
    """

    def __init__(self, model: CausalLM, config: EngineConfig, eos_token_ids: list[int]) -> None:
        self.runner = ModelRunner(model, config)
        self.kv_pool = KVPool(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.eos_token_ids = frozenset(eos_token_ids)
        max_positions = model.arch.max_position_embeddings
        self.max_model_len = min(
            config.max_model_len or max_positions, max_positions, self.kv_pool.num_blocks * config.block_size
        )
        self.scheduler = Scheduler(config, self.kv_pool, self.max_model_len)
        self.metrics = EngineMetrics()

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends `seq` at once and returns its blocks to the pool."""
        assert not seq.is_finished
        self.scheduler.finish(seq)
        seq.finish_reason = reason
        self.metrics.record_finished(seq.finish_reason, seq.num_prompt_tokens, seq.ttft_s)

    def has_unfinished_sequences(self) -> bool:
        return not self.scheduler.is_finished()

    def step(self) -> list[tuple[Sequence, list[int]]]:
        """Computes one scheduled batch. Returns every sequence that got tokens, with the tokens
        (more than one where draft tokens were accepted), those that got their first token first;
        a sequence its tokens ended is finished already."""
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        assert scheduled, "a scheduler with work must schedule something"
        # one token per position sampled: each sequence's last token, then its draft tokens
        seqs, sampled = self.runner.run(scheduled)
        new_token_ids: list[tuple[Sequence, list[int]]] = []
        num_rejected: dict[Sequence, int] = {}
        finished: list[tuple[Sequence, FinishReason]] = []
        num_draft_tokens = num_accepted_draft_tokens = row = 0
        for seq in seqs:
            draft = seq.draft_token_ids
            accepted = accept_draft(draft, sampled[row : row + len(draft) + 1])
            row += len(draft) + 1
            num_draft_tokens += len(draft)
            num_accepted_draft_tokens += len(accepted) - 1
            if draft:
                seq.num_accepted_draft_tokens = len(accepted) - 1
            token_ids = []
            for token_id in accepted:
                seq.append_token(token_id)
                token_ids.append(token_id)
                reason = self._finish_reason(seq, token_id)
                if reason is not None:
                    finished.append((seq, reason))
                    break
            # the KV kept is the last token's and the accepted draft tokens': one per new token
            num_rejected[seq] = len(draft) + 1 - len(token_ids)
            new_token_ids.append((seq, token_ids))
        # A new request's first token is what its user waits for, and the caller hands tokens on
        # one sequence at a time, each detokenized and sent to the app: behind the step's decodes
        # it went 0.39-0.44 ms after the step at p50 (the peer workload, 8 conversations), first 0.03.
        new_token_ids.sort(key=lambda item: item[0].num_output_tokens > len(item[1]))
        # the new tokens first: the blocks the step filled are hashed over them
        self.scheduler.postprocess([(seq, n - num_rejected.get(seq, 0)) for seq, n in scheduled])
        for seq, reason in finished:
            self.finish(seq, reason)
        self.metrics.record_step(
            time.perf_counter() - start,
            len(scheduled),
            sum(n for _, n in scheduled),
            sum(len(token_ids) for _, token_ids in new_token_ids),
            num_draft_tokens,
            num_accepted_draft_tokens,
        )
        return new_token_ids

    def _finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None
