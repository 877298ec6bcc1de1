"""A question as the verifier reads it: segmented words (jieba for Chinese, Snowball stems for
English), the content words among them, and the slots that must agree between paraphrases."""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import jieba
import jieba.posseg
import snowballstemmer

from cache.keys import normalize

jieba.setLogLevel(logging.WARNING)  # not the dictionary-loading banner on every start
_STEMMER = snowballstemmer.stemmer("english")
# A Snowball stemmer keeps the word it works on in itself, and questions are read on several
# threads at once (cache lookups, the verifier, compression's relevance): unguarded, two stems at
# once read each other's word (an IndexError mid-compression: an HTTP 500 in about one benchmark
# run in 25). A word stems in microseconds, so they take turns.
_STEMMING = threading.Lock()

_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’-]*")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_HAN = re.compile(r"[\u3400-\u9fff]")
_RUN = re.compile(r"[\u3400-\u9fff]+|[a-z0-9]+(?:['’][a-z]+)*")
_CONTRACTION = re.compile(r"['’](?:s|m|re|ve|ll|d)$")

# The word tables read best as they are laid out.
# fmt: off
# Spelling variants and question forms folded before segmenting; each is the same word in every
# context (怎样/如何 -> 怎么, 有没有 -> 有), so jieba sees one spelling.
_CANONICAL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("怎么", ("怎么样", "怎样", "如何", "咋样", "咋")),
    ("什么", ("啥",)),
    ("有", ("有没有",)), ("是", ("是不是",)), ("能", ("能不能",)), ("可以", ("可不可以",)), ("会", ("会不会",)),
    ("要", ("要不要",)), ("对", ("对不对",)), ("好", ("好不好",)),
    ("wi-fi", ("wifi", "wi fi")), ("e-mail", ("email",)),
    ("can not", ("cannot", "can't")), (" not", ("n't",)),
)
# Words that carry no content of their own: English function words and Chinese particles.
_EN_STOPWORDS = set(
    "a an the i me my mine myself you your yours we our ours us it its this that these those he him his she her "
    "they them their is are was were be been being am do does did doing have has had can could would should "
    "will shall may might must of in on at for with to by as and or but if so some any there here please let "
    "just also about then than too very really u ur".split()
)
_CJK_FUNCTION = set("的了吗呢吧啊呀么嘛哦是在有我你您们请帮下个这那得地着过和与及就都也还又很把被让些嗯呗给一")
# The question's intent word: "who approves overtime" is not "how is overtime calculated".
_QUESTION_WORDS = {
    "how": "how", "what": "what", "when": "when", "where": "where", "who": "who", "whom": "who",
    "why": "why", "which": "which", "much": "much", "many": "much", "long": "long",
    "怎么": "how", "什么": "what", "什么时候": "when", "何时": "when", "几点": "when", "哪天": "when",
    "几号": "when", "哪里": "where", "哪儿": "where", "在哪": "where", "谁": "who", "为什么": "why",
    "为啥": "why", "怎么办": "how", "哪个": "which", "哪些": "which", "多少": "much", "几": "much", "多久": "long",
    "多长时间": "long",
}
# Words that flip or undo what is asked: "cancel a booking" is not "make a booking".
_NEGATIONS_EN = {"not", "no", "never", "without", "none", "nothing", "cancel", "undo", "stop"}
_NEGATIONS_CJK = ("不", "没", "无", "非", "未", "别", "勿", "莫", "否", "取消", "撤销", "撤回")
_TIME_EN = set(
    "today tomorrow yesterday tonight morning afternoon evening weekend weekday monday tuesday wednesday "
    "thursday friday saturday sunday january february march april june july august september october "
    "november december spring summer autumn winter".split()
)
_TIME_CJK = (
    "今天", "明天", "后天", "昨天", "前天", "今年", "明年", "去年", "上午", "下午", "早上", "晚上", "中午", "周末",
    "工作日", "节假日", "周一", "周二", "周三", "周四", "周五", "周六", "周日", "周天", "春", "夏", "秋", "冬",
    "本月", "上个月", "下个月", "这个月", "本周", "上周", "下周", "这周", "季度",
)
OPPOSITES: tuple[tuple[str, str], ...] = (
    ("读", "写"), ("上传", "下载"), ("增加", "减少"), ("打开", "关闭"), ("买", "卖"), ("导入", "导出"),
    ("加密", "解密"), ("升", "降"), ("涨", "跌"), ("入职", "离职"), ("开始", "结束"), ("登录", "退出"),
    ("收", "发"), ("借", "还"), ("进", "出"), ("前", "后"), ("早", "晚"), ("大", "小"), ("多", "少"),
    ("高", "低"), ("长", "短"), ("快", "慢"), ("冷", "热"), ("男", "女"), ("左", "右"), ("东", "西"),
    ("南", "北"), ("加", "减"), ("最大", "最小"), ("压缩", "解压"), ("提交", "撤回"), ("申请", "取消"),
    ("公", "私"), ("开启", "关闭"), ("添加", "删除"), ("合并", "拆分"), ("新建", "删除"),
    ("read", "write"), ("upload", "download"), ("increase", "decrease"), ("open", "close"), ("buy", "sell"),
    ("import", "export"), ("encrypt", "decrypt"), ("encode", "decode"), ("before", "after"), ("max", "min"),
    ("maximum", "minimum"), ("first", "last"), ("start", "stop"), ("login", "logout"), ("send", "receive"),
    ("add", "remove"), ("enable", "disable"), ("install", "uninstall"), ("up", "down"), ("in", "out"),
    ("on", "off"), ("largest", "smallest"), ("ascending", "descending"), ("compress", "decompress"), ("lock", "unlock"),
    ("zip", "unzip"), ("push", "pull"), ("more", "less"), ("best", "worst"), ("join", "leave"), ("hire", "fire"),
    ("approve", "reject"), ("merge", "split"), ("create", "delete"), ("submit", "withdraw"), ("maternity", "paternity"),
    ("incoming", "outgoing"), ("inbound", "outbound"), ("public", "private"), ("internal", "external"),
)
# fmt: on


