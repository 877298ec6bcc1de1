"""Precision and recall of the L2 gate per threshold, on a labelled set of question pairs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.embeddings import Embedder
from cache.keys import embedded_text
from cache.verify import Verifier


@dataclass(frozen=True)
class LabelledPair:
    same: bool
    kind: str  # what makes the pair alike or different: synonym, slot_city, ... (tests/data/README.md)
    question_a: str
    question_b: str
    split: str = "dev"  # dev (tune on it) or test (report on it); files without the column are dev data


@dataclass(frozen=True)
class Scores:
    """Per pair: embedding similarity and the verification verdict."""

    similarity: np.ndarray
    verified: np.ndarray


@dataclass(frozen=True)
class Point:
    threshold: float
    precision: float
    recall: float
    predicted: int


def load_pairs(path: str | Path, split: str | None = None) -> list[LabelledPair]:
    """A TSV with a header: label (1 same, 0 different), kind, [split,] question_a, question_b.
    With `split`, the pairs of that split only; a file without the column is all dev."""
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    pairs = [
        LabelledPair(row["label"] == "1", row["kind"], row["question_a"], row["question_b"], row.get("split") or "dev")
        for row in rows
    ]
    assert pairs and all(p.question_a and p.question_b for p in pairs), f"{path}: no pairs or an empty question"
    return [p for p in pairs if split is None or p.split == split]


def similarities(pairs: list[LabelledPair], embedder: Embedder) -> np.ndarray:
    """The cache's similarity of each pair; -1 where a question is too long to be compared by
    meaning, as the cache never would."""
    texts = [(embedded_text(p.question_a), embedded_text(p.question_b)) for p in pairs]
    compared = [i for i, (a, b) in enumerate(texts) if a is not None and b is not None]
    vectors = embedder.encode([text for i in compared for text in texts[i] if text is not None])
    similarity = np.full(len(pairs), -1.0, dtype=np.float32)
    similarity[compared] = np.einsum("ij,ij->i", vectors[0::2], vectors[1::2])
    return similarity


def score(pairs: list[LabelledPair], embedder: Embedder, verifier: Verifier) -> Scores:
    similarity = similarities(pairs, embedder)
    verified = np.array(
        [verifier.verdict(p.question_a, p.question_b, float(s)).same for p, s in zip(pairs, similarity, strict=True)]
    )
    return Scores(similarity=similarity, verified=verified)


def curve(
    pairs: list[LabelledPair], accepted_at: np.ndarray, similarity: np.ndarray, thresholds: np.ndarray
) -> list[Point]:
    """Precision and recall of "similarity >= t and accepted" for each t (precision 1.0 when nothing passes)."""
    labels = np.array([p.same for p in pairs])
    points = []
    for threshold in thresholds:
        predicted = (similarity >= threshold) & accepted_at
        true_positives = int(np.sum(predicted & labels))
        count = int(np.sum(predicted))
        points.append(
            Point(
                threshold=round(float(threshold), 4),
                precision=true_positives / count if count else 1.0,
                recall=true_positives / int(np.sum(labels)),
                predicted=count,
            )
        )
    return points


def lowest_threshold(points: list[Point], target_precision: float) -> Point | None:
    """The lowest threshold from which precision stays at or above the target all the way up.

    Precision is not monotonic in the threshold; requiring it to hold above as well keeps one
    lucky dip from setting the default."""
    best = None
    for point in sorted(points, key=lambda p: p.threshold, reverse=True):
        if point.precision < target_precision:
            break
        best = point
    return best


def recommended_threshold(points: list[Point], target_precision: float, keep_recall: float = 0.98) -> Point | None:
    """The highest threshold that still reaches the target precision and keeps `keep_recall` of
    the best recall doing so.

    With verification, precision may hold all the way down; the embedding gate then stays as
    strict as the recall allows, so a pair the verifier misjudges must also fool the embedding."""
    lowest = lowest_threshold(points, target_precision)
    if lowest is None:
        return None
    eligible = [p for p in points if p.threshold >= lowest.threshold]
    best_recall = max(p.recall for p in eligible)
    return max((p for p in eligible if p.recall >= keep_recall * best_recall), key=lambda p: p.threshold)
