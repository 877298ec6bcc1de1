import pytest

from cache.keys import normalize, scope_key
from cache.verify import verify


@pytest.mark.parametrize(
    ("question_a", "question_b", "reason"),
    [
        ("北京明天天气", "上海明天天气", "swap"),
        ("读取 JSON", "写入 JSON", "opposite"),
        ("写辞职信", "写入职申请", "opposite"),
        ("3 月的销售额是多少", "4 月的销售额是多少", "slots"),
        ("北京今天天气", "北京明天天气", "slots"),
        ("这个问题能解决吗", "这个问题不能解决吗", "negation"),
        ("会议室怎么预订", "会议室怎么取消预订", "negation"),
        ("How do I reset my password?", "How do I reset my WiFi password?", "names"),
        ("How do I sort a list in Python?", "How do I sort a list in JavaScript?", "names"),
        ("Convert Celsius to Fahrenheit", "Convert Fahrenheit to Celsius", "direction"),
        ("人民币换美元", "美元换人民币", "direction"),
        ("How do I turn on Bluetooth?", "How do I turn off Bluetooth?", "opposite"),
    ],
)
def test_hard_negatives_are_told_apart(question_a: str, question_b: str, reason: str) -> None:
    verdict = verify(question_a, question_b, min_overlap=0.5)
    assert not verdict.same and verdict.reason == reason


@pytest.mark.parametrize(
    ("question_a", "question_b"),
    [
        ("北京明天天气怎么样", "明天北京的天气如何"),
        ("帮我写一封辞职信", "请帮我写辞职信"),
        ("周末加班有加班费吗", "周末加班有没有加班费"),
        ("How do I reset my password?", "How to reset my password?"),
        ("How do I convert a PDF to Word?", "How to convert PDF to Word"),
        ("WiFi 密码是多少", "wifi 密码是多少？"),
    ],
)
def test_paraphrases_pass(question_a: str, question_b: str) -> None:
    assert verify(question_a, question_b, min_overlap=0.5).same


def test_normalize_folds_width_case_space_and_trailing_punctuation() -> None:
    assert normalize("  Ｈｏｗ   ＯＬＤ is he？！ ") == "how old is he"
    assert normalize("北京天气。") == "北京天气"


def test_scope_is_shared_only_without_context() -> None:
    assert scope_key("m", "p") == scope_key("m", "p", []) and scope_key("m", "p").shared
    assert scope_key("m", "p", [1]) != scope_key("m", "p", [2])
    assert scope_key("m", "p") != scope_key("m", "q") != scope_key("n", "p")
    # length-prefixed parts: moving a boundary changes the key
    assert scope_key("ab", "c") != scope_key("a", "bc")
