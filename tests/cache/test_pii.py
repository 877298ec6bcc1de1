import re
from dataclasses import dataclass
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache.pii import contains_pii, find_pii, id_card_valid, luhn_valid, scrub
from tests.support import TEST_DATA

PROBES = TEST_DATA / "pii_probes.tsv"

VALID_ID = "11010519491231002X"
VALID_CARD = "6222 0212 3456 7894"  # Luhn-valid


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("我的手机号是13812345678，请回电", "phone"),
        ("电话：138-1234-5678", "phone"),
        ("call +86 138 1234 5678 now", "phone"),
        ("座机010-12345678找我", "phone"),
        ("office (0755) 8888 6666", "phone"),
        ("call me at +1 (415) 555-0123", "phone"),
        ("or 415-555-0123 after six", "phone"),
        ("邮箱zhang.san@example.com谢谢", "email"),
        (f"身份证号{VALID_ID}帮我查一下", "id_card"),
        (f"卡号{VALID_CARD}还款", "bank_card"),
        ("card 4111111111111111 expired", "bank_card"),
    ],
)
def test_detects_pii_in_chinese_and_english_text(text: str, kind: str) -> None:
    assert [match.kind for match in find_pii(text)] == [kind]


@pytest.mark.parametrize(
    "text",
    [
        "北京明天天气怎么样",
        "2024年的营收是多少",
        "订单号 12345678",
        "身份证号11010519491231002Y无效",  # wrong checksum, and not a Luhn number either
        "卡号 6222 0212 3456 7890",  # fails Luhn, and its tail is no phone number
        "version 1.2.3 of python3.11",
    ],
)
def test_leaves_ordinary_text_alone(text: str) -> None:
    assert not contains_pii(text)


def test_checksums() -> None:
    assert id_card_valid(VALID_ID) and not id_card_valid(VALID_ID[:-1] + "1")
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")


def test_scrub_replaces_every_match() -> None:
    text = f"张三 13812345678 zs@example.com {VALID_ID}"
    assert scrub(text) == "张三 [PHONE] [EMAIL] [ID_CARD]"


@dataclass(frozen=True)
class Probe:
    kinds: list[str]
    text: str
    scrubbed: str


def _unescaped(field: str) -> str:
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda code: chr(int(code.group(1), 16)), field)


def load_probes() -> list[Probe]:
    probes = []
    lines = PROBES.read_text(encoding="utf-8").splitlines()
    for line in lines[lines.index("kinds\ttext\tscrubbed") + 1 :]:
        if not line or line.startswith("#"):
            continue
        kinds, text, *scrubbed = (_unescaped(field) for field in line.split("\t"))
        probes.append(Probe([] if kinds == "-" else kinds.split(","), text, scrubbed[0] if scrubbed else text))
    return probes


def test_probe_set_covers_every_class_and_ordinary_text() -> None:
    probes = load_probes()
    assert len(probes) >= 60
    assert {kind for probe in probes for kind in probe.kinds} == {"phone", "email", "id_card", "bank_card"}
    assert sum(not probe.kinds for probe in probes) >= 20


@pytest.mark.parametrize("probe", load_probes(), ids=lambda probe: probe.text)
def test_probe_is_labelled_exactly(probe: Probe) -> None:
    assert [match.kind for match in find_pii(probe.text)] == probe.kinds
    assert scrub(probe.text) == probe.scrubbed


def test_matches_are_masked_in_the_original_text_around_them() -> None:
    """Full-width digits, NBSPs and Chinese numerals keep their places in the view; a zero-width
    space and an accent NFKC composes do not: every span still lands on the original's characters."""
    text = "先生\u200b：１３８\u00a01234\u00a05678，或幺三九一二三四五六七八；e\u0301@例子.中国。"
    assert scrub(text) == "先生\u200b：[PHONE]，或[PHONE]；[EMAIL]。"


# Any character (lone surrogates too), and often what numbers and addresses are made of.
TEXT = st.text(
    st.one_of(
        st.sampled_from("0123456789１３８幺三八 .-/()+@at\u00a0\u200b\u0301"), st.characters(exclude_categories=())
    ),
    max_size=60,
)


@given(TEXT)
def test_matches_are_ordered_disjoint_spans_of_any_text(text: str) -> None:
    matches = find_pii(text)
    assert all(0 <= match.start < match.end <= len(text) for match in matches)
    assert all(first.end <= second.start for first, second in pairwise(matches))
    assert (scrub(text) == text) == (not matches)
