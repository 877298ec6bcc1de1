import logging
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from .attention import AttentionMetadata, DecodeBucket, PrefillSpan
from .config import EngineConfig
from .kv_pool import cdiv
from .model import CausalLM
from .scheduler import ScheduledBatch
from .sequence import Sequence

logger = logging.getLogger(__name__)

# decode attention gathers each bucket's KV into one padded tensor; this bounds its size
MAX_DECODE_GATHER_TOKENS = 32768
# A step of this many tokens or fewer reads every weight for little arithmetic, so memory, not
# the cores, bounds it: on 2 cores SmolLM2 decodes 8 sequences in 74 ms on one thread and 76-82 ms
# on two (32 sequences: 178 against 124 ms). Such a step leaves a core to the app's own threads
# (event loop, embedder, database): against transformers serve, 58.6 -> 66.8 output tokens/s.
MEMORY_BOUND_STEP_TOKENS = 8


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_seqs: list[Sequence]


class ModelRunner:
    """Owns the model and its KV pool tensors; turns a scheduled batch into logits."""

    def __init__(self, model: CausalLM, config: EngineConfig) -> None:
        self.model = model
        weight = model.model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        # the process's choice, read here: the engine's own thread starts with OpenMP's default team
        self.num_threads = torch.get_num_threads()
        self.block_size = config.block_size
        num_layers, num_kv_heads, head_dim = model.arch.num_layers, model.arch.num_kv_heads, model.arch.head_dim
        # K and V of one block in every layer
        block_bytes = 2 * num_layers * config.block_size * num_kv_heads * head_dim * self.dtype.itemsize
        self.num_blocks = self._num_blocks(config, block_bytes)
        shape = (2, num_layers, self.num_blocks, config.block_size, num_kv_heads, head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        logger.info(
            "KV pool: %d blocks of %d tokens, %.2f GiB",
            self.num_blocks,
            config.block_size,
            self.kv_cache.numel() * self.kv_cache.element_size() / 2**30,
        )

    def _num_blocks(self, config: EngineConfig, block_bytes: int) -> int:
        if self.device.type != "cuda":
            return cdiv(config.kv_cache_tokens, config.block_size)
        free, total = torch.cuda.mem_get_info(self.device)
        arch, itemsize = self.model.arch, self.dtype.itemsize
        q_size = arch.num_heads * arch.head_dim
        per_token = 4 * arch.hidden_size + 3 * arch.intermediate_size + 2 * q_size
        activations = 2 * config.max_num_batched_tokens * per_token * itemsize
        logits = 4 * config.max_num_seqs * arch.vocab_size * 4
        budget = total * config.gpu_memory_fraction - (total - free) - activations - logits
        num_blocks = int(budget // block_bytes) - cdiv(MAX_DECODE_GATHER_TOKENS, config.block_size)
        if num_blocks < 1:
            raise ValueError(f"no GPU memory left for the KV cache at gpu_memory_fraction={config.gpu_memory_fraction}")
        return num_blocks

    @torch.inference_mode()
    def run(self, scheduled: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        """Computes the scheduled tokens; returns the sequences due a new token and the logits at
        their last token and at each of their draft tokens, in order."""
        batch = self.prepare(scheduled)
        torch.set_num_threads(self._num_threads_for(len(batch.input_ids)))
        hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache)
        return batch.sample_seqs, self.model.compute_logits(hidden[batch.logits_indices])

    def _num_threads_for(self, num_tokens: int) -> int:
        if num_tokens > MEMORY_BOUND_STEP_TOKENS:
            return self.num_threads
        return max(1, self.num_threads - 1)

    def prepare(self, scheduled: ScheduledBatch) -> ModelInput:
        decodes = sorted((seq for seq, n in scheduled if n == 1), key=lambda s: s.num_computed_tokens, reverse=True)
        prefills = [(seq, n) for seq, n in scheduled if n > 1]
        # a decode is one token: Python ints; a prefill span is many: numpy, no int per token
        input_ids = [np.array([seq.token_id(seq.num_computed_tokens) for seq in decodes], np.int32)]
        positions = [np.array([seq.num_computed_tokens for seq in decodes], np.int64)]
        slots = [np.array([self._slot(seq, seq.num_computed_tokens) for seq in decodes], np.int64)]
        logits_indices = [i for i, seq in enumerate(decodes) if seq.num_computed_tokens + 1 == seq.num_tokens]
        sample_seqs = [decodes[i] for i in logits_indices]
        spans = []
        offset = len(decodes)
        for seq, num_new_tokens in prefills:
            # a decode with draft tokens is a span too: its last token, then the draft
            num_draft_tokens = len(seq.draft_token_ids)
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
            span_positions = np.arange(start, end)
            input_ids.append(seq.token_ids(start, end - num_draft_tokens))
            input_ids.append(np.array(seq.draft_token_ids, np.int32))
            positions.append(span_positions)
            slots.append(self._slots(seq, span_positions))
            spans.append(self._prefill_span(offset, seq, start, end))
            offset += num_new_tokens
            if end == seq.num_tokens + num_draft_tokens:
                logits_indices.extend(range(offset - 1 - num_draft_tokens, offset))
                sample_seqs.append(seq)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(np.concatenate(slots)),
            decodes=self._decode_buckets(decodes),
            prefills=spans,
        )
        return ModelInput(
            self._tensor(np.concatenate(input_ids)),
            self._tensor(np.concatenate(positions)),
            meta,
            self._tensor(logits_indices),
            sample_seqs,
        )

    def _slot(self, seq: Sequence, position: int) -> int:
        """Where the KV of `seq`'s token at `position`, its last this step, goes in the pool."""
        assert len(seq.block_table) == cdiv(position + 1, self.block_size)
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _slots(self, seq: Sequence, positions: NDArray[np.int64]) -> NDArray[np.int64]:
        """`_slot` for a span of positions, its last this step."""
        assert len(seq.block_table) == cdiv(int(positions[-1]) + 1, self.block_size)
        return np.array(seq.block_table)[positions // self.block_size] * self.block_size + positions % self.block_size

    def _decode_buckets(self, decodes: list[Sequence]) -> list[DecodeBucket]:
        """`decodes` is sorted longest first. A bucket ends where a context is under 3/4 of its
        longest, which bounds the padding, or where the gathered KV would pass its bound."""
        buckets = []
        start = 0
        while start < len(decodes):
            num_blocks = len(decodes[start].block_table)
            limit = min(len(decodes), start + max(1, MAX_DECODE_GATHER_TOKENS // (num_blocks * self.block_size)))
            end = start + 1
            while end < limit and 4 * len(decodes[end].block_table) >= 3 * num_blocks:
                end += 1
            block_tables = [seq.block_table + [0] * (num_blocks - len(seq.block_table)) for seq in decodes[start:end]]
            context_lens = self._tensor([seq.num_computed_tokens + 1 for seq in decodes[start:end]])
            mask = torch.arange(num_blocks * self.block_size, device=self.device)[None, :] < context_lens[:, None]
            buckets.append(DecodeBucket(start, end, self._tensor(block_tables), mask[:, None, None, :]))
            start = end
        return buckets

    def _prefill_span(self, offset: int, seq: Sequence, start: int, end: int) -> PrefillSpan:
        mask = None
        if start > 0:
            mask = (
                torch.arange(end, device=self.device)[None, :] <= torch.arange(start, end, device=self.device)[:, None]
            )
        return PrefillSpan(offset, offset + end - start, end, self._tensor(seq.block_table), mask)

    def _tensor(self, values: list[int] | list[list[int]] | NDArray[np.integer]) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.long, device=self.device)
