"""Personal data in Chinese and English text: phone numbers, emails, ID-card and bank-card numbers.

Patterns use digit lookarounds instead of `\\b`: in "电话13812345678谢谢" the CJK characters are word
characters too, so `\\b` would never fire around the number.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["id_card", "bank_card", "email", "phone"]

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

_SEP = r"[ \-.]?"
_NOT_AFTER_DIGITS = r"(?<!\d)(?<!\d[ \-.])"  # not the tail of a longer, spaced digit group


@dataclass(frozen=True)
class PiiMatch:
    kind: Kind
    start: int
    end: int


@dataclass(frozen=True)
class _Rule:
    kind: Kind
    pattern: re.Pattern[str]
    valid: Callable[[str], bool]


def id_card_valid(number: str) -> bool:
    """GB 11643 checksum of an 18-character mainland ID number."""
    if len(number) != 18 or not number[:17].isdigit():
        return False
    month, day = int(number[10:12]), int(number[12:14])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return False
    total = sum(int(digit) * weight for digit, weight in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


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


def _always(_: str) -> bool:
    return True


# Order matters: the first rule to claim a span wins, so the checksummed kinds go first.
_RULES: tuple[_Rule, ...] = (
    _Rule("id_card", re.compile(r"(?<![\dA-Za-z])\d{17}[\dXx](?![\dA-Za-z])"), id_card_valid),
    _Rule("bank_card", re.compile(r"(?<!\d)\d{4}(?:[ \-]?\d{4}){2,3}(?:[ \-]?\d{1,3})?(?!\d)"), luhn_valid),
    _Rule(
        "email",
        re.compile(
            r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z])", re.ASCII
        ),
        _always,
    ),
    # mainland mobile, optionally +86: 13812345678, 138-1234-5678, +86 138 1234 5678
    _Rule(
        "phone",
        re.compile(rf"{_NOT_AFTER_DIGITS}(?<!\+)(?:\+?86{_SEP})?1[3-9]\d{_SEP}\d{{4}}{_SEP}\d{{4}}(?!\d)"),
        _always,
    ),
    # mainland landline with area code: 010-12345678, (0755) 1234 5678, 0571-8888888
    _Rule(
        "phone",
        re.compile(rf"{_NOT_AFTER_DIGITS}(?:\(0\d{{2,3}}\)|0\d{{2,3}})[ \-]?\d{{3,4}}[ \-]?\d{{4}}(?!\d)"),
        _always,
    ),
    # international with a country code: +1 (415) 555-0123, +44 20 7946 0958
    _Rule("phone", re.compile(r"(?<![\d+])\+\d{1,3}(?:[ \-.]?\(?\d{1,4}\)?){2,5}(?!\d)"), _always),
    # North American: (415) 555-0123, 415-555-0123, 415.555.0123
    _Rule(
        "phone", re.compile(rf"{_NOT_AFTER_DIGITS}(?:\(\d{{3}}\)\s?|\d{{3}}[\-.])\d{{3}}[\-.]\d{{4}}(?!\d)"), _always
    ),
)

_PLACEHOLDER: dict[Kind, str] = {
    "id_card": "[ID_CARD]",
    "bank_card": "[BANK_CARD]",
    "email": "[EMAIL]",
    "phone": "[PHONE]",
}


def find_pii(text: str) -> list[PiiMatch]:
    """Non-overlapping matches, in text order."""
    claimed: list[PiiMatch] = []
    for rule in _RULES:
        for found in rule.pattern.finditer(text):
            start, end = found.span()
            if any(start < other.end and other.start < end for other in claimed):
                continue
            if rule.valid(found.group()):
                claimed.append(PiiMatch(rule.kind, start, end))
    return sorted(claimed, key=lambda match: match.start)


def contains_pii(text: str) -> bool:
    return bool(find_pii(text))


def scrub(text: str) -> str:
    """`text` with every match replaced by a placeholder such as [PHONE]; safe for caches and logs."""
    for match in reversed(find_pii(text)):
        text = text[: match.start] + _PLACEHOLDER[match.kind] + text[match.end :]
    return text


class ScrubFilter(logging.Filter):
    """A logging filter that scrubs the formatted message, so raw PII never reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True
