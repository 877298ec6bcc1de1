"""The LM head's greedy pick (greedy_head.c) against torch: logits, then argmax; and the screen
against the exact pass over the whole vocabulary."""

from collections.abc import Iterator

import pytest
import torch

from engine import kernels
from engine.greedy_head import GreedyHead


@pytest.fixture(autouse=True, params=["native", "widened"])
def screen(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test on the kernel as built here, and where that multiplies 8-bit values four at a
    time (AVX512-VNNI, AVX2), again on the pass a CPU without them builds: each 8-bit value widened
    to a float."""
    if request.param == "widened":
        library = kernels.library()
        if library is None or library.greedy_head_group() == 1:
            pytest.skip("the native build widens already")
        monkeypatch.setattr(kernels, "COMPILE", (*kernels.COMPILE, "-DGREEDY_HEAD_WIDENED"))
        kernels.library.cache_clear()
        library = kernels.library()
        assert library is not None and library.greedy_head_group() == 1
    yield
    kernels.library.cache_clear()


def reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden @ weight.T).argmax(dim=-1)


@pytest.mark.parametrize("bfloat16", [True, False], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("num_rows", [1, 7, 8, 9, 64, 130])
def test_it_picks_what_argmax_picks_over_the_logits(bfloat16: bool, num_rows: int) -> None:
    generator = torch.Generator().manual_seed(num_rows)
    # a vocabulary that is no multiple of a panel, a hidden size that is no multiple of a vector
    # nor of the four values a lane multiplies at once
    weight = torch.randn(1001, 70, generator=generator)
    if bfloat16:
        weight = weight.bfloat16().float()
    head = GreedyHead(weight)
    assert head.screened
    hidden = torch.randn(num_rows, 70, generator=generator)
    assert head(hidden).tolist() == reference(hidden, weight).tolist()


def exact(head: GreedyHead, hidden: torch.Tensor) -> list[int]:
    """The kernel's pick with every row computed exactly over the whole vocabulary."""
    head.screened = False
    try:
        return head(hidden).tolist()
    finally:
        head.screened = True


@pytest.mark.parametrize("scale", [0.02, 1.0, 50.0])
@pytest.mark.parametrize("spike", [1.0, 1000.0])
def test_the_screen_picks_what_the_exact_pass_picks(scale: float, spike: float) -> None:
    # close calls: 2,000 rows, each against a vocabulary whose largest logits are crowded; with a
    # spike, one hidden value dwarfs the others, which an 8-bit rounding of the row then loses
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(5000, 64, generator=generator) * scale).bfloat16().float()
    hidden = torch.randn(2000, 64, generator=generator)
    hidden[:, 5] *= spike
    head = GreedyHead(weight)
    assert head(hidden).tolist() == exact(head, hidden)


def test_the_screen_bounds_the_hidden_rows_rounding_too() -> None:
    # Two rows that 8 bits hold exactly, 127 x_0 and 100 x_1 apart by 0.21 in favour of the first;
    # the hidden row, in steps of 0.01 (1.27 / 127), rounds x_0 = 0.3049 down to 0.30 and x_1 =
    # 0.3851 up to 0.39, which puts the second 0.9 ahead on the screen: only the bound on the hidden
    # row's rounding keeps the first. The other rows are small and hold what 8 bits round, so that
    # rounding the hidden row is worth it (where the CPU has AVX2 or AVX512-VNNI).
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(300, 8, generator=generator) * 0.1
    weight[:2] = 0.0
    weight[0, 0], weight[1, 1] = 127.0, 100.0
    hidden = torch.tensor([[0.3049, 0.3851, 1.27, 0.2, -0.5, 0.0, 0.71, -1.0]])
    head = GreedyHead(weight)
    assert head(hidden).tolist() == exact(head, hidden) == [0]


@pytest.mark.parametrize("num_spikes", [3, 12])
def test_a_few_hidden_values_far_past_the_rest_are_screened_unrounded(num_spikes: int) -> None:
    # SmolLM2's final hidden states hold a few values 14x their RMS: the screen keeps up to 8 such
    # values out of a hidden row's 8-bit rounding (where it rounds), and past 8 rounds the rest
    generator = torch.Generator().manual_seed(num_spikes)
    weight = torch.randn(5000, 96, generator=generator).bfloat16().float()
    hidden = torch.randn(500, 96, generator=generator)
    hidden[:, torch.randperm(96, generator=generator)[:num_spikes]] *= 20
    head = GreedyHead(weight)
    assert head(hidden).tolist() == exact(head, hidden)


