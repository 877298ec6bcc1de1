"""A run's figures, the two sides side by side, the seed articles' claims beside ours."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from client import Counters
from workload import Kind


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it."""

    kind: Kind
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Run:
    label: str
    samples: list[Sample]
    errors: list[str]
    wall_s: float
    counters: Counters | None  # None when the console's counters could not be read
    peak_rss_mb: float | None  # None for an app this benchmark did not start


@dataclass(frozen=True)
class Figures:
    requests: int
    errors: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p95: float
    ttft_ms_p99: float
    latency_ms_p50: float
    latency_ms_p99: float
    requests_per_s: float
    output_tokens_per_s: float
    usage_prompt_tokens: int
    usage_cached_tokens: int
    peak_rss_mb: float | None
    # From the app's counters; None without them.
    engine_requests: int | None = None
    exact_hits: int | None = None
    semantic_hits: int | None = None
    merged: int | None = None
    compressions: int | None = None
    prompt_tokens_computed: int | None = None
    prompt_tokens_reused: int | None = None
    exact_hit_pct: float | None = None
    semantic_hit_pct: float | None = None
    served_without_model_pct: float | None = None
    prompt_reused_pct: float | None = None
    # Where a tail comes from: each kind of traffic in the workload on its own.
    ttft_ms_p95_by_kind: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> Figures:
        ttft_ms = np.array([s.ttft_s for s in run.samples]) * 1000
        latency_ms = np.array([s.latency_s for s in run.samples]) * 1000
        return cls(
            requests=len(run.samples),
            errors=len(run.errors),
            ttft_ms_mean=float(ttft_ms.mean()),
            ttft_ms_p50=_percentile(ttft_ms, 50),
            ttft_ms_p95=_percentile(ttft_ms, 95),
            ttft_ms_p99=_percentile(ttft_ms, 99),
            latency_ms_p50=_percentile(latency_ms, 50),
            latency_ms_p99=_percentile(latency_ms, 99),
            requests_per_s=len(run.samples) / run.wall_s,
            output_tokens_per_s=sum(s.completion_tokens for s in run.samples) / run.wall_s,
            usage_prompt_tokens=sum(s.prompt_tokens for s in run.samples),
            usage_cached_tokens=sum(s.cached_tokens for s in run.samples),
            peak_rss_mb=run.peak_rss_mb,
            ttft_ms_p95_by_kind={
                kind: round(_percentile(np.array([s.ttft_s for s in run.samples if s.kind == kind]) * 1000, 95), 1)
                for kind in sorted({s.kind for s in run.samples})
            },
            **(_server_side(run.counters) if run.counters else {}),
        )


def _server_side(c: Counters) -> dict[str, Any]:
    turns = c.generated + c.exact + c.semantic + c.merged
    return {
        "engine_requests": c.engine_requests,
        "exact_hits": c.exact,
        "semantic_hits": c.semantic,
        "merged": c.merged,
        "compressions": c.compressions,
        "prompt_tokens_computed": c.prompt_tokens - c.reused_tokens,
        "prompt_tokens_reused": c.reused_tokens,
        "exact_hit_pct": _pct(c.exact, turns),
        "semantic_hit_pct": _pct(c.semantic, turns),
        "served_without_model_pct": _pct(turns - c.generated, turns),
        "prompt_reused_pct": _pct(c.reused_tokens, c.prompt_tokens),
    }


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


def _pct(part: float, whole: float) -> float | None:
    return 100 * part / whole if whole else None


def _change_pct(before: float | None, after: float | None) -> float | None:
    ratio = _ratio(before, after)
    return None if ratio is None else 100 * (ratio - 1)


# --- side by side -----------------------------------------------------------------------------

ROWS: tuple[tuple[str, str], ...] = (
    ("TTFT p50 (ms)", "ttft_ms_p50"),
    ("TTFT p95 (ms)", "ttft_ms_p95"),
    ("TTFT p99 (ms)", "ttft_ms_p99"),
    ("TTFT mean (ms)", "ttft_ms_mean"),
    ("latency p50 (ms)", "latency_ms_p50"),
    ("latency p99 (ms)", "latency_ms_p99"),
    ("requests/s", "requests_per_s"),
    ("output tokens/s", "output_tokens_per_s"),
    ("engine requests", "engine_requests"),
    ("L1 exact hits", "exact_hits"),
    ("L2 semantic hits", "semantic_hits"),
    ("merged requests", "merged"),
    ("served without a model call (%)", "served_without_model_pct"),
    ("compressions", "compressions"),
    ("prompt tokens computed (engine)", "prompt_tokens_computed"),
    ("prompt tokens reused (prefix cache)", "prompt_tokens_reused"),
    ("prompt tokens (usage)", "usage_prompt_tokens"),
    ("cached tokens (usage)", "usage_cached_tokens"),
    ("peak memory, app RSS (MB)", "peak_rss_mb"),
    ("requests answered", "requests"),
    ("requests failed", "errors"),
)

