import logging
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import cpu_linear, paged_kernel
from .attention import AttentionMetadata, DecodeBucket, DecodeRows, PrefillSpan
from .config import EngineConfig
from .greedy_head import GreedyHead
from .kv_pool import cdiv
from .model import CausalLM, Linear
from .sampler import sample
from .scheduler import ScheduledBatch
from .sequence import Sequence

logger = logging.getLogger(__name__)

# decode attention gathers each bucket's KV into one padded tensor; this bounds its size
MAX_DECODE_GATHER_TOKENS = 32768
# A step of this many tokens or fewer reads every layer weight for little arithmetic, so memory,
# not the cores, bounds it: on 2 cores under the engine process's OMP_WAIT_POLICY=PASSIVE, SmolLM2 decodes 8
# sequences in 57-59 ms on one thread and 56-58 ms on two (32 sequences: 107 against 78 ms). Such
# a step leaves a core to the app's own threads (event loop, embedder, database): against
# transformers serve, 143-148 output tokens/s with the rule, 137-138 without.
MEMORY_BOUND_STEP_TOKENS = 8
# Under OMP_WAIT_POLICY=PASSIVE each parallel op wakes the sleeping worker, 100-200 us on 2 cores,
# and a layer is ~10 ops. Where a layer's weights are this small (the demo's 0.85 MB) its ops are
# shorter than that, and one thread computes a step's layers sooner up to ~1,000 tokens: 2.3 against
# 4.8 ms for 40 tokens, 11.6 against 18.5 ms for 400, 33 against 33 ms for 1,000 (Intel Xeon, 2 cores).
SMALL_LAYER_BYTES = 2**21
SMALL_LAYER_STEP_TOKENS = 512
# The decode attention kernel's sequences go to every thread once its rows read this many key
# elements (context x query heads x head_dim), whatever the layers' thread count; below it waking
# the second thread costs what it saves: 8 sequences with 4 draft tokens each at 700 tokens of the
# demo's heads (3.4 M) take 0.38 ms on two threads against 0.52 on one, at 300 (1.5 M) 0.20 against
# 0.23; SmolLM2's heads for 8 sequences at 100 tokens (0.4 M), 0.08 against 0.05 (Intel Xeon).
PARALLEL_DECODE_ATTENTION_ELEMENTS = 2**21
# cuDNN's attention, which PyTorch picks first for bfloat16 on Hopper, plans anew for every shape,
# and every step brings new lengths: on an H200 (torch 2.11) it took 1.7 ms of CPU a call, 77% of
# the engine's time in engine_bench. The others take any shape as it comes.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_seqs: list[Sequence]


