"""Which entries leave first when the cache is full: adaptive (the default), LRU or LFU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from settings import CacheSettings


@dataclass
class Usage:
    """What eviction knows of an entry. Times are clock seconds."""

    created: float
    last_used: float
    hits: int = 0
    closeness: float = 0.0  # decayed sum of relatedness to the queries seen, as of `closeness_at`
    closeness_at: float = 0.0

    def hit(self, now: float) -> None:
        self.hits += 1
        self.last_used = now

    def closeness_now(self, now: float, half_life_s: float) -> float:
        return self.closeness * 0.5 ** ((now - self.closeness_at) / half_life_s)

    def credit(self, relatedness: float, now: float, half_life_s: float) -> None:
        assert 0.0 <= relatedness <= 1.0
        self.closeness = self.closeness_now(now, half_life_s) + relatedness
        self.closeness_at = now


class EvictionPolicy(Protocol):
    def scores(self, usages: Sequence[Usage], now: float) -> np.ndarray:
        """One score per usage; the lowest are evicted first (ties: the earlier in `usages`)."""
        ...


class LruPolicy:
    def scores(self, usages: Sequence[Usage], now: float) -> np.ndarray:
        return np.fromiter((u.last_used for u in usages), dtype=np.float64, count=len(usages))


class LfuPolicy:
    def scores(self, usages: Sequence[Usage], now: float) -> np.ndarray:
        return np.fromiter((u.hits for u in usages), dtype=np.float64, count=len(usages))


@dataclass(frozen=True)
class AdaptivePolicy:
    """Frequency, closeness to what is being asked now, and time since last use, weighed.

    Frequency alone keeps yesterday's favourites forever when the topics drift; recency alone
    forgets the evergreen questions. Closeness keeps an entry whose neighbourhood is busy even
    before it has been hit itself, which is how a drifting topic announces itself."""

    settings: CacheSettings

    def scores(self, usages: Sequence[Usage], now: float) -> np.ndarray:
        s = self.settings
        return np.fromiter(
            (
                s.frequency_weight * math.log1p(u.hits)
                + s.closeness_weight * u.closeness_now(now, s.closeness_half_life_s)
                - s.age_weight * (now - u.last_used) / s.age_scale_s
                for u in usages
            ),
            dtype=np.float64,
            count=len(usages),
        )


def build_policy(settings: CacheSettings) -> EvictionPolicy:
    if settings.policy == "lru":
        return LruPolicy()
    if settings.policy == "lfu":
        return LfuPolicy()
    return AdaptivePolicy(settings)


def victims(policy: EvictionPolicy, usages: Sequence[Usage], count: int, now: float) -> list[int]:
    """Positions in `usages` of the `count` entries to evict, first to go first."""
    order = np.argsort(policy.scores(usages, now), kind="stable")
    return order[:count].tolist()