def test_the_largest_products_the_screen_meets_are_summed_whole() -> None:
    # Every hidden value and every value of row 0 at the 8-bit extreme, their signs alike: AVX2
    # sums 8-bit products in pairs within 16 bits, 2 x 127 x 127 = 32,258 here, just under
    # 32,767; a pair that saturated would screen row 0 out, the largest logit by far
    generator = torch.Generator().manual_seed(11)
    signs = torch.randint(0, 2, (64,), generator=generator).float() * 2 - 1
    weight = torch.randn(2000, 64, generator=generator) * 0.3
    weight[0] = signs
    hidden = 2 * signs[None]
    assert GreedyHead(weight)(hidden).tolist() == reference(hidden, weight).tolist() == [0]


def test_a_row_the_screen_cannot_narrow_is_computed_exactly() -> None:
    # 3,000 ids a hair apart: more candidates than a thread keeps, even once the floor is known
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(1, 32, generator=generator).repeat(3000, 1)
    weight[:, 0] += torch.arange(3000) * 1e-6
    hidden = torch.zeros(2, 32)
    hidden[:, 0] = 1.0
    hidden[1] = -hidden[1]
    assert GreedyHead(weight)(hidden).tolist() == reference(hidden, weight).tolist() == [2999, 0]


def test_a_row_whose_threads_met_too_many_candidates_is_screened_again_from_its_floor() -> None:
    # 3,000 ids alike ahead of one far above them: a thread meets more candidates than it keeps
    # before its floor rises, and the second pass, from the floor the threads found, leaves one
    generator = torch.Generator().manual_seed(4)
    base = torch.randn(32, generator=generator)
    weight = torch.randn(20_000, 32, generator=generator) * 0.01
    weight[:3000] = base + torch.randn(3000, 32, generator=generator) * 1e-4
    weight[15_000] = 2 * base
    hidden = base[None]
    assert GreedyHead(weight)(hidden).tolist() == reference(hidden, weight).tolist() == [15_000]


def test_a_hidden_row_with_an_infinity_is_computed_exactly() -> None:
    weight = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    hidden = torch.randn(3, 16)
    hidden[1, 2] = float("inf")
    hidden[2, 5] = -float("inf")
    assert GreedyHead(weight)(hidden).tolist() == reference(hidden, weight).tolist()


def test_a_tie_goes_to_the_first_index() -> None:
    weight = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    weight[7] *= 4  # the largest logit under its own direction
    weight[40] = weight[250] = weight[7]
    hidden = weight[7:8] / 4
    assert reference(hidden, weight).tolist() == GreedyHead(weight)(hidden).tolist() == [7]


def test_a_nan_is_the_largest_logit_the_first_nan_of_all() -> None:
    weight = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    weight[290, 3] = weight[295, 3] = float("nan")
    hidden = torch.randn(2, 16)
    hidden[1, 0] = float("nan")  # every logit of the row NaN
    assert reference(hidden, weight).tolist() == GreedyHead(weight)(hidden).tolist() == [290, 0]


def test_it_serves_float32_on_cpu() -> None:
    assert GreedyHead.serves(torch.ones(4, 2))
    assert not GreedyHead.serves(torch.ones(4, 2, dtype=torch.bfloat16))
    assert not GreedyHead.serves(torch.ones(4, 2, device="meta"))


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_ties_and_nans_across_the_runs_the_threads_take(num_threads: int) -> None:
    # 40,000 ids are dozens of the threads' runs of panels, taken in whatever order they come
    generator = torch.Generator().manual_seed(num_threads)
    tied = torch.randn(40_000, 8, generator=generator)
    tied[[30_000, 9_000, 21_000]] = 4 * tied[5]
    with_nans = tied.clone()
    with_nans[[35_000, 12_345], 3] = float("nan")
    hidden = torch.randn(4, 8, generator=generator)
    hidden[0] = tied[5]
    hidden[1, 0] = float("nan")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        picks = [GreedyHead(weight)(hidden).tolist() for weight in (tied, with_nans)]
    finally:
        torch.set_num_threads(threads_before)
    assert picks == [reference(hidden, weight).tolist() for weight in (tied, with_nans)]
    # a tie of three runs far apart; a row of NaN logits; NaN logits among numbers
    assert [picks[0][0], picks[0][1], picks[1][0]] == [9_000, 0, 12_345]