class ModelRunner:
    """Owns the model and its KV pool tensors; turns a scheduled batch into sampled tokens."""

    def __init__(self, model: CausalLM, config: EngineConfig) -> None:
        self.model = model
        weight = model.model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        # the process's choice, read here: the engine's own thread starts with OpenMP's default team
        self.num_threads = torch.get_num_threads()
        layer = model.model.layers[0]
        self.layer_bytes = sum(param.numel() * param.element_size() for param in layer.parameters())
        if cpu_linear.ONEDNN and self.device.type == "cpu" and self.dtype == torch.float32:
            self._choose_linear_libraries()
        self.block_size = config.block_size
        self.num_queries_per_kv = model.arch.num_heads // model.arch.num_kv_heads
        # decodes read the pool in place where the kernel serves; elsewhere buckets gather for SDPA
        self.paged_kernel = paged_kernel.serves(
            self.device, self.dtype, model.arch.num_heads, model.arch.head_dim, config.block_size
        )
        # steps whose every row is greedy pick from the LM head without logits where the kernel serves
        lm_head = model.lm_head_weight
        self.greedy_head = GreedyHead(lm_head) if GreedyHead.serves(lm_head) else None
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
        # blocks PyTorch's allocator holds but no tensor uses (an earlier engine's pool, freed) are
        # ours to take, though the driver counts them as used
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
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
    def run(self, scheduled: ScheduledBatch) -> tuple[list[Sequence], list[int]]:
        """Computes the scheduled tokens; returns the sequences due a new token and the tokens
        sampled at their last token and at each of their draft tokens, in order."""
        batch = self.prepare(scheduled)
        torch.set_num_threads(self._layer_threads(len(batch.input_ids)))
        with sdpa_kernel(SDPA_BACKENDS):
            hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache)[batch.logits_indices]
        # The LM head is a small model's largest matrix (the demo's 151,936 x 128) and every row
        # multiplies all of it: on every thread, 1.6 against 8.0 ms for 8 rows of the demo.
        torch.set_num_threads(self.num_threads)
        rows = [(seq, i) for seq in batch.sample_seqs for i in range(1 + len(seq.draft_token_ids))]
        if self.greedy_head is not None and all(seq.params.is_greedy for seq, _ in rows):
            return batch.sample_seqs, self.greedy_head(hidden).tolist()
        params = [seq.params for seq, _ in rows]
        seeds = [seq.seed for seq, _ in rows]
        steps = [seq.num_output_tokens + i for seq, i in rows]
        return batch.sample_seqs, sample(self.model.compute_logits(hidden), params, seeds, steps).tolist()

    def release(self) -> None:
        """Gives the KV pool's memory back (the engine has stopped): on a GPU, to the next engine
        in the process, which sizes its pool from what is free."""
        self.kv_cache = self.kv_cache.new_empty(0)

    def _choose_linear_libraries(self) -> None:
        """Times MKL against oneDNN on each weight shape, on the threads a step of so many rows
        would give it; the LM head's rows are sampled ones, a few per sequence."""
        shapes: dict[tuple[int, ...], list[Linear]] = {}
        for module in self.model.model.modules():
            if isinstance(module, Linear):
                shapes.setdefault(tuple(module.weight.shape), []).append(module)
        chosen = []
        for shape, modules in shapes.items():
            most = cpu_linear.mkl_max_rows(modules[0].weight, modules[0].bias, self._layer_threads)
            for module in modules:
                module.mkl_max_rows = most
            chosen.append(f"{shape[1]} -> {shape[0]} {cpu_linear.described(most)}")
        head = self.model.lm_head_weight
        most = cpu_linear.mkl_max_rows(head, None, lambda _: self.num_threads, cpu_linear.DECODE_ROWS)
        self.model.lm_head_mkl_max_rows = most
        chosen.append(f"LM head {cpu_linear.described(most)}")
        torch.set_num_threads(self.num_threads)
        logger.info("projections on the CPU: %s", "; ".join(chosen))

    def _layer_threads(self, num_tokens: int) -> int:
        if self.layer_bytes <= SMALL_LAYER_BYTES and num_tokens <= SMALL_LAYER_STEP_TOKENS:
            return 1
        if num_tokens <= MEMORY_BOUND_STEP_TOKENS:
            return max(1, self.num_threads - 1)
        return self.num_threads

    def prepare(self, scheduled: ScheduledBatch) -> ModelInput:
        # a decode computes its sequence's last token and the draft after it, every row sampled;
        # longest block table first, so that decode buckets are runs of rows
        decodes = sorted(
            (seq for seq, _ in scheduled if seq.num_uncomputed_tokens == 1),
            key=lambda s: len(s.block_table),
            reverse=True,
        )
        prefills = [(seq, n) for seq, n in scheduled if seq.num_uncomputed_tokens > 1]
        # a decode is a few tokens: Python ints; a prefill span is many: numpy, no int per token
        decode_ids: list[int] = []
        decode_positions: list[int] = []
        decode_slots: list[int] = []
        for seq in decodes:
            query_positions = self._query_positions(seq)
            decode_ids += [seq.token_id(seq.num_computed_tokens), *seq.draft_token_ids]
            decode_positions += query_positions
            decode_slots += (self._slot(seq, position) for position in query_positions)
        input_ids = [np.array(decode_ids, np.int32)]
        positions = [np.array(decode_positions, np.int64)]
        slots = [np.array(decode_slots, np.int64)]
        logits_indices = list(range(len(decode_ids)))
        sample_seqs = list(decodes)
        spans = []
        offset = len(decode_ids)
        for seq, num_new_tokens in prefills:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
            span_positions = np.arange(start, end)
            input_ids.append(seq.token_ids(start, end))
            positions.append(span_positions)
            slots.append(self._slots(seq, span_positions))
            spans.append(self._prefill_span(offset, seq, start, end))
            offset += num_new_tokens
            if end == seq.num_tokens:
                logits_indices.append(offset - 1)
                sample_seqs.append(seq)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(np.concatenate(slots)),
            decode_rows=self._decode_rows(decodes) if self.paged_kernel else None,
            decode_buckets=[] if self.paged_kernel else self._decode_buckets(decodes),
            prefills=spans,
        )
        return ModelInput(
            self._tensor(np.concatenate(input_ids)),
            self._tensor(np.concatenate(positions)),
            meta,
            self._tensor(logits_indices),
            sample_seqs,
        )

    def _query_positions(self, seq: Sequence) -> range:
        """The positions a decode computes: its last token's, then its draft tokens'."""
        positions = range(seq.num_computed_tokens, seq.num_computed_tokens + 1 + len(seq.draft_token_ids))
        assert len(seq.block_table) == cdiv(positions[-1] + 1, self.block_size)
        return positions

    def _slot(self, seq: Sequence, position: int) -> int:
        """Where the KV of `seq`'s token at `position` goes in the pool."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _slots(self, seq: Sequence, positions: NDArray[np.int64]) -> NDArray[np.int64]:
        """`_slot` for a span of positions, its last this step."""
        assert len(seq.block_table) == cdiv(int(positions[-1]) + 1, self.block_size)
        return np.array(seq.block_table)[positions // self.block_size] * self.block_size + positions % self.block_size

    def _decode_rows(self, decodes: list[Sequence]) -> DecodeRows | None:
        block_tables: list[int] = []
        table_starts: list[int] = []
        context_lens: list[int] = []
        for seq in decodes:
            positions = self._query_positions(seq)
            table_starts += [len(block_tables)] * len(positions)
            context_lens += (position + 1 for position in positions)
            block_tables += seq.block_table
        if not context_lens:
            return None
        arch = self.model.arch
        num_elements = sum(context_lens) * arch.num_heads * arch.head_dim
        num_threads = self.num_threads if num_elements >= PARALLEL_DECODE_ATTENTION_ELEMENTS else 1
        return DecodeRows(
            self._tensor(block_tables), self._tensor(table_starts), self._tensor(context_lens), num_threads
        )

    def _decode_buckets(self, decodes: list[Sequence]) -> list[DecodeBucket]:
        """`decodes` is sorted by block table, longest first. A bucket ends where a block table is
        under 3/4 of its longest, which bounds the padding, or where the gathered KV would pass its
        bound."""
        buckets: list[DecodeBucket] = []
        start = 0
        while start < len(decodes):
            num_blocks = len(decodes[start].block_table)
            limit = min(len(decodes), start + max(1, MAX_DECODE_GATHER_TOKENS // (num_blocks * self.block_size)))
            end = start + 1
            while end < limit and 4 * len(decodes[end].block_table) >= 3 * num_blocks:
                end += 1
            buckets.append(self._decode_bucket(decodes[start:end], buckets[-1].end if buckets else 0, num_blocks))
            start = end
        return buckets

    def _decode_bucket(self, seqs: list[Sequence], start: int, num_blocks: int) -> DecodeBucket:
        num_queries = max(1 + len(seq.draft_token_ids) for seq in seqs)
        query_rows: list[int] = []
        real_queries: list[int] = []
        query_positions: list[int] = []
        row = start
        for i, seq in enumerate(seqs):
            positions = self._query_positions(seq)
            # a padded query repeats the sequence's last: a real row, attending to real keys
            query_rows += [row + min(j, len(positions) - 1) for j in range(num_queries)]
            query_positions += [positions[min(j, len(positions) - 1)] for j in range(num_queries)]
            real_queries += range(i * num_queries, i * num_queries + len(positions))
            row += len(positions)
        block_tables = [seq.block_table + [0] * (num_blocks - len(seq.block_table)) for seq in seqs]
        key_positions = torch.arange(num_blocks * self.block_size, device=self.device)
        sees = key_positions <= self._tensor(query_positions).view(len(seqs), num_queries, 1, 1)
        # every query head of a KV head's group sees what its query sees
        mask = sees.expand(-1, -1, self.num_queries_per_kv, -1).reshape(len(seqs), 1, -1, len(key_positions))
        return DecodeBucket(
            start,
            row,
            self._tensor(block_tables),
            num_queries,
            self._tensor(query_rows),
            self._tensor(real_queries),
            mask,
        )

    def _prefill_span(self, offset: int, seq: Sequence, start: int, end: int) -> PrefillSpan:
        mask = None
        if start > 0:
            mask = (
                torch.arange(end, device=self.device)[None, :] <= torch.arange(start, end, device=self.device)[:, None]
            )
        return PrefillSpan(offset, offset + end - start, end, self._tensor(seq.block_table), mask)

    def _tensor(self, values: list[int] | list[list[int]] | NDArray[np.integer]) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.long, device=self.device)
