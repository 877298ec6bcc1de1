"""`--plot PATH`: latency distributions, how requests were served, TTFT per kind of traffic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter
from report import Run

SERVED_BY = (("generated", "model"), ("merged", "merged"), ("semantic", "L2 semantic"), ("exact", "L1 exact"))


def plot(path: Path, runs: list[Run]) -> None:
    # A bare Figure, not pyplot: no backend to pick, no window, no global state.
    figure = Figure(figsize=(12, 8.5))
    axes = figure.subplots(2, 2)
    _cdf(axes[0, 0], runs, "ttft_s", "time to first token (ms)")
    _cdf(axes[0, 1], runs, "latency_s", "end-to-end latency (ms)")
    _served(axes[1, 0], runs)
    _ttft_by_kind(axes[1, 1], runs)
    figure.suptitle("end-to-end benchmark, as measured by the client")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _cdf(ax: Axes, runs: list[Run], field: str, title: str) -> None:
    for run in runs:
        values = np.sort([getattr(s, field) * 1000 for s in run.samples])
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=run.label)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(title)
    ax.set_ylabel("share of requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def _served(ax: Axes, runs: list[Run]) -> None:
    """Share of requests per way of answering them (from the app's counters)."""
    labels = [run.label for run in runs]
    bottoms = np.zeros(len(runs))
    for attribute, name in SERVED_BY:
        counts = np.array([getattr(run.counters, attribute) if run.counters else 0 for run in runs], dtype=float)
        shares = 100 * counts / np.maximum([len(run.samples) for run in runs], 1)
        ax.bar(labels, shares, bottom=bottoms, label=name)
        bottoms += shares
    ax.set_ylabel("% of requests")
    ax.set_title("how requests were served")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))


def _ttft_by_kind(ax: Axes, runs: list[Run]) -> None:
    kinds = sorted({s.kind for run in runs for s in run.samples})
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        medians = [np.median([s.ttft_s * 1000 for s in run.samples if s.kind == kind] or [np.nan]) for kind in kinds]
        ax.bar(np.arange(len(kinds)) + index * width, medians, width, label=run.label)
    ax.set_xticks(np.arange(len(kinds)) + width * (len(runs) - 1) / 2, kinds)
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_title("time to first token by kind of traffic")
    ax.legend()
