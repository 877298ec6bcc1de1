"""Training the verifier on labelled pairs: `python -m cache train-verifier PAIRS.tsv ...`.

scikit-learn fits the logistic regression here; serving needs only the weights it writes."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from cache.calibration import LabelledPair, similarities
from cache.embeddings import Embedder
from cache.verify import FEATURES, WEIGHTS_PATH, Verifier, features, unmatched

# Inverse regularization strength, and the least number of training pairs a word must be unmatched
# in to get a weight of its own: picked by 5-fold cross-validation on the v2 dev split plus the
# older pairs (recall at precision 0.98 on the v2 dev pairs, mean of 3 shuffles): C 1 -> 3 raised
# it from 0.53 to 0.57, C 10 (0.58) and 1 or 3 pairs a word (0.56-0.61) are within the noise.
REGULARIZATION_C = 3.0
MIN_WORD_PAIRS = 2
FOLDS = 5


def train(pairs: list[LabelledPair], embedder: Embedder, target_precision: float, description: str) -> Verifier:
    """A verifier for `embedder`, its cut-off the lowest probability at which the pairs it accepts
    keep `target_precision`, judged on out-of-fold predictions: the pairs a model is fitted on
    would flatter it."""
    rows = np.stack(
        [features(p.question_a, p.question_b, s) for p, s in zip(pairs, similarities(pairs, embedder), strict=True)]
    )
    words = [unmatched(p.question_a, p.question_b) for p in pairs]
    labels = np.array([p.same for p in pairs])
    out_of_fold = np.zeros(len(pairs))
    for fitted_on, held_out in StratifiedKFold(FOLDS, shuffle=True, random_state=0).split(rows, labels):
        verifier = _fit(embedder.name, rows[fitted_on], [words[i] for i in fitted_on], labels[fitted_on])
        out_of_fold[held_out] = [verifier.probability(rows[i], words[i]) for i in held_out]
    cutoff, precision, recall = _cutoff(out_of_fold, labels, target_precision)
    verifier = _fit(embedder.name, rows, words, labels)
    trained_on = (
        f"{description}: {len(pairs)} pairs ({int(labels.sum())} same); out-of-fold at the cut-off: "
        f"precision {precision:.3f}, recall {recall:.3f} (target precision {target_precision})"
    )
    return replace(verifier, cutoff=cutoff, trained_on=trained_on)


def save(verifier: Verifier, path: Path = WEIGHTS_PATH) -> None:
    """Write `verifier` as its embedder's entry in `path`, keeping the other embedders' entries."""
    weights = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    weights[verifier.embedder] = verifier.to_json()
    path.write_text(json.dumps(weights, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _fit(embedder: str, rows: np.ndarray, words: list[frozenset[str]], labels: np.ndarray) -> Verifier:
    counts = Counter(word for unmatched_words in words for word in unmatched_words)
    vocabulary = sorted(word for word, count in counts.items() if count >= MIN_WORD_PAIRS)
    column = {word: i for i, word in enumerate(vocabulary)}
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    scale[scale == 0] = 1.0  # a feature constant in training carries no weight
    indicators = np.zeros((len(rows), len(vocabulary)))
    for i, unmatched_words in enumerate(words):
        for word in unmatched_words & column.keys():
            indicators[i, column[word]] = 1.0
    design = np.hstack([(rows - mean) / scale, indicators])
    # Fitted to convergence: at the default tolerance (1e-4) the weights moved by 0.01 when the
    # similarities moved by 2e-5 from one CPU to another, and no other machine reproduced them.
    model = LogisticRegression(C=REGULARIZATION_C, tol=1e-10, max_iter=100_000).fit(design, labels)
    weights = model.coef_[0]
    return Verifier(
        embedder=embedder,
        mean=mean,
        scale=scale,
        coefficients=weights[: len(FEATURES)],
        words={word: float(weights[len(FEATURES) + i]) for i, word in enumerate(vocabulary)},
        intercept=float(model.intercept_[0]),
        cutoff=0.5,
        trained_on="",
    )


def _cutoff(probabilities: np.ndarray, labels: np.ndarray, target: float) -> tuple[float, float, float]:
    """(cut-off, precision, recall): the lowest cut-off whose accepted pairs are at `target`
    precision, the most recall the target allows. 1.0 when no cut-off reaches it."""
    order = np.argsort(-probabilities, kind="stable")
    true_positives = np.cumsum(labels[order])
    precision = true_positives / np.arange(1, len(order) + 1)
    reached = np.flatnonzero(precision >= target)
    if len(reached) == 0:
        return 1.0, 1.0, 0.0
    last = int(reached[-1])
    return float(probabilities[order[last]]), float(precision[last]), float(true_positives[last] / labels.sum())
