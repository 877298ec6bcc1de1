"""The model's projections on CPU (oneDNN) against torch's own linear."""

import pytest
import torch
import torch.nn.functional as F

from engine.model import linear


@pytest.mark.parametrize("num_rows", [0, 1, 8, 300])
@pytest.mark.parametrize("with_bias", [True, False])
def test_cpu_linear_equals_torchs_up_to_float32_rounding(num_rows: int, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(200, 96, generator=generator)
    bias = torch.randn(200, generator=generator) if with_bias else None
    x = torch.randn(num_rows, 96, generator=generator)
    columns = torch.randn(96, num_rows, generator=generator).t()  # rows that are not contiguous
    for rows in (x, columns):
        out = linear(rows, weight, bias)
        assert out.shape == (num_rows, 200)
        torch.testing.assert_close(out, F.linear(rows, weight, bias), rtol=1e-5, atol=1e-5)
