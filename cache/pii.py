"""Personal data in Chinese and English text: phone numbers, emails, ID-card and bank-card numbers.

Detection reads a normalized view of the text: NFKC (full-width digits, NBSP and thin spaces, `＠`),
Chinese numerals in a run as digits (`幺三八` is 138), every dash as `-`, invisible characters
dropped. Each character of the view knows the span of the original it came from, so `scrub` masks
the original text, which is what users are shown. The patterns take the rest: digit groups split
by spaces, `-`, `.`, `/` or parentheses, a +86, 0086 or 86 before a mobile number, spelled-out
emails ("erin at example dot com").

Patterns use digit lookarounds instead of `\\b`: in "电话13812345678谢谢" the CJK characters are word
characters too, so `\\b` would never fire around the number.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Literal

Kind = Literal["id_card", "bank_card", "email", "phone"]

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

# NFKC leaves these alone: it maps the non-breaking hyphen to U+2010, not "-", and keeps the
# zero-width characters that show nothing but split a number for a regex.
_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63"
_INVISIBLE = "\u00ad\u200b\u200c\u200d\u2060\ufeff"
_UNIFY = str.maketrans(dict.fromkeys(_DASHES, "-") | dict.fromkeys(_INVISIBLE))
_HAS_INVISIBLE = re.compile(f"[{_INVISIBLE}]")


# The blocks Chinese text draws its odd characters from: Latin-1 (NBSP), General Punctuation
# (spaces, dashes), letterlike and number forms, enclosed numerals (①), CJK symbols, punctuation
# and kana, enclosed CJK, compatibility ideographs, the small, half- and full-width forms.
_BLOCKS = (
    range(0xA0, 0x100),
    range(0x2000, 0x2190),
    range(0x2460, 0x2500),
    range(0x3000, 0x3400),
    range(0xF900, 0xFB00),
    range(0xFE30, 0xFFF0),
)
_COMBINING = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\u3099\u309a\ufe20-\ufe2f"


def _one_for_one() -> tuple[dict[int, str], str]:
    """The characters of `_BLOCKS` that NFKC (and `_UNIFY`) turns into one other character, as a
    translation that keeps every position, and those it keeps as they are."""
    table: dict[int, str] = {}
    kept: list[str] = []
    for char in map(chr, chain(*_BLOCKS, map(ord, _DASHES))):
        normal = unicodedata.normalize("NFKC", char).translate(_UNIFY)
        if normal == char and not unicodedata.combining(char):
            kept.append(char)
        elif len(normal) == 1:
            table[ord(char)] = normal
    return table, "".join(kept)


_ONE_FOR_ONE, _KEPT_IN_BLOCKS = _one_for_one()
# str.translate looks every character up (40 µs for 200 Chinese characters); these are few.
_TRANSLATED = re.compile(f"[{re.escape(''.join(map(chr, _ONE_FOR_ONE)))}]+")
# What is left after that translation: runs that NFKC keeps as they are (ASCII, CJK ideographs,
# hangul syllables, most of `_BLOCKS`) are copied whole; anything else goes a character at a time,
# with the combining marks after it, which NFKC composes ("e" + U+0301 is "é").
_KEPT = f"\x00-\x7f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3{re.escape(_KEPT_IN_BLOCKS)}"
_SEGMENT = re.compile(rf"((?:[{_KEPT}](?![{_COMBINING}]))+)|.[{_COMBINING}]*", re.S)

# Phone numbers read aloud digit by digit: 幺 and 两 stand for 1 and 2. Only runs of two or more
# are digits, so 「三个人」 keeps its 三.
_NUMERALS = "零〇一幺二两兩三四五六七八九"
_AS_DIGITS = str.maketrans(_NUMERALS, "00112223456789")
_NUMERAL_RUN = re.compile(f"(?=[0-9{_NUMERALS}]{{2}})[0-9]*[{_NUMERALS}][0-9{_NUMERALS}]*")

_SEP_CHARS = r" \t\-./"
_SEP = rf"[{_SEP_CHARS}]{{0,3}}"  # 138 1234 5678, 138/1234/5678, 4111.1111.1111.1111, 138 - 1234
_NOT_AFTER_DIGITS = rf"(?<!\d)(?<!\d[{_SEP_CHARS}])"  # not the tail of a longer, spaced digit group
_NOT_ID_CHARS = re.compile(r"[^\dXx]")
# What a rule's every match holds, found at a fraction of the rule's cost.
_Need = Literal["digits", "@", "spelled"]
_NEEDS: dict[_Need, re.Pattern[str]] = {
    "digits": re.compile(r"\d(?:\D{0,5}\d){6}"),  # the fewest digits and the widest gap any number rule allows
    "@": re.compile("@"),
    "spelled": re.compile(r"[\[({<]\s*at\s*[\])}>]|\bdot\b", re.IGNORECASE),
}

# Kana, CJK ideographs, hangul: scripts that do not space their words, so a run of them next to an
# address may be the sentence around it.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_SPACED_WORD_CHAR = rf"(?:(?![{_CJK}])[\w%+\-])"
# A CJK top-level domain has no boundary with the CJK text after it, so only known ones end a match.
_CJK_TLDS = "中国|中國|公司|网络|網絡|在线|集团|香港|台湾|台灣|新加坡|我爱你|手机|商城|网址|信息|企业|游戏"
_TLD = rf"(?:[A-Za-z]{{2,}}(?![A-Za-z])|xn--[A-Za-z0-9\-]+|{_CJK_TLDS}|(?:(?![{_CJK}])[^\W\d_]){{2,}})"
# "erin at example dot com", "x [at] y [dot] com", "x (at) y.com": a spelled-out "at" needs a
# bracket or a spelled-out dot too, or "look at example.com" would be an address.
_AT_BRACKET = r"\s*[\[({<]\s*at\s*[\])}>]\s*"
_DOT_SPELLED = r"(?:\s*[\[({<]\s*dot\s*[\])}>]\s*|\s+dot\s+)"
_LABEL = r"[A-Za-z0-9\-]+"


@dataclass(frozen=True)
class PiiMatch:
    kind: Kind
    start: int
    end: int


def _always(_: str) -> bool:
    return True


@dataclass(frozen=True)
class _Rule:
    kind: Kind
    pattern: re.Pattern[str]
    needs: _Need  # most text lacks it
    valid: Callable[[str], bool] = _always


@dataclass(frozen=True)
class _View:
    """The text detection reads, and where its characters came from: per piece of the view, in
    order, (where it starts in the view, start and end in the original, whether it maps character
    for character). A piece that NFKC changed comes as a whole from its span of the original.
    No pieces when the view is the original, character for character."""

    text: str
    pieces: tuple[tuple[int, int, int, bool], ...] = ()

    def source(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original that the view's `start:end` came from."""
        if not self.pieces:
            return start, end
        return self._origin(start)[0], self._origin(end - 1)[1]

    def _origin(self, index: int) -> tuple[int, int]:
        at, start, end, linear = self.pieces[bisect_right(self.pieces, index, key=lambda piece: piece[0]) - 1]
        return (start + index - at, start + index - at + 1) if linear else (start, end)


