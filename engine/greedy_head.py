"""The LM head and a greedy pick in one pass on CPU in float32: greedy_head.c, built with the
engine's other kernels (kernels.py).

A greedy step needs only the index of each row's largest logit. oneDNN writes all of them and
argmax reads them back: on the demo model (151,936 x 128) that is 6.9 ms at 8 rows and 15.3 ms at
40 (2 cores, AMD EPYC); the fused pass takes 1.6 and 8.7 ms. Panels of two vectors a hidden index
(greedy_head.c) took 0.74-0.80x the time of panels of one at 24-40 rows, the rows of a step with
draft tokens, and 0.86-0.91x at 8-16 (2 cores, Intel Xeon with AVX-512, both in one process).
A step of a few rows is bound by
reading the LM head, so it is kept in bfloat16 where that holds every value exactly: a bfloat16
checkpoint run in float32, as transformers runs it, computes the same products from half the bytes
(78 MB of the demo's LM head become 39 MB). The panels are a copy of the LM head: its float32
size again, or half of it in bfloat16.
Logits sum in hidden order, another order than oneDNN's, as oneDNN's is than MKL's: greedy
outputs still match transformers' token for token (tests/engine/test_parity.py).
"""

import torch

from . import kernels


class GreedyHead:
    """`head(hidden)`: the greedy token of each row of `hidden` [rows, hidden_size] under `weight`."""

    def __init__(self, weight: torch.Tensor) -> None:
        library = kernels.library()
        assert library is not None and weight.dtype == torch.float32 and weight.device.type == "cpu"
        self._library = library
        self.vocab_size, self.hidden_size = weight.shape
        narrow = weight.bfloat16()
        self.is_bf16 = torch.equal(narrow.float(), weight)
        values = narrow.view(torch.int16) if self.is_bf16 else weight
        lanes = library.greedy_head_lanes()
        padding = values.new_zeros(-self.vocab_size % (2 * lanes), self.hidden_size)
        # panel p holds vocabulary rows [2p * lanes, (2p + 2) * lanes), a low and a high half of
        # `lanes` rows, hidden index by hidden index: [panel, half, lane, hidden] becomes
        # [panel, hidden, lane, half] in bfloat16 (a 32-bit word holds both halves' values of a
        # lane) and [panel, hidden, half, lane] in float32
        halves = torch.cat([values, padding]).view(-1, 2, lanes, self.hidden_size)
        order = (0, 3, 2, 1) if self.is_bf16 else (0, 3, 1, 2)
        self.panels = halves.permute(order).contiguous()

    @staticmethod
    def serves(weight: torch.Tensor) -> bool:
        """Whether the kernel builds here and takes this LM head: float32 on CPU."""
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and kernels.library() is not None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        assert hidden.dtype == torch.float32 and hidden.shape[1] == self.hidden_size
        hidden = hidden.contiguous()
        token_ids = torch.empty(len(hidden), dtype=torch.long)
        self._library.greedy_head(
            hidden.data_ptr(),
            self.panels.data_ptr(),
            token_ids.data_ptr(),
            self.is_bf16,
            len(hidden),
            self.vocab_size,
            self.hidden_size,
        )
        return token_ids
