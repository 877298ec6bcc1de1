import time

from .config import EngineConfig
from .kv_pool import KVPool
from .metrics import EngineMetrics
from .model import CausalLM
from .model_runner import ModelRunner
from .outputs import FinishReason
from .sampler import sample
from .scheduler import Scheduler
from .sequence import Sequence


class EngineCore:
    """The engine without threads or text: sequences in, one batch per `step()`, token ids out.

    Not thread-safe: one thread drives it (LLMEngine's loop). A sequence ends here on what its
    tokens say (EOS, a stop token id, `max_tokens`, the model length); stop strings need the text,
    so LLMEngine ends those.
    """

    def __init__(self, model: CausalLM, config: EngineConfig, eos_token_ids: list[int]) -> None:
        self.runner = ModelRunner(model, config)
        self.kv_pool = KVPool(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.kv_pool)
        self.eos_token_ids = frozenset(eos_token_ids)
        max_positions = model.arch.max_position_embeddings
        self.max_model_len = min(
            config.max_model_len or max_positions, max_positions, self.kv_pool.num_blocks * config.block_size
        )
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

    def step(self) -> list[tuple[Sequence, int]]:
        """Computes one scheduled batch. Returns every sequence that got a token, with the token;
        a sequence its token ended is finished already."""
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        assert scheduled, "a scheduler with work must schedule something"
        seqs, logits = self.runner.run(scheduled)
        token_ids: list[int] = sample(
            logits, [s.params for s in seqs], [s.seed for s in seqs], [s.num_output_tokens for s in seqs]
        ).tolist()
        self.scheduler.postprocess(scheduled)
        for seq, token_id in zip(seqs, token_ids, strict=True):
            seq.append_token(token_id)
            reason = self._finish_reason(seq, token_id)
            if reason is not None:
                self.finish(seq, reason)
        self.metrics.record_step(time.perf_counter() - start, len(scheduled), sum(n for _, n in scheduled), len(seqs))
        return list(zip(seqs, token_ids, strict=True))

    def _finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None
