"""The projections on a CPU: oneDNN against torch's own linear, and the library each weight shape
is given when an engine starts."""

import logging

import pytest
import torch
import torch.nn.functional as F

from engine import LLMEngine
from engine.cpu_linear import DECODE_ROWS, EVERY_ROW_COUNT, ROWS, linear
from engine.model import Linear
from tests.engine.conftest import Checkpoint

ONEDNN_OP = "mkldnn::_linear_pointwise"


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


def ops_of(rows: int, mkl_max_rows: int) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        linear(torch.randn(rows, 32), torch.randn(64, 32), None, mkl_max_rows)
    return {event.name for event in profile.events()}


def test_mkl_computes_up_to_its_rows_and_onednn_beyond() -> None:
    assert ONEDNN_OP not in ops_of(8, mkl_max_rows=8)
    assert ONEDNN_OP in ops_of(9, mkl_max_rows=8)
    assert ONEDNN_OP in ops_of(1, mkl_max_rows=0)
    assert ONEDNN_OP not in ops_of(4096, mkl_max_rows=EVERY_ROW_COUNT)


def test_an_engine_on_a_cpu_times_each_weight_shape_and_gives_it_one_library(
    small_checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="engine.model_runner"),
        LLMEngine.from_pretrained(str(small_checkpoint.path)) as engine,
    ):
        model = engine.core.runner.model
        chosen: dict[tuple[int, ...], set[int]] = {}
        for module in model.model.modules():
            if isinstance(module, Linear):
                chosen.setdefault(tuple(module.weight.shape), set()).add(module.mkl_max_rows)
    assert len(chosen) == 4  # q/k/v, o, gate/up, down
    assert all(len(rows) == 1 and rows <= {0, *ROWS[:-1], EVERY_ROW_COUNT} for rows in chosen.values())
    assert model.lm_head_mkl_max_rows in {0, *DECODE_ROWS[:-1], EVERY_ROW_COUNT}
    logged = next(record.getMessage() for record in caplog.records if "projections on the CPU" in record.getMessage())
    assert logged.count(" -> ") == len(chosen) and "LM head" in logged
