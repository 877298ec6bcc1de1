"""The second check of an L2 candidate: do two similar-looking questions ask the same thing?

Embeddings score "北京明天天气" / "上海明天天气" or "读取 JSON" / "写入 JSON" above most true
paraphrases. Those hard negatives share a frame and differ in a slot: an entity, a number, a
negation, a direction. A pair passes only when
- numbers and times are the same, and every name-like Latin word (WiFi, Python) is on both sides;
- both or neither negate (or cancel/undo) and no pair of opposites (读/写, upload/download) splits them;
- no content token (a Latin word, a number, a Han character that is not a function character)
  was *swapped*: tokens may be added, dropped or reordered, but if each side has one the other
  lacks, the questions differ;
- the words after a direction marker (to, from, 换, 到) are the same;
- the content tokens overlap by at least `min_overlap` (Dice).
Precision over recall: a paraphrase that fails is only a cache miss.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from cache.keys import normalize

_TOKEN = re.compile(r"\d+(?:\.\d+)?|[a-z][a-z']*|[\u3400-\u9fff]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")

# The word tables read best as they are laid out.
# fmt: off
# Spelling variants and the commonest question synonyms, folded before tokenizing. Each entry is
# a paraphrase in every context we have seen; anything doubtful stays out (a miss is cheap).
_CANONICAL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("怎么", ("怎么样", "怎样", "如何", "咋样", "咋")),
    ("什么", ("啥",)),
    ("辞职", ("离职",)),
    ("修改", ("更改", "变更")),
    ("电脑", ("计算机",)),
    ("不够", ("不足",)),
    # yes/no question forms, not negations
    ("有", ("有没有",)), ("是", ("是不是",)), ("能", ("能不能",)), ("可以", ("可不可以",)), ("会", ("会不会",)),
    ("要", ("要不要",)), ("对", ("对不对",)), ("好", ("好不好",)),
    ("", ("一下", "一个", "一封", "一份", "一点", "一些", "一种", "一篇", "一款", "一首")),
    ("can not", ("cannot", "can't")),
    (" not", ("n't",)),
)
_CJK_FUNCTION = set(
    "的了吗呢吧啊呀么嘛哦是在有我你您们请帮下个这那怎样如何什啥能可以会要想该应得地着过和与及就都也还又很把被让"
    "些哪嗯呗给用做"
)
_EN_STOPWORDS = set(
    "a an the i me my mine you your we our us it its this that these those "
    "is are was were be been being am do does did doing have has had can could would should will shall may might "
    "must how what which who whom whose where when why please tell know about of in on at for with to by as and "
    "or if so some any there here way ways let want need help explain show give "
    "what's how's i'm it's there's".split()
)
# Words that flip or undo what is asked: "cancel a booking" is not "make a booking".
_NEGATIONS_EN = {"not", "no", "never", "without", "none", "nothing", "nobody", "cancel", "undo"}
_NEGATIONS_CJK = ("不", "没", "无", "非", "未", "别", "勿", "莫", "否", "取消", "撤销")
# Slots that, like numbers, must be the same on both sides.
_TIME_EN = set(
    "today tomorrow yesterday tonight morning afternoon evening weekend weekends weekday weekdays monday tuesday "
    "wednesday thursday friday saturday sunday january february march april may june july august september "
    "october november december spring summer autumn winter".split()
)
_TIME_CJK = (
    "今天", "明天", "后天", "昨天", "前天", "今年", "明年", "去年", "上午", "下午", "早上", "晚上", "中午", "周末",
    "工作日", "节假日", "周一", "周二", "周三", "周四", "周五", "周六", "周日", "春", "夏", "秋", "冬",
)
_OPPOSITES: tuple[tuple[str, str], ...] = (
    ("读", "写"), ("上传", "下载"), ("增加", "减少"), ("打开", "关闭"), ("买", "卖"), ("导入", "导出"),
    ("加密", "解密"), ("升", "降"), ("涨", "跌"), ("入职", "辞职"), ("开始", "结束"), ("登录", "退出"),
    ("收", "发"), ("借", "还"), ("进", "出"), ("前", "后"), ("早", "晚"), ("大", "小"), ("多", "少"),
    ("高", "低"), ("长", "短"), ("快", "慢"), ("冷", "热"), ("男", "女"), ("左", "右"), ("东", "西"),
    ("南", "北"), ("加", "减"), ("从", "到"), ("最大", "最小"), ("压缩", "解压"),
    ("read", "write"), ("upload", "download"), ("increase", "decrease"), ("open", "close"), ("buy", "sell"),
    ("import", "export"), ("encrypt", "decrypt"), ("encode", "decode"), ("before", "after"), ("max", "min"),
    ("maximum", "minimum"), ("first", "last"), ("start", "stop"), ("login", "logout"), ("send", "receive"),
    ("add", "remove"), ("enable", "disable"), ("install", "uninstall"), ("to", "from"), ("up", "down"),
    ("in", "out"), ("on", "off"), ("largest", "smallest"), ("ascending", "descending"), ("compress", "decompress"),
    ("lock", "unlock"), ("zip", "unzip"), ("push", "pull"), ("more", "less"), ("best", "worst"),
)
# fmt: on
_DIRECTION_MARKERS = {"to", "into", "from", "than", "vs", "versus", "换", "转", "成", "到", "比", "从", "给", "向"}


@dataclass(frozen=True)
class Verdict:
    same: bool
    reason: str  # "ok" or the first difference found: slots, names, negation, opposite, swap, direction, overlap


def verify(question_a: str, question_b: str, min_overlap: float) -> Verdict:
    text_a, text_b = _canonical(question_a), _canonical(question_b)
    tokens_a, tokens_b = _TOKEN.findall(text_a), _TOKEN.findall(text_b)
    if _slots(text_a, tokens_a) != _slots(text_b, tokens_b):
        return Verdict(False, "slots")
    if not (_names(question_a) <= _words(question_b) and _names(question_b) <= _words(question_a)):
        return Verdict(False, "names")  # "reset my password" / "reset my WiFi password"
    if _negated(text_a, tokens_a) != _negated(text_b, tokens_b):
        return Verdict(False, "negation")
    if _opposed(text_a, set(tokens_a), text_b, set(tokens_b)):
        return Verdict(False, "opposite")
    content_a, content_b = _content(tokens_a), _content(tokens_b)
    only_a, only_b = set(content_a) - set(content_b), set(content_b) - set(content_a)
    if only_a and only_b:
        return Verdict(False, "swap")
    if _reordered_across_marker(tokens_a, tokens_b):
        return Verdict(False, "direction")
    shared = len(set(content_a) & set(content_b))
    total = len(set(content_a)) + len(set(content_b))
    if total and 2 * shared / total < min_overlap:
        return Verdict(False, "overlap")
    return Verdict(True, "ok")


def _canonical(question: str) -> str:
    text = normalize(question)
    for canonical, variants in _CANONICAL:
        for variant in variants:
            text = text.replace(variant, canonical)
    return text


def _content(tokens: list[str]) -> list[str]:
    return [_stem(t) for t in tokens if t not in _EN_STOPWORDS and t not in _CJK_FUNCTION]


def _stem(token: str) -> str:
    if token.isascii() and len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def _slots(text: str, tokens: list[str]) -> set[str]:
    """Numbers and times, which must be the same on both sides."""
    times = (_TIME_EN & {_stem(t) for t in tokens}) | {w for w in _TIME_CJK if w in text}
    return set(_NUMBER.findall(text)) | times


def _words(question: str) -> set[str]:
    return {w.casefold() for w in _LATIN_WORD.findall(unicodedata.normalize("NFKC", question))}


def _names(question: str) -> set[str]:
    """Latin words written like names: WiFi, JSON, iPhone, Qwen3, or Capitalized after the first word."""
    words = _LATIN_WORD.findall(unicodedata.normalize("NFKC", question))
    return {
        w.casefold()
        for position, w in enumerate(words)
        if len(w) > 1
        and (any(c.isupper() for c in w[1:]) or any(c.isdigit() for c in w) or (position and w[0].isupper()))
    }


def _negated(text: str, tokens: list[str]) -> bool:
    return bool(_NEGATIONS_EN & set(tokens)) or any(w in text for w in _NEGATIONS_CJK)


def _opposed(text_a: str, tokens_a: set[str], text_b: str, tokens_b: set[str]) -> bool:
    def has(word: str, text: str, tokens: set[str]) -> bool:
        return word in tokens if word.isascii() else word in text

    for x, y in _OPPOSITES:
        x_a, y_a, x_b, y_b = (
            has(x, text_a, tokens_a),
            has(y, text_a, tokens_a),
            has(x, text_b, tokens_b),
            has(y, text_b, tokens_b),
        )
        if (x_a and not y_a and y_b and not x_b) or (y_a and not x_a and x_b and not y_b):
            return True
    return False


def _reordered_across_marker(tokens_a: list[str], tokens_b: list[str]) -> bool:
    """ "celsius to fahrenheit" / "fahrenheit to celsius": the same words on the other side of "to"."""
    common = set(_content(tokens_a)) & set(_content(tokens_b))
    for marker in _DIRECTION_MARKERS & set(tokens_a) & set(tokens_b):
        # The last one: in "how to convert pdf to word" the first "to" is not a direction.
        after_a = set(tokens_a[len(tokens_a) - tokens_a[::-1].index(marker) :]) & common
        after_b = set(tokens_b[len(tokens_b) - tokens_b[::-1].index(marker) :]) & common
        if after_a != after_b:
            return True
    return False
