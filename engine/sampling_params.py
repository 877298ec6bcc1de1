import math
from dataclasses import dataclass, field

# A priority at or above this is work no user waits for (a summary, a prefill ahead of a turn):
# the scheduler gives its prompts short chunks and none while a user's prompt prefills.
BACKGROUND_PRIORITY = 1


@dataclass
class SamplingParams:
    """How one request picks its tokens.

    temperature 0 (the default, what the bot wants) is greedy and ignores every other sampling
    knob. top_k 0 keeps the whole vocabulary. With `dynamic_top_k`, a position where the model's
    top probability (at temperature 1) reaches `confidence` keeps `min_top_k` tokens (1 = greedy),
    any other keeps `max_top_k`; `top_k` is then ignored. `seed` makes sampling reproducible,
    whatever the batch around it. Lower `priority` values are served first and preempted last;
    from BACKGROUND_PRIORITY on, a request is background work.
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

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

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