def _stem(word: str) -> str:
    with _STEMMING:
        return _STEMMER.stemWord(word)


_OPPOSITE_TOKENS = [tuple(_stem(w) if w.isascii() else w for w in pair) for pair in OPPOSITES]
_DIRECTION_MARKERS = {"to", "into", "from", "than", "vs", "versus", "换", "转", "成", "到", "比", "从", "向"}
# jieba's part-of-speech flags of names: places, people, organisations, other proper nouns, Latin words.
_NAME_FLAGS = {"ns", "nr", "nrt", "nrfg", "nt", "nz"}


@dataclass(frozen=True)
class Words:
    """What the verifier compares of one question; every set holds normalized words."""

    tokens: tuple[str, ...]  # every word in order, stemmed
    content: frozenset[str]  # tokens that are not function words
    numbers: frozenset[str]
    times: frozenset[str]
    names: frozenset[str]  # place, person, product and other proper names
    question_words: frozenset[str]  # how, when, who... in one spelling for both languages
    negated: bool
    bigrams: frozenset[str]  # character bigrams of the normalized text, spaces out

    @classmethod
    def of(cls, question: str) -> Words:
        return _words(question)


@lru_cache(maxsize=4096)  # a cached question is verified against many lookups
def _words(question: str) -> Words:
    text = _canonical(question)
    tokens: list[str] = []
    content: set[str] = set()
    names, question_words, times = set(), set(), set()
    negated = any(w in text for w in _NEGATIONS_CJK)
    for piece, flag in _segment(text):
        word = piece.strip()
        if not word or not (word[0].isalnum() or _HAN.match(word)):
            continue
        token = _stem(word) if word.isascii() else word
        tokens.append(token)
        # Function words, times and question words are read before stemming: "does" stems to "doe".
        if not _is_function(word) and word not in _QUESTION_WORDS:
            content.add(token)
        if word in _QUESTION_WORDS:
            question_words.add(_QUESTION_WORDS[word])
        if word in _TIME_EN or token in _TIME_EN:
            times.add(token)
        negated = negated or word in _NEGATIONS_EN
        if flag in _NAME_FLAGS and not word.isascii():
            names.add(word)
    names |= _latin_names(question)
    question_words |= {kind for word, kind in _QUESTION_WORDS.items() if not word.isascii() and word in text}
    times |= {w for w in _TIME_CJK if w in text}
    compact = text.replace(" ", "")
    return Words(
        tokens=tuple(tokens),
        content=frozenset(content),
        numbers=frozenset(_NUMBER.findall(text)),
        times=frozenset(times),
        names=frozenset(names),
        question_words=frozenset(question_words),
        negated=negated,
        bigrams=frozenset(compact[i : i + 2] for i in range(len(compact) - 1)),
    )