def _view(text: str) -> _View:
    if text.isascii():
        return _View(text)
    text = _TRANSLATED.sub(lambda run: run.group().translate(_ONE_FOR_ONE), text)
    if unicodedata.is_normalized("NFKC", text) and not _HAS_INVISIBLE.search(text):
        return _View(_with_digits(text))
    parts: list[str] = []
    pieces: list[tuple[int, int, int, bool]] = []
    at = 0
    for segment in _SEGMENT.finditer(text):
        start, end = segment.span()
        kept = segment.group(1) is not None
        part = segment.group() if kept else unicodedata.normalize("NFKC", segment.group()).translate(_UNIFY)
        if part:  # an invisible character leaves nothing in the view
            parts.append(part)
            pieces.append((at, start, end, kept))
            at += len(part)
    return _View(_with_digits("".join(parts)), tuple(pieces))


def _with_digits(text: str) -> str:
    """Chinese numerals in runs as ASCII digits; one character for one, so spans keep their places."""
    return _NUMERAL_RUN.sub(lambda run: run.group().translate(_AS_DIGITS), text)


def id_card_valid(number: str) -> bool:
    """GB 11643 checksum of an 18-character mainland ID number."""
    if len(number) != 18 or not number[:17].isdigit():
        return False
    month, day = int(number[10:12]), int(number[12:14])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return False
    total = sum(int(digit) * weight for digit, weight in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


def _spaced_id_card_valid(match: str) -> bool:
    return id_card_valid(_NOT_ID_CHARS.sub("", match))


def _international_valid(match: str) -> bool:
    """Seven digits at least, as the shortest numbers with their country code have (Niue's,
    +683 4002): "+10 20 30" is a score."""
    return sum(char.isdigit() for char in match) >= 7


def luhn_valid(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2:
            digit *= 2
            digit -= 9 if digit > 9 else 0
        total += digit
    return total % 10 == 0


# Order matters: the first rule to claim a span wins, so the checksummed kinds go first.
_RULES: tuple[_Rule, ...] = (
    # 11010519491231002X, 110105 19491231 002X
    _Rule(
        "id_card",
        re.compile(rf"(?<![\dA-Za-z])\d{{6}}{_SEP}\d{{8}}{_SEP}\d{{3}}[\dXx](?![\dA-Za-z])"),
        "digits",
        _spaced_id_card_valid,
    ),
    _Rule(
        "bank_card",
        re.compile(rf"(?<!\d)\d{{4}}(?:{_SEP}\d{{4}}){{2,3}}(?:{_SEP}\d{{1,3}})?(?!\d)"),
        "digits",
        luhn_valid,
    ),
    # zhang.san@example.com, frank@例子.中国, 用户@例子.公司, josé@exämple.de
    _Rule(
        "email",
        re.compile(
            rf"(?:(?<![\w.%+\-])[{_CJK}]+|(?<!\.)(?<!{_SPACED_WORD_CHAR})(?:{_SPACED_WORD_CHAR}|\.)+)"
            rf"@[\w\-]+(?:\.[\w\-]+)*\.{_TLD}"
        ),
        "@",
    ),
    # erin at example dot com, x [at] y [dot] com, x (at) y.com
    _Rule(
        "email",
        re.compile(
            rf"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]+"
            rf"(?:{_AT_BRACKET}{_LABEL}(?:(?:{_DOT_SPELLED}|\.){_LABEL})*(?:{_DOT_SPELLED}|\.)"
            rf"|(?:\s+at\s+|@){_LABEL}(?:{_DOT_SPELLED}{_LABEL})*{_DOT_SPELLED})"
            rf"[A-Za-z]{{2,}}(?![A-Za-z])",
            re.IGNORECASE,
        ),
        "spelled",
    ),
    # mainland mobile, optionally with +86, 0086 or 86: 13812345678, 138-1234-5678, (+86) 138 1234 5678
    _Rule(
        "phone",
        re.compile(
            rf"{_NOT_AFTER_DIGITS}(?<!\+)(?:\(?(?:\+|00)?86\)?{_SEP})?\(?1[3-9]\d\)?{_SEP}\d{{4}}{_SEP}\d{{4}}(?!\d)"
        ),
        "digits",
    ),
    # mainland landline with area code: 010-12345678, (0755) 1234 5678, 0571-8888888
    _Rule(
        "phone",
        re.compile(rf"{_NOT_AFTER_DIGITS}(?:\(0\d{{2,3}}\)|0\d{{2,3}}){_SEP}\d{{3,4}}{_SEP}\d{{4}}(?!\d)"),
        "digits",
    ),
    # international with a country code: +1 (415) 555-0123, +44 20 7946 0958
    _Rule(
        "phone",
        re.compile(r"(?<![\d+])\+\d{1,3}(?:[ \-.]?\(?\d{1,4}\)?){2,5}(?!\d)"),
        "digits",
        _international_valid,
    ),
    # North American: (415) 555-0123, 415-555-0123, 415.555.0123
    _Rule(
        "phone",
        re.compile(rf"{_NOT_AFTER_DIGITS}(?:\(\d{{3}}\)\s?|\d{{3}}[\-.])\d{{3}}[\-.]\d{{4}}(?!\d)"),
        "digits",
    ),
)

_PLACEHOLDER: dict[Kind, str] = {
    "id_card": "[ID_CARD]",
    "bank_card": "[BANK_CARD]",
    "email": "[EMAIL]",
    "phone": "[PHONE]",
}


def find_pii(text: str) -> list[PiiMatch]:
    """Non-overlapping matches as spans of `text`, in text order."""
    view = _view(text)
    claimed: list[PiiMatch] = []
    present: dict[_Need, bool] = {}
    for rule in _RULES:
        if rule.needs not in present:
            present[rule.needs] = _NEEDS[rule.needs].search(view.text) is not None
        if not present[rule.needs]:
            continue
        for found in rule.pattern.finditer(view.text):
            start, end = found.span()
            if any(start < other.end and other.start < end for other in claimed):
                continue
            if rule.valid(found.group()):
                claimed.append(PiiMatch(rule.kind, start, end))
    matches = (PiiMatch(match.kind, *view.source(match.start, match.end)) for match in claimed)
    return sorted(matches, key=lambda match: match.start)


def contains_pii(text: str) -> bool:
    # Every cache lookup and store asks. Per 200-character message on 2 busy cores: 15-30 µs for
    # text without seven digits close together or an "@" (70-90 µs before the rules had `needs`);
    # 60-140 µs with them, when every number rule runs on the normalized view (was 50-70 µs).
    return bool(find_pii(text))


def scrub(text: str) -> str:
    """`text` with every match replaced by a placeholder such as [PHONE]; safe for caches and logs."""
    for match in reversed(find_pii(text)):
        text = text[: match.start] + _PLACEHOLDER[match.kind] + text[match.end :]
    return text
