"""The pipeline's figures, with the engine's, the cache's and the merger's: one typed tree for the
console, /metrics and the /stats command."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from cache.levels import CacheLevel
from cache.response_cache import CacheFigures
from chat.merging import MergerFigures
from engine import EngineFigures

# Turns the TTFT percentiles are taken over.
TTFT_WINDOW = 1000


@dataclass(frozen=True)
class TurnFigures:
    total: int
    by_level: dict[str, int]  # CacheLevel value -> turns answered that way
    compressions: int
    ttft_p50_ms: float
    ttft_p99_ms: float


@dataclass(frozen=True)
class ChatFigures:
    turns: TurnFigures
    engine: EngineFigures
    cache: CacheFigures
    merging: MergerFigures


class TurnCounter:
    """Turns by how they were answered, compressions, and the latest turns' TTFTs. Event loop only."""

    def __init__(self) -> None:
        self._levels: Counter[CacheLevel] = Counter()
        self._compressions = 0
        self._ttfts: deque[float] = deque(maxlen=TTFT_WINDOW)

    def count_turn(self, level: CacheLevel, ttft_s: float) -> None:
        self._levels[level] += 1
        self._ttfts.append(ttft_s)

    def count_compression(self) -> None:
        self._compressions += 1

    def figures(self) -> TurnFigures:
        ttfts = np.array(self._ttfts) if self._ttfts else np.zeros(1)
        return TurnFigures(
            total=self._levels.total(),
            by_level={level.value: self._levels[level] for level in CacheLevel},
            compressions=self._compressions,
            ttft_p50_ms=float(np.percentile(ttfts, 50) * 1000),
            ttft_p99_ms=float(np.percentile(ttfts, 99) * 1000),
        )
