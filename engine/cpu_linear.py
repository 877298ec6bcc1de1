"""Which library multiplies a batch by a weight on the CPU in float32: MKL (behind F.linear) or
oneDNN, chosen for each weight shape by timing both when the engine starts, since neither wins on
every CPU or at every row count.

MKL takes a generic path on AMD's cores (MKL_VERBOSE names no AVX level): on a 2-core EPYC oneDNN
computed SmolLM2's projections at 8 rows in 21 ms against 36 ms, at 200 rows in 122 against 270,
and its LM head at 8 rows in 4.7 against 13 ms. On a 2-core Intel Xeon (AVX-512) oneDNN costs about
30 us a call that MKL does not (a 256 x 128 weight at 8 rows: 44 against 15 us): the demo model's
layer took MKL 0.28x oneDNN's time at 1 row and 0.79x at 200, SmolLM2's 0.53x at 1 row and 1.07x at
40, while oneDNN computed SmolLM2's LM head at 8 rows 1.75-1.95x faster. Both sum in float32, in
orders other than transformers', and greedy outputs match it token for token with either
(tests/engine/test_parity.py). Float32 only: oneDNN has no bfloat16 inner product on a CPU without
AVX512-BF16 ("could not create a primitive descriptor" on that EPYC).
"""

import math
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

ONEDNN = torch.backends.mkldnn.is_available()

# The row counts timed: a decode step of one sequence, of 8, of 8 with 4 draft tokens each, and a
# prefill chunk (an LM head takes only the sampled rows, a few a sequence). MKL keeps the counts up
# to the first one where oneDNN is as fast.
DECODE_ROWS = (1, 8, 40)
ROWS = (*DECODE_ROWS, 256)
# Calls of each library at a row count, alternated; the fastest of each counts, as whatever else
# the machine runs meanwhile (the app imports its libraries while the engine starts) only adds.
TIMINGS = 5
EVERY_ROW_COUNT = sys.maxsize


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, mkl_max_rows: int = 0
) -> torch.Tensor:
    """x @ weight.T + bias. On the CPU in float32 MKL computes up to `mkl_max_rows` rows of x, oneDNN more."""
    if ONEDNN and x.is_cpu and x.dtype == torch.float32 and x.shape[0] > mkl_max_rows:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def mkl_max_rows(
    weight: torch.Tensor, bias: torch.Tensor | None, threads: Callable[[int], int], rows: Sequence[int] = ROWS
) -> int:
    """How many rows MKL is to compute `weight` with: the largest count of `rows` up to which it
    was faster than oneDNN at every count (0: at none; EVERY_ROW_COUNT: at all, so at any count),
    each count timed on `threads(count)` threads. Leaves torch's thread count at the last count's."""
    most = 0
    for count in rows:
        torch.set_num_threads(threads(count))
        x = torch.randn(count, weight.shape[1], dtype=weight.dtype)
        mkl, onednn = _fastest(x, weight, bias)
        if mkl >= onednn:
            return most
        most = count
    return EVERY_ROW_COUNT


def described(mkl_max_rows: int) -> str:
    if mkl_max_rows == EVERY_ROW_COUNT:
        return "MKL"
    return f"MKL up to {mkl_max_rows} rows, then oneDNN" if mkl_max_rows else "oneDNN"


def _fastest(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[float, float]:
    """The fastest of TIMINGS calls of MKL, and of oneDNN, in seconds."""
    seconds = {EVERY_ROW_COUNT: math.inf, 0: math.inf}
    for _ in range(TIMINGS):
        for most in seconds:
            start = time.perf_counter()
            linear(x, weight, bias, most)
            seconds[most] = min(seconds[most], time.perf_counter() - start)
    return seconds[EVERY_ROW_COUNT], seconds[0]
