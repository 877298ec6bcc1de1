"""The second check of an L2 candidate: do two similar-looking questions ask the same thing?

Embeddings score "北京明天天气" / "上海明天天气" or "upload to SharePoint" / "download from
SharePoint" above most true paraphrases: those hard negatives share a frame and differ in a slot.
A logistic regression decides, over features of the pair (how much of each side the other's
words cover, the shape of the difference, which slots disagree, the embedding's own similarity)
and a weight per word seen on one side only in the training pairs: "sorry" or 请问 added to a
question changes nothing, "Linux" added to it does. It is trained on labelled pairs by
`python -m cache train-verifier` and shipped as a small JSON file, one model per embedder. Its
cut-off is chosen for precision: a paraphrase it rejects is only a cache miss, a wrong answer is
worse.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.words import Words, load_dictionary, opposed, reordered_across_marker

# "How do I X" and "what is the way to X" ask the same; "who approves X" and "when is X" do not.
_LOOSE_QUESTION_WORDS = {"how", "what", "which"}
WEIGHTS_PATH = Path(__file__).resolve().parent / "verifier_weights.json"

FEATURES = (
    "similarity",  # the embedding's cosine, on its own model's scale
    "dice",  # shared content words over both sides' (Dice)
    "coverage_min",  # the least of "share of a side's content words the other side has"
    "coverage_max",
    "unmatched_min",  # content words one side has and the other lacks, the fewer side: a swap when > 0
    "unmatched_max",
    "contained",  # 1: one side's content words are all in the other, which adds some (a filler, or a condition)
    "swapped",  # 1: exactly one content word each side has that the other lacks (a synonym, or a slot)
    "unmatched_characters",  # Jaccard of the characters of each side's unmatched words: 预订 / 预约
    "numbers",  # 1: the numbers differ
    "times",  # 1: the dates and times differ
    "names",  # 1: a place, person or product name is on one side only
    "negation",  # 1: one side negates (or cancels) and the other does not
    "opposite",  # 1: a pair of opposites (upload/download, 读/写) splits them
    "question_word",  # 1: both ask with a question word and they differ in who, when, where, why or how much
    "direction",  # 1: the same words on the other side of "to" / 到
    "length_ratio",  # shorter over longer, in characters
    "bigrams",  # Jaccard of character bigrams: robust where segmentation differs
)


@dataclass(frozen=True)
class Verdict:
    same: bool
    probability: float  # the model's estimate that one answer serves both


def unmatched(question_a: str, question_b: str) -> frozenset[str]:
    """The content words one side has and the other lacks."""
    return Words.of(question_a).content ^ Words.of(question_b).content


def features(question_a: str, question_b: str, similarity: float) -> np.ndarray:
    a, b = Words.of(question_a), Words.of(question_b)
    shared = len(a.content & b.content)
    only_a, only_b = len(a.content - b.content), len(b.content - a.content)
    coverage_a = shared / len(a.content) if a.content else 1.0
    coverage_b = shared / len(b.content) if b.content else 1.0
    total = len(a.content) + len(b.content)
    characters_a, characters_b = _han_characters(a.content - b.content), _han_characters(b.content - a.content)
    characters = len(characters_a | characters_b)
    length_a, length_b = len(question_a.strip()), len(question_b.strip())
    union = len(a.bigrams | b.bigrams)
    return np.array(
        [
            similarity,
            2 * shared / total if total else 1.0,
            min(coverage_a, coverage_b),
            max(coverage_a, coverage_b),
            min(only_a, only_b),
            max(only_a, only_b),
            min(only_a, only_b) == 0 < max(only_a, only_b),
            only_a == only_b == 1,
            len(characters_a & characters_b) / characters if characters else 1.0,
            a.numbers != b.numbers,
            a.times != b.times,
            bool(a.names ^ b.names),
            a.negated != b.negated,
            opposed(a, b),
            bool(
                a.question_words and b.question_words and (a.question_words ^ b.question_words) - _LOOSE_QUESTION_WORDS
            ),
            reordered_across_marker(a, b),
            min(length_a, length_b) / max(length_a, length_b, 1),
            len(a.bigrams & b.bigrams) / union if union else 1.0,
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class Verifier:
    """The trained model of one embedder: standardized features, logistic weights, a cut-off."""

    embedder: str
    mean: np.ndarray
    scale: np.ndarray
    coefficients: np.ndarray
    words: dict[str, float]  # the weight of a word on one side only; words seen too rarely have none
    intercept: float
    cutoff: float  # the least probability accepted: the operating point chosen on the training pairs
    trained_on: str  # what it was trained on and the figures it reached there, for the record

    def verdict(self, question_a: str, question_b: str, similarity: float) -> Verdict:
        if Words.of(question_a).tokens == Words.of(question_b).tokens:
            # The same words in the same order once spelling is folded (咋 / 怎么, wifi / Wi-Fi):
            # nothing differs. The model would still weigh in the embedding, which a 咋 moves.
            return Verdict(same=True, probability=1.0)
        row = features(question_a, question_b, similarity)
        probability = self.probability(row, unmatched(question_a, question_b))
        return Verdict(same=probability >= self.cutoff, probability=probability)

    def probability(self, row: np.ndarray, words: frozenset[str]) -> float:
        z = float((row - self.mean) / self.scale @ self.coefficients) + self.intercept
        z += sum(self.words.get(word, 0.0) for word in words)
        return 1.0 / (1.0 + math.exp(-z))

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(FEATURES),
            "mean": [round(float(x), 8) for x in self.mean],
            "scale": [round(float(x), 8) for x in self.scale],
            "coefficients": [round(float(x), 8) for x in self.coefficients],
            "words": {word: round(weight, 8) for word, weight in sorted(self.words.items())},
            "intercept": round(self.intercept, 8),
            "cutoff": round(self.cutoff, 6),
            "trained_on": self.trained_on,
        }

    @classmethod
    def from_json(cls, embedder: str, data: dict[str, object]) -> Verifier:
        if data.get("features") != list(FEATURES):
            raise ValueError(
                f"the verifier weights of {embedder!r} were trained on other features: "
                "run `python -m cache train-verifier` again"
            )
        return cls(
            embedder=embedder,
            mean=np.asarray(data["mean"], dtype=np.float64),
            scale=np.asarray(data["scale"], dtype=np.float64),
            coefficients=np.asarray(data["coefficients"], dtype=np.float64),
            words={str(word): float(weight) for word, weight in data["words"].items()},  # type: ignore[attr-defined]
            intercept=float(data["intercept"]),  # type: ignore[arg-type]
            cutoff=float(data["cutoff"]),  # type: ignore[arg-type]
            trained_on=str(data["trained_on"]),
        )


def load_verifier(embedder: str, path: Path = WEIGHTS_PATH) -> Verifier:
    """The shipped verifier of `embedder`; a one-line error naming the command when there is none."""
    weights = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if embedder not in weights:
        raise ValueError(
            f"no verifier for embedder {embedder!r} in {path}: run `python -m cache train-verifier PAIRS.tsv` "
            "with it, or set cache.verify: false"
        )
    verifier = Verifier.from_json(embedder, weights[embedder])
    load_dictionary()
    return verifier


def _han_characters(words: frozenset[str]) -> set[str]:
    return {c for word in words if not word.isascii() for c in word}
