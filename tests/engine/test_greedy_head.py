"""The LM head's greedy pick (greedy_head.c) against torch: logits, then argmax; and the screen
against the exact pass over the whole vocabulary."""

import pytest
import torch

from engine.greedy_head import GreedyHead


def reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden @ weight.T).argmax(dim=-1)


@pytest.mark.parametrize("bfloat16", [True, False], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("num_rows", [1, 7, 8, 9, 64, 130])
def test_it_picks_what_argmax_picks_over_the_logits(bfloat16: bool, num_rows: int) -> None:
    generator = torch.Generator().manual_seed(num_rows)
    # a vocabulary that is no multiple of a panel, a hidden size that is no multiple of a vector
    weight = torch.randn(1001, 72, generator=generator)
    if bfloat16:
        weight = weight.bfloat16().float()
    head = GreedyHead(weight)
    assert head.screened
    hidden = torch.randn(num_rows, 72, generator=generator)
    assert head(hidden).tolist() == reference(hidden, weight).tolist()


def exact(head: GreedyHead, hidden: torch.Tensor) -> list[int]:
    """The kernel's pick with every row computed exactly over the whole vocabulary."""
    head.screened = False
    try:
        return head(hidden).tolist()
    finally:
        head.screened = True


@pytest.mark.parametrize("scale", [0.02, 1.0, 50.0])
def test_the_screen_picks_what_the_exact_pass_picks(scale: float) -> None:
    # close calls: 2,000 rows, each against a vocabulary whose largest logits are crowded
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(5000, 64, generator=generator) * scale).bfloat16().float()
    hidden = torch.randn(2000, 64, generator=generator)
    head = GreedyHead(weight)
    assert head(hidden).tolist() == exact(head, hidden)


def test_a_row_the_screen_cannot_narrow_is_computed_exactly() -> None:
    # 3,000 ids a hair apart: more candidates than a thread keeps, even once the floor is known
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(1, 32, generator=generator).repeat(3000, 1)
    weight[:, 0] += torch.arange(3000) * 1e-6
    hidden = torch.zeros(2, 32)
    hidden[:, 0] = 1.0
    hidden[1] = -hidden[1]
    assert GreedyHead(weight)(hidden).tolist() == reference(hidden, weight).tolist() == [2999, 0]


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
