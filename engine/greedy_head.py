"""The LM head and a greedy pick on CPU in float32: greedy_head.c, built with the engine's other
kernels (kernels.py).

A greedy step needs only the index of each row's largest logit. oneDNN writes all of them and
argmax reads them back: on the demo model (151,936 x 128) that is 6.9 ms at 8 rows and 15.3 ms at
40 (2 cores, AMD EPYC); a pass that keeps each row's running maximum took 1.6 and 8.7 ms. Such a
step is bound by reading the LM head, and under the app's load more so (the demo's in bfloat16,
39 MB, took 6-12 ms a step on the peer workload; 2-8 ms idle), so the pass reads an 8-bit copy
of it, a quarter of float32's bytes (the demo's 19 MB, SmolLM2's 28 MB against 113), which rules
out every id but a few; those few are computed exactly from the LM head itself. Where the CPU has
AVX512-VNNI or AVX2, the screen rounds the hidden rows to 8 bits as well, but for a few values far
past the rest (SmolLM2's hold such outliers), where their rounding's bound stays within twice the
LM head's own, and multiplies four 8-bit values an instruction (AVX2: three): the demo's LM head on
2 threads at 8 / 40 rows took 0.79 / 2.72 ms against 1.79 / 8.28 ms widening each value to a float
(AVX512-VNNI, Intel Xeon), 0.68x / 0.67x the time with AVX2 (AMD EPYC). The greedy token
is the one exact float32 logits give, bit for bit the pick of a full pass in float32: its logits
sum in hidden order, another order than oneDNN's, as oneDNN's is than MKL's, and greedy outputs
still match transformers' token for token (tests/engine/test_parity.py).
"""

import torch

from . import kernels

# the screen's rounding: each vocabulary row scaled to [-QUANT_MAX, QUANT_MAX]
QUANT_MAX = 127
# float32's unit roundoff
UNIT_ROUNDOFF = 2.0**-24
# vocabulary rows the screen is computed for at a time
SLICE_ROWS = 4096


class GreedyHead:
    """`head(hidden)`: the greedy token of each row of `hidden` [rows, hidden_size] under `weight`,
    the LM head [vocab_size, hidden_size], which it keeps a reference to (no copy)."""

    def __init__(self, weight: torch.Tensor) -> None:
        library = kernels.library()
        assert library is not None and weight.dtype == torch.float32 and weight.device.type == "cpu"
        self._library = library
        self.weight = weight.contiguous()
        self.vocab_size, self.hidden_size = weight.shape
        # a value that is not finite has no bound: every row is then computed exactly
        self.screened = bool(torch.isfinite(weight).all())
        if self.screened:
            self.panels, self.bounds = _screen(weight, library.greedy_head_lanes(), library.greedy_head_group())
            # the median vocabulary row's error norm, largest error, and its rounding's norm and sum
            # of magnitudes: whether rounding a hidden row to 8 bits pays (MAX_ROUNDING_RATIO)
            self.typical = self.bounds[[1, 2, 4, 5], : self.vocab_size].median(dim=1).values.contiguous()
        else:  # not read
            self.panels, self.bounds = weight.new_empty(0, dtype=torch.int8), weight.new_empty(0)
            self.typical = weight.new_empty(0)
        # the candidates the kernel keeps, grown to the most rows and threads a call has had
        self._workspace = torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def serves(weight: torch.Tensor) -> bool:
        """Whether the kernel builds here and takes this LM head: float32 on CPU."""
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and kernels.library() is not None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        assert hidden.dtype == torch.float32 and hidden.shape[1] == self.hidden_size
        hidden = hidden.contiguous()
        token_ids = torch.empty(len(hidden), dtype=torch.long)
        threads = torch.get_num_threads()
        per_thread = self._library.greedy_head_workspace(len(hidden))
        if len(self._workspace) < per_thread * threads:
            self._workspace = torch.empty(per_thread * threads, dtype=torch.uint8)
        self._library.greedy_head(
            hidden.data_ptr(),
            self.weight.data_ptr(),
            self.panels.data_ptr(),
            self.bounds.data_ptr(),
            self.typical.data_ptr(),
            self._workspace.data_ptr(),
            threads,
            token_ids.data_ptr(),
            self.screened,
            len(hidden),
            self.vocab_size,
            self.hidden_size,
        )
        return token_ids


def _screen(weight: torch.Tensor, lanes: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-bit screen of `weight`, its rows padded with zeros to a whole number of panels and its
    hidden size to a whole number of `group`s: the panels, and each row's scale and bounds [7,
    padded rows]: scale, error norm, largest error, rounding, the rounded row's norm and sum of
    magnitudes, and the sum of its 8-bit values.

    Panel p holds vocabulary rows [2p * lanes, (2p + 2) * lanes), a low and a high half of `lanes`
    rows, `group` hidden indices at a time: [panel, half, lane, hidden / group, group] becomes
    [panel, hidden / group, half, lane, group]. A row's screened logit, its sum over the hidden row
    x times its scale, lies within min(|x| * error norm, sum |x_k| * largest error) + |x| * rounding
    of the exact float32 one: the row's rounding error against x (Cauchy-Schwarz, or Hoelder with
    the largest error), and both float32 sums' rounding, at most (hidden_size + 1) roundoffs of |x|
    times the norm of what each multiplies (and a few more for the kernel's additions). Where the
    kernel rounds x to 8 bits too (AVX2, AVX512-VNNI), x's error e against the rounded row adds
    min(|e| * its norm, max |e_k| * its sum of magnitudes), and the rounding is of |x| + |e|; the
    values it keeps out of the rounding have no error, and their products' float32 roundings, three
    each, stay within the allowance: each is past 4x the row's RMS, so they are fewer than
    hidden_size / 16. Each bound is raised by 0.1% against the kernel's own float32 products.
    """
    vocab_size, hidden_size = weight.shape
    padded = vocab_size + -vocab_size % (2 * lanes)
    padded_hidden = hidden_size + -hidden_size % group
    quantized = torch.zeros(padded, padded_hidden, dtype=torch.int8)
    bounds = torch.zeros(7, padded)
    # in float64, a slice at a time: the demo's whole LM head at once took 0.8 s, in slices 0.3 s
    for start in range(0, vocab_size, SLICE_ROWS):
        rows = weight[start : start + SLICE_ROWS].double()
        scale = (rows.abs().amax(dim=1) / QUANT_MAX).float().double()  # float32 values, as the kernel has them
        scale[scale == 0] = 1.0
        values = torch.round(rows / scale[:, None]).clamp_(-QUANT_MAX, QUANT_MAX)
        error = rows - values * scale[:, None]
        rounding = (hidden_size + 8) * UNIT_ROUNDOFF * (scale * values.norm(dim=1) + rows.norm(dim=1))
        rounded = scale[:, None] * values
        margins = torch.stack(
            [error.norm(dim=1), error.abs().amax(dim=1), rounding, rounded.norm(dim=1), rounded.abs().sum(dim=1)]
        ) * (1 + 1e-3)
        end = start + len(rows)
        bounds[:, start:end] = torch.cat([scale[None], margins, values.sum(dim=1)[None]])
        quantized[start:end, :hidden_size] = values
    panels = quantized.view(-1, 2, lanes, padded_hidden // group, group).permute(0, 3, 1, 2, 4).contiguous()
    return panels, bounds