# Figures whose optimized/baseline ratio means something (hit counts start from 0).
RATIO_FIELDS = (
    "ttft_ms_p50",
    "ttft_ms_p95",
    "ttft_ms_p99",
    "ttft_ms_mean",
    "latency_ms_p50",
    "latency_ms_p99",
    "requests_per_s",
    "output_tokens_per_s",
    "engine_requests",
    "prompt_tokens_computed",
    "peak_rss_mb",
)


def ratios(baseline: Figures, optimized: Figures) -> dict[str, float | None]:
    """optimized / baseline for each figure in RATIO_FIELDS."""
    return {name: _ratio(getattr(baseline, name), getattr(optimized, name)) for name in RATIO_FIELDS}


def _ratio(before: float | None, after: float | None) -> float | None:
    return after / before if before and after is not None else None


def table(figures: dict[str, Figures]) -> str:
    """One column per side; with two sides, the ratio and the change of the second to the first.
    After the TTFT rows, the TTFT p95 of each kind of traffic."""
    compare = len(figures) == 2
    lines = [["", *figures, *(["ratio", "change"] if compare else [])]]

    def add(title: str, values: list[Any], with_ratio: bool) -> None:
        cells = [_cell(value) for value in values]
        if compare:
            ratio = _ratio(*values) if with_ratio else None
            cells += [_cell(ratio, "{:.2f}x"), _cell(None if ratio is None else 100 * (ratio - 1), "{:+.1f}%")]
        lines.append([title, *cells])

    for title, name in ROWS:
        add(title, [getattr(f, name) for f in figures.values()], name in RATIO_FIELDS)
        if name == "ttft_ms_mean":
            for kind in next(iter(figures.values())).ttft_ms_p95_by_kind:
                add(f"  TTFT p95, {kind} (ms)", [f.ttft_ms_p95_by_kind.get(kind) for f in figures.values()], True)
    return _align(lines)


def _cell(value: float | None, form: str = "{:,.1f}") -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else form.format(value)


def _align(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


# --- the seed articles' claims ----------------------------------------------------------------

Measure = Callable[[Figures, Figures], float | None]


def _change(name: str) -> Measure:
    return lambda baseline, optimized: _change_pct(getattr(baseline, name), getattr(optimized, name))


def _optimized(name: str) -> Measure:
    return lambda _, optimized: getattr(optimized, name)


@dataclass(frozen=True)
class Claim:
    figure: str
    claimed_pct: float
    relative: bool  # a change from the baseline; else a share on the optimized side
    source: str
    ours: Measure

    @property
    def form(self) -> str:
        return "{:+.1f}%" if self.relative else "{:.1f}%"


CLAIMS: tuple[Claim, ...] = (
    Claim("TTFT mean", -75.4, True, "004: multi-turn KV reuse, 1820 -> 447 ms", _change("ttft_ms_mean")),
    Claim("TTFT p95", -73.6, True, "004: 2950 -> 780 ms", _change("ttft_ms_p95")),
    Claim("requests/s", 129, True, "004: 8.3 -> 19.1 req/s", _change("requests_per_s")),
    Claim("requests/s", 212, True, "003: gateway cache + merging, 12.4 -> 38.7 QPS", _change("requests_per_s")),
    Claim("latency p99", -46, True, "003", _change("latency_ms_p99")),
    Claim(
        "end-to-end latency (ours: p50)", -76.7, True, "000: semantic cache, 1200 -> 280 ms", _change("latency_ms_p50")
    ),
    Claim("peak memory (theirs GPU, ours app RSS)", -38.3, True, "004: 32.1 -> 19.8 GB", _change("peak_rss_mb")),
    Claim(
        "served without a model call",
        92.4,
        False,
        "003: 7.6% of requests reached the model",
        _optimized("served_without_model_pct"),
    ),
    Claim("L1 exact hits", 31.1, False, "003: share of requests", _optimized("exact_hit_pct")),
    Claim("L2 semantic hits", 46.5, False, "003: share of requests", _optimized("semantic_hit_pct")),
    Claim("prompt tokens from the KV cache", 68.3, False, "003: KV reuse rate", _optimized("prompt_reused_pct")),
)


def claims(baseline: Figures, optimized: Figures) -> list[dict[str, Any]]:
    return [
        {
            "figure": c.figure,
            "claimed_pct": c.claimed_pct,
            "ours_pct": _rounded(c.ours(baseline, optimized)),
            "source": c.source,
        }
        for c in CLAIMS
    ]


def claims_table(baseline: Figures, optimized: Figures) -> str:
    lines = [["seed article claim", "claimed", "ours", "source"]]
    for c in CLAIMS:
        lines.append([c.figure, c.form.format(c.claimed_pct), _cell(c.ours(baseline, optimized), c.form), c.source])
    return _align(lines)


def as_json(figures: Figures) -> dict[str, Any]:
    return {f.name: _rounded(getattr(figures, f.name)) for f in fields(figures)}


def _rounded(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value