def load_dictionary() -> None:
    """Load jieba's dictionary now (0.7 s on 2 cores), not in the first lookup that segments."""
    jieba.initialize()


def opposed(a: Words, b: Words) -> bool:
    """One side says one of a pair of opposites (upload/download, 读/写) and the other its opposite."""
    text_a, text_b = "".join(a.tokens), "".join(b.tokens)

    def has(word: str, words: Words, text: str) -> bool:
        return word in words.tokens if word.isascii() else word in text

    for x, y in _OPPOSITE_TOKENS:
        x_a, y_a, x_b, y_b = has(x, a, text_a), has(y, a, text_a), has(x, b, text_b), has(y, b, text_b)
        if (x_a and not y_a and y_b and not x_b) or (y_a and not x_a and x_b and not y_b):
            return True
    return False


def reordered_across_marker(a: Words, b: Words) -> bool:
    """ "celsius to fahrenheit" / "fahrenheit to celsius": across a direction marker, one shared
    word goes from before it to after it and another the other way. Moving a whole phrase ("in
    Python, convert x to y") moves words one way only: no change."""
    shared = a.content & b.content
    for marker in _DIRECTION_MARKERS & set(a.tokens) & set(b.tokens):
        before_a, after_a = _sides(a.tokens, marker, shared)
        before_b, after_b = _sides(b.tokens, marker, shared)
        if (before_a - after_a) & (after_b - before_b) and (after_a - before_a) & (before_b - after_b):
            return True
    return False


def _sides(tokens: tuple[str, ...], marker: str, shared: frozenset[str]) -> tuple[set[str], set[str]]:
    # The last one: in "how to convert pdf to word" the first "to" is not a direction.
    last = len(tokens) - 1 - tokens[::-1].index(marker)
    return set(tokens[:last]) & shared, set(tokens[last + 1 :]) & shared


def _canonical(question: str) -> str:
    text = normalize(question)
    for canonical, variants in _CANONICAL:
        for variant in variants:
            text = text.replace(variant, canonical)
    return text


def _segment(text: str) -> list[tuple[str, str]]:
    """(word, part of speech) in order: jieba for each run of Chinese, Latin words as they are
    with contractions taken off ("what's" -> "what"; "n't" became " not" in `_CANONICAL`)."""
    words: list[tuple[str, str]] = []
    for run in _RUN.finditer(text):
        if _HAN.match(run.group()):
            # HMM off: unknown words stay single characters instead of guessed compounds, the
            # same on both sides of a pair.
            words.extend((pair.word, pair.flag) for pair in jieba.posseg.cut(run.group(), HMM=False))
        else:
            words.append((_CONTRACTION.sub("", run.group()), "eng"))
    return words


def terms(text: str) -> frozenset[str]:
    """What a text says, to compare with another: its words, lower-cased, without function words,
    and in Chinese, written without spaces, each pair of adjacent characters. Neither segmented nor
    stemmed, so that a long text reads in a few milliseconds."""
    found: set[str] = set()
    for run in _RUN.findall(text.lower()):
        if _HAN.match(run):
            found.update(run[start : start + 2] for start in range(max(len(run) - 1, 1)))
        elif not _is_function(run):
            found.add(run)
    return frozenset(found)


def _is_function(token: str) -> bool:
    if token.isascii():
        return token in _EN_STOPWORDS
    return all(c in _CJK_FUNCTION for c in token)


def _latin_names(question: str) -> set[str]:
    """Latin words written like names: WiFi, JSON, iPhone, Q3, or Capitalized where a sentence does
    not start; in a Chinese question, every Latin word (Redis, key, Mac)."""
    text = unicodedata.normalize("NFKC", question).strip()
    chinese = bool(_HAN.search(text))
    return {
        _stem(_CONTRACTION.sub("", match.group().casefold()))
        for match in _LATIN_WORD.finditer(text)
        if len(word := match.group()) > 1
        and (
            chinese
            or any(c.isupper() for c in word[1:])
            or any(c.isdigit() for c in word)
            or (word[0].isupper() and _starts_no_sentence(text, match.start()))
        )
    }


def _starts_no_sentence(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    return bool(before) and before[-1] not in ".?!:"
