"""The console's time series: a sample of the cumulative figures every few seconds, turned into
per-interval rates (requests/s, tokens/s, hit rate per cache level) when the charts ask."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cache.levels import CacheLevel
from chat import ChatManager

# The levels whose share of turns the console charts: every way but the model's.
CHARTED_LEVELS = [level for level in CacheLevel if level is not CacheLevel.MISS]


@dataclass(frozen=True)
class Sample:
    at: float
    turns: int  # cumulative
    turns_by_level: dict[str, int]  # cumulative
    generated_tokens: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    batch_size: float
    kv_usage: float
    prefix_hit_rate: float
    cache_entries: int


class Monitor:
    def __init__(self, chat_manager: ChatManager, points: int, clock: Callable[[], float] = time.time) -> None:
        self.chat_manager = chat_manager
        self._clock = clock
        self._samples: deque[Sample] = deque(maxlen=points)

    async def sample(self) -> None:
        """Runs on the event loop (the ChatManager's figures are written there)."""
        figures = self.chat_manager.figures()
        turns, engine = figures.turns, figures.engine
        self._samples.append(
            Sample(
                at=self._clock(),
                turns=turns.total,
                turns_by_level=dict(turns.by_level),
                generated_tokens=engine.activity.generated_tokens,
                ttft_p50_ms=turns.ttft_p50_ms,
                ttft_p99_ms=turns.ttft_p99_ms,
                batch_size=engine.activity.batch_size.mean,
                kv_usage=engine.kv_cache.usage,
                prefix_hit_rate=engine.kv_cache.prefix_hit_rate,
                cache_entries=figures.cache.entries,
            )
        )

    def series(self) -> dict[str, list[float]]:
        """One point per interval between consecutive samples; hit rates are shares of that
        interval's turns (0 when there were none)."""
        samples = list(self._samples)
        gauges = ("ttft_p50_ms", "ttft_p99_ms", "batch_size", "kv_usage", "prefix_hit_rate", "cache_entries")
        series: dict[str, list[float]] = {
            key: []
            for key in (
                "time",
                "requests_per_s",
                "tokens_per_s",
                *gauges,
                *(f"hit_rate_{level}" for level in CHARTED_LEVELS),
            )
        }
        for before, after in itertools.pairwise(samples):
            seconds = after.at - before.at
            turns = after.turns - before.turns
            series["time"].append(after.at)
            series["requests_per_s"].append(turns / seconds)
            series["tokens_per_s"].append((after.generated_tokens - before.generated_tokens) / seconds)
            for level in CHARTED_LEVELS:
                hits = after.turns_by_level[level] - before.turns_by_level[level]
                series[f"hit_rate_{level}"].append(hits / turns if turns else 0.0)
            for key in gauges:
                series[key].append(getattr(after, key))
        return series
