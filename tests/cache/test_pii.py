import logging

import pytest

from cache.pii import ScrubFilter, contains_pii, find_pii, id_card_valid, luhn_valid, scrub

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


def test_scrub_filter_keeps_pii_out_of_log_records(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.pii")
    logger.addFilter(ScrubFilter())
    with caplog.at_level(logging.INFO, logger="test.pii"):
        logger.info("user asked: %s", "我的手机号是13812345678")
    assert caplog.messages == ["user asked: 我的手机号是[PHONE]"]
