import math

import pytest
import torch

from engine import SamplingParams
from engine.sampler import sample, top_probability


def random_logits(rows: int, vocab: int = 500, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def draw(logits: torch.Tensor, params: SamplingParams, seeds: list[int], steps: list[int]) -> torch.Tensor:
    return sample(logits, [params] * len(seeds), seeds, steps)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(temperature=-1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(top_p=0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-5), "max_tokens"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(min_top_k=0), "min_top_k"),
        (dict(min_top_k=5, max_top_k=2), "max_top_k"),
        (dict(confidence=0), "confidence"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_params_validate_themselves(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_stop_accepts_a_single_string() -> None:
    assert SamplingParams(stop="END").stop == ["END"]  # type: ignore[arg-type]  # accepted at run time, beyond the annotation


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = random_logits(4)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    first = draw(logits, params, [7, 7, 8, 9], [0, 1, 0, 0])
    assert torch.equal(first, draw(logits, params, [7, 7, 8, 9], [0, 1, 0, 0]))
    # a row's draw does not depend on the rest of the batch
    assert first[2] == draw(logits[2:3], params, [8], [0])[0]
    uniform = torch.zeros(64, 100)
    assert len(set(draw(uniform, params, list(range(64)), [0] * 64).tolist())) > 30


def test_greedy_and_top_k_1_pick_the_argmax() -> None:
    logits = random_logits(16)
    seeds, steps = list(range(16)), [3] * 16
    assert torch.equal(draw(logits, SamplingParams(), seeds, steps), logits.argmax(-1))
    assert torch.equal(draw(logits, SamplingParams(temperature=1.5, top_k=1), seeds, steps), logits.argmax(-1))


def test_mixed_batch_keeps_each_rows_parameters() -> None:
    logits = random_logits(2)
    params = [SamplingParams(), SamplingParams(temperature=5.0)]
    tokens = torch.stack([sample(logits, params, [0, 0], [s, s]) for s in range(50)])
    assert (tokens[:, 0] == logits[0].argmax()).all()
    assert len(set(tokens[:, 1].tolist())) > 10


def frequencies(logits_row: torch.Tensor, params: SamplingParams, draws: int = 8000) -> torch.Tensor:
    tokens = draw(logits_row.expand(draws, -1), params, [11] * draws, list(range(draws)))
    return torch.bincount(tokens, minlength=logits_row.numel()).float() / draws


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    probs = torch.tensor([0.5, 0.3, 0.12, 0.08])
    logits = probs.log()[None]
    assert torch.allclose(frequencies(logits, SamplingParams(temperature=1.0)), probs, atol=0.02)
    kept = frequencies(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(kept, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.02)
    assert kept[2:].sum() == 0
    assert frequencies(logits, SamplingParams(temperature=1.0, top_p=0.5))[0] == 1.0


def test_top_k_limits_the_candidates() -> None:
    logits = torch.tensor([[4.0, 3.9, 3.8, 3.7, 0.0, -1.0]])
    kept = frequencies(logits, SamplingParams(temperature=1.0, top_k=3), draws=3000)
    assert kept[3:].sum() == 0 and (kept[:3] > 0.2).all()


def test_dynamic_top_k_is_greedy_exactly_at_confident_positions() -> None:
    logits = random_logits(64, vocab=200, seed=3) / 3
    logits[::2, 17] += 10  # every even row: one token holds nearly all the mass
    params = SamplingParams(temperature=1.0, dynamic_top_k=True, min_top_k=1, max_top_k=20, confidence=0.9)
    confident = top_probability(logits, logits.max(dim=-1).values) >= 0.9
    assert confident[::2].all() and not confident[1::2].any()
    runs = torch.stack([draw(logits, params, list(range(64)), [s] * 64) for s in range(20)])
    argmax = logits.argmax(-1)
    assert (runs[:, confident] == argmax[confident]).all()
    assert (runs[:, ~confident] != argmax[~confident]).any()
    top20 = logits.topk(20, dim=-1).indices
    assert all(set(runs[:, row].tolist()) <= set(top20[row].tolist()) for row in range(64))


def test_a_greedy_row_beside_sampled_ones_picks_what_argmax_picks_among_ties_and_nans() -> None:
    nan = float("nan")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [nan, 1.0, nan, 0.0], [0.0, 1.0, 2.0, 3.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)]
    assert sample(logits, params, [0, 0, 0], [0, 0, 0])[:2].tolist() == logits.argmax(dim=-1)[:2].tolist() == [1, 0]
