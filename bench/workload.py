"""The benchmark's traffic: a YAML description (bench/workload.yaml) and the conversations it makes.

The file describes kinds of traffic and their share; `build_scripts` turns it into a fixed list
of scripts for a given number of requests, the same for every run with the same seed, so the
baseline and the optimized side answer exactly the same questions in the same order."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

T = TypeVar("T")
Kind = Literal["faq", "paraphrase", "burst", "multi_turn", "long", "unique"]


class Section(BaseModel):
    # The app stores messages stripped; a transcript sent back must match what it stored.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class FaqEntry(Section):
    question: str = Field(min_length=1)
    paraphrases: list[str] = Field(min_length=1)


class FaqTraffic(Section):
    popularity: float = Field(1.0, ge=0)
    questions: list[FaqEntry] = Field(min_length=1)


class BurstTraffic(Section):
    size: int = Field(4, ge=1)
    questions: list[str] = Field(min_length=1)


class MultiTurnTraffic(Section):
    turns: tuple[int, int] = (2, 4)
    follow_ups: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _enough_follow_ups(self) -> MultiTurnTraffic:
        low, high = self.turns
        if not 2 <= low <= high <= len(self.follow_ups) + 1:
            raise ValueError("turns must be [low, high] with 2 <= low <= high <= number of follow_ups + 1")
        return self


class LongTraffic(Section):
    turns: int = Field(8, ge=1)
    log_lines: int = Field(10, ge=1)
    prompts: list[str] = Field(min_length=1)
    services: list[str] = Field(min_length=1)


class UniqueTraffic(Section):
    """Conversations in which every message is new: no cache, merge or shared prefix can help."""

    turns: tuple[int, int] = (3, 6)
    questions: list[str] = Field(min_length=1)  # templates; {n} becomes a number never drawn before


class Workload(Section):
    seed: int = 0
    max_tokens: int = Field(32, ge=1)
    server: dict[str, dict[str, Any]] = Field(default_factory=dict)
    mix: dict[Kind, float]
    faq: FaqTraffic | None = None
    burst: BurstTraffic | None = None
    multi_turn: MultiTurnTraffic | None = None
    long: LongTraffic | None = None
    unique: UniqueTraffic | None = None

    @model_validator(mode="after")
    def _positive_mix(self) -> Workload:
        if any(share < 0 for share in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError("mix: shares must be >= 0 and not all 0")
        for kind, share in self.mix.items():
            # paraphrases and multi-turn conversations start from the FAQ's questions
            needs = {"paraphrase": ("faq",), "multi_turn": ("multi_turn", "faq")}.get(kind, (kind,))
            for section in needs:
                if share > 0 and getattr(self, section) is None:
                    raise ValueError(f"mix: {kind} needs a {section} section")
        return self


def load_workload(path: Path) -> Workload:
    return Workload.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Script:
    """One conversation, its user messages sent in order; `copies` users have it at the same
    moment (a burst), turn by turn."""

    kind: Kind
    turns: tuple[str, ...]
    copies: int = 1

    @property
    def requests(self) -> int:
        return len(self.turns) * self.copies


def build_scripts(workload: Workload, requests: int, max_copies: int) -> list[Script]:
    """Exactly `requests` requests, split by the mix, shuffled; bursts at most `max_copies` wide."""
    rng = random.Random(workload.seed)
    builders: dict[Kind, Callable[[int], list[Script]]] = {
        "faq": lambda n: [Script("faq", (_popular(_given(workload.faq), rng).question,)) for _ in range(n)],
        "paraphrase": lambda n: [
            Script("paraphrase", (rng.choice(_popular(_given(workload.faq), rng).paraphrases),)) for _ in range(n)
        ],
        "burst": lambda n: _bursts(_given(workload.burst), n, min(_given(workload.burst).size, max_copies), rng),
        "multi_turn": lambda n: _multi_turn(workload, n, rng),
        "long": lambda n: _long(_given(workload.long), n, rng),
        "unique": lambda n: _unique(_given(workload.unique), n, rng),
    }
    scripts = [script for kind, n in _split(workload.mix, requests).items() for script in builders[kind](n)]
    rng.shuffle(scripts)
    return scripts


def _given(section: T | None) -> T:
    assert section is not None, "the workload's validation checks that each kind in the mix has its section"
    return section


def _split(mix: dict[Kind, float], requests: int) -> dict[Kind, int]:
    """Largest-remainder rounding, so the counts add up to `requests` exactly."""
    total = sum(mix.values())
    exact = {kind: requests * share / total for kind, share in mix.items()}
    counts = {kind: int(value) for kind, value in exact.items()}
    by_remainder = sorted(exact, key=lambda kind: exact[kind] - counts[kind], reverse=True)
    for kind in by_remainder[: requests - sum(counts.values())]:
        counts[kind] += 1
    return counts


def _popular(faq: FaqTraffic, rng: random.Random) -> FaqEntry:
    weights = [1 / rank**faq.popularity for rank in range(1, len(faq.questions) + 1)]
    return rng.choices(faq.questions, weights)[0]


def _bursts(burst: BurstTraffic, requests: int, width: int, rng: random.Random) -> list[Script]:
    scripts = []
    while requests > 0:
        copies = min(width, requests)
        scripts.append(Script("burst", (rng.choice(burst.questions),), copies))
        requests -= copies
    return scripts


def _multi_turn(workload: Workload, requests: int, rng: random.Random) -> list[Script]:
    multi_turn, faq = _given(workload.multi_turn), _given(workload.faq)
    scripts = []
    while requests > 0:
        turns = min(rng.randint(*multi_turn.turns), requests)
        follow_ups = rng.sample(multi_turn.follow_ups, turns - 1)
        scripts.append(Script("multi_turn", (_popular(faq, rng).question, *follow_ups)))
        requests -= turns
    return scripts


def _unique(unique: UniqueTraffic, requests: int, rng: random.Random) -> list[Script]:
    numbers = rng.sample(range(10_000, 100_000), requests)  # distinct, so every message is new
    scripts = []
    while requests > 0:
        turns = min(rng.randint(*unique.turns), requests)
        messages = tuple(rng.choice(unique.questions).format(n=numbers.pop()) for _ in range(turns))
        scripts.append(Script("unique", messages))
        requests -= turns
    return scripts


def _long(long: LongTraffic, requests: int, rng: random.Random) -> list[Script]:
    scripts = []
    while requests > 0:
        turns = min(long.turns, requests)
        messages = tuple(
            f"{long.prompts[min(turn, len(long.prompts) - 1)]}\n{_log(long, rng)}" for turn in range(turns)
        )
        scripts.append(Script("long", messages))
        requests -= turns
    return scripts


def _log(long: LongTraffic, rng: random.Random) -> str:
    return "\n".join(
        f"2026-05-22 09:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d} ERROR "
        f"[{rng.choice(long.services)}] upstream timeout after {rng.randrange(800, 30000)} ms, "
        f"order_id={rng.randrange(10**8)}, trace_id={rng.getrandbits(64):016x}"
        for _ in range(long.log_lines)
    )
