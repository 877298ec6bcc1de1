import math
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    """How one request picks its tokens.

    temperature 0 (the default, what the bot wants) is greedy and ignores every other sampling
    knob. top_k 0 keeps the whole vocabulary. With `dynamic_top_k`, a position where the model's
    top probability (at temperature 1) reaches `confidence` keeps `min_top_k` tokens (1 = greedy),
    any other keeps `max_top_k`; `top_k` is then ignored. `seed` makes sampling reproducible,
    whatever the batch around it. Lower `priority` values are served first and preempted last.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    dynamic_top_k: bool = False
    min_top_k: int = 1
    max_top_k: int = 50
    confidence: float = 0.9
    priority: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = whole vocabulary), got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if not _is_int(self.min_top_k) or self.min_top_k < 1:
            raise ValueError(f"min_top_k must be an integer >= 1, got {self.min_top_k!r}")
        if not _is_int(self.max_top_k) or self.max_top_k < self.min_top_k:
            raise ValueError(f"max_top_k must be an integer >= min_top_k, got {self.max_top_k!r}")
        if not _is_number(self.confidence) or not 0.0 < self.confidence <= 1.0:
            raise ValueError(f"confidence must be in (0, 1], got {self.confidence!r}")
        if not _is_int(self.priority):
            raise ValueError(f"priority must be an integer, got {self.priority!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], steps: list[int]) -> torch.Tensor:
    """One token per row of `logits` [batch, vocab], every row with its own parameters.

    Randomness is a hash of (seed, step, token id) rather than a generator's state, so a seeded
    request draws the same tokens in any batch, after a preemption, and on CPU or CUDA.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if all(p.temperature == 0 for p in params):
        return greedy
    device, vocab_size = logits.device, logits.shape[-1]

    def column(values: list) -> torch.Tensor:
        return torch.tensor(values, device=device)

    is_greedy = column([p.temperature == 0 for p in params])
    temperature = column([p.temperature or 1.0 for p in params])
    # greedy rows keep one candidate, so that they never force a full-vocabulary sort
    top_p = column([p.top_p if p.temperature else 1.0 for p in params])
    top_k = torch.where(
        is_greedy,
        1,
        torch.where(
            column([p.dynamic_top_k for p in params]),
            torch.where(
                top_probability(logits) >= column([p.confidence for p in params]),
                column([p.min_top_k for p in params]),
                column([p.max_top_k for p in params]),
            ),
            column([p.top_k or vocab_size for p in params]),
        ),
    ).clamp(max=vocab_size)
    # top-p acts within the top-k, so the largest k bounds the candidates: only rows with no
    # top-k (k = vocabulary) pay for a full-vocabulary sort
    num_candidates = int(top_k.max())
    values, token_ids = (logits / temperature[:, None]).topk(num_candidates, dim=-1)
    ranks = torch.arange(num_candidates, device=device)
    values = values.masked_fill(ranks >= top_k[:, None], -math.inf)
    probs = values.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    values = values.masked_fill(mass_before >= top_p[:, None], -math.inf)
    noise = gumbel_noise(column(seeds), column(steps), token_ids)
    choice = (values + noise).argmax(dim=-1, keepdim=True)
    sampled = token_ids.gather(-1, choice).squeeze(-1)
    return torch.where(is_greedy, greedy, sampled)


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    return (logits.max(dim=-1).values - logits.logsumexp(dim=-1)).exp()


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch shifts int64 arithmetically; masking the sign extension makes it logical
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from splitmix64 over (seed, step, token id); int64 products wrap."""
    x = seeds[:, None] * _signed(0x9E3779B97F4A7C15) + steps[:, None] * _signed(0xC2B2AE3D27D4EB4F) + token_ids
    x = (x ^ _shift_right(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shift_right(x, 27)) * _signed(0x94D049BB133111EB)
    x = x ^ _shift_right(x, 31)
    uniform = (_shift_right(x, 11).double() + 0.5) / float(1 << 53)
    return (-(-uniform.log()).log()).float()
