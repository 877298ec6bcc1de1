"""When a reminder or a scheduled prompt fires, read from a phrase in Chinese or English.

`parse_when` finds the time phrase, takes it out together with "remind me"/提醒我, and keeps the
rest as what to remind of. What it reads:

- a delay: "in 2h", "in 1h30m", "in 3 days", 两小时后, 一个半小时后, 三天后. Hours and minutes are
  elapsed time; whole days keep the clock time ("in 3 days" at 10:00 is 10:00, three days on).
- a day, with or without a clock time: "tomorrow 9am", "on friday at 10:00", "Dec 24 18:00",
  明天下午3点, 下周一上午10点, 12月24日18点. A day said without a clock time means 09:00, or the
  hour of its part of the day (明天下午 15:00, "tonight" 20:00).
- a clock time alone, "17:00", 17点: today, or tomorrow once it has passed today. An hour with
  no am/pm and no part of the day is on the 24-hour clock: "at 5" is 05:00.
- a weekday alone (周五, "on friday") is the next one, today if its time is still ahead; "next
  friday" is the next one after today; 下周五 is the Friday of next week (weeks start on Monday).
- a date without a year is its next occurrence, today included. A day or date given outright
  whose time has passed is refused, not moved.
- a rule: every day/daily/每天, every weekday/每个工作日, every monday/mondays/每周一 (lists too:
  "every monday and thursday", 每周一三五), every week/每周 (on today's weekday), every weekend/
  每个周末, monthly on the 1st/每月1号, hourly/每小时, every 30 minutes/每隔30分钟 (a step that divides
  the hour or the day, so that it keeps its pace). A rule without a clock time fires at 09:00.

A leading slash command ("/remind", "/schedule") is skipped.

dateparser reads English delays and calendar dates; its readings of clock times and weekdays
depend on its time-zone handling (a bare "17:00" comes back as tomorrow with TIMEZONE set, as
None with an aware RELATIVE_BASE), so those, and all of Chinese, are read here.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import cn2an  # type: ignore[import-untyped]
import dateparser  # type: ignore[import-untyped]

DEFAULT_HOUR = 9
EXAMPLE = "`/remind in 2h submit the report`"
NO_TIME = (
    "I found no time in {text!r}: say when, e.g. " + EXAMPLE + ", `/remind tomorrow 9:00 call Bob`, "
    "`/remind every weekday 9:00 standup` or 两小时后提醒我交报告"
)
NO_WHAT = "I read the time, but what should I remind you of? e.g. " + EXAMPLE

_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_ZH_WEEKDAYS = "一二三四五六日"
_WORKWEEK = "mon-fri"
# A delay has no months or years, so any base date reads the same.
_DURATION_BASE = datetime(2001, 1, 1)

# Parts of the day, as they shift an hour said with them (_shift) and as the hour they mean alone.
_PARTS = {
    "上午": "morning", "早上": "morning", "早晨": "morning", "中午": "noon", "下午": "afternoon",
    "傍晚": "evening", "晚上": "evening", "夜里": "evening", "凌晨": "early",
    "morning": "morning", "noon": "noon", "afternoon": "afternoon", "evening": "evening", "night": "evening",
    "am": "early", "pm": "afternoon", "晚": "evening",
}  # fmt: skip
_PART_HOURS = {"morning": 9, "noon": 12, "afternoon": 15, "evening": 20, "early": 6}

# Days said as a word: how many days from today, and the part of the day they carry.
_DAY_WORDS: dict[str, tuple[int, str | None]] = {
    "今天": (0, None), "今日": (0, None), "今早": (0, "morning"), "今晚": (0, "evening"),
    "明天": (1, None), "明日": (1, None), "明早": (1, "morning"), "明晚": (1, "evening"),
    "后天": (2, None), "大后天": (3, None),
    "today": (0, None), "this": (0, None), "tonight": (0, "evening"), "tomorrow": (1, None), "tmr": (1, None),
    "tmrw": (1, None), "day after tomorrow": (2, None),
}  # fmt: skip

_ZH_UNIT_SECONDS = {
    "秒": 1, "秒钟": 1, "分": 60, "分钟": 60, "小时": 3600, "钟头": 3600,
    "天": 86400, "日": 86400, "周": 604800, "星期": 604800, "礼拜": 604800,
}  # fmt: skip

_I = re.IGNORECASE
_ZH_NUM = r"(?:\d+|[零〇一二两三四五六七八九十百]+)"
_ZH_PART = r"(?:上午|早上|早晨|中午|下午|傍晚|晚上|夜里|凌晨)"
_ZH_AT = r"[在于]?"
_ZH_WEEK = r"(?:周|星期|礼拜)"
_ZH_DAY_OF_WEEK = r"[一二三四五六日天]"
_ZH_PIECE = (
    rf"(?:(?P<number>\d+\.\d+|{_ZH_NUM})\s*个?\s*(?P<half>半)?|(?P<half_alone>半))"
    r"\s*个?\s*(?P<unit>小时|钟头|分钟|分|秒钟|秒|天|日|周|星期|礼拜)"
)
_ZH_DURATION = re.sub(r"\(\?P<\w+>", "(?:", _ZH_PIECE)  # the same, without the names, to repeat
_EN_AT = r"(?:\bat\s+|@\s*)?"
_EN_NUMBER = (
    r"(?:\d+(?:\.\d+)?|an?|half\s+(?:an?\s+)?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
    r"|fifteen|twenty|thirty|forty|fifty|sixty|ninety)"
)
_EN_PIECE = rf"{_EN_NUMBER}\s*(?:hours?|hrs?|h|minutes?|mins?|m|days?|d|weeks?|seconds?|secs?)(?![a-z])"
_EN_DURATION = rf"{_EN_PIECE}(?:\s*(?:,|and)?\s*{_EN_PIECE})*"
_EN_WEEKDAY = (
    r"(?:monday|mon|tuesday|tues|tue|wednesday|wed|thursday|thurs|thur|thu|friday|fri|saturday|sat|sunday|sun)"
)
_EN_WEEKDAYS = rf"{_EN_WEEKDAY}s?(?:\s*(?:,|and|&)\s*{_EN_WEEKDAY}s?)*"
_EN_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_EN_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)?"
_EN_PART = r"(?:morning|afternoon|evening|night)"

_COMMAND = re.compile(r"^/[a-z_]+\b\s*", _I)
_ASK = re.compile(r"\b(?:please\s+)?remind\s+me\b|(?:请|麻烦你?|记得)?(?:提醒|叫|通知)我(?:一下)?", _I)
_EDGES = re.compile(r"^(?:[\s,，.。:;；、!！-]|\b(?:to|that|about|of|at|on)\b|的)+|[\s,，.。:;；、!！-]+$", _I)
_CJK_GAP = re.compile(r"(?<=[\u4e00-\u9fff])\s+(?=[\u4e00-\u9fff])")

_INTERVALS = (
    re.compile(rf"每隔?\s*(?P<zh>(?:{_ZH_DURATION}\s*)+)"),
    re.compile(rf"\bevery\s+(?P<en>{_EN_DURATION})", _I),
)
_HOURLY = (re.compile(r"每个?(?:小时|钟头)"), re.compile(r"\bhourly\b|\b(?:every|each)\s+hour\b", _I))
_MONTHLY = (
    re.compile(rf"每个?月\s*(?P<day>{_ZH_NUM})\s*[号日]"),
    re.compile(r"\b(?:every\s+month|monthly)\s+on\s+the\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?\b", _I),
    re.compile(r"\bon\s+the\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+of\s+(?:every|each)\s+month\b", _I),
)
_WEEKLY_ON = (
    # 每周三五点 is Wednesday at five: a further day is not one followed by 点.
    re.compile(
        rf"每个?{_ZH_WEEK}(?P<zh>{_ZH_DAY_OF_WEEK}(?:[、,和及与跟]?{_ZH_WEEK}?{_ZH_DAY_OF_WEEK}(?![点點时時:\d]))*)"
    ),
    re.compile(rf"\b(?:every|each)\s+(?:week\s+on\s+)?(?P<en>{_EN_WEEKDAYS})\b", _I),
    re.compile(rf"\bweekly\s+on\s+(?P<en>{_EN_WEEKDAYS})\b", _I),
    re.compile(
        r"\b(?:on\s+)?(?P<en>(?:mon|tues|wednes|thurs|fri|satur|sun)days"
        r"(?:\s*(?:,|and|&)\s*(?:mon|tues|wednes|thurs|fri|satur|sun)days)*)\b",
        _I,
    ),
)
_ON_WORKDAYS = (
    re.compile(r"每个?工作日|工作日"),
    re.compile(r"\b(?:(?:every|each|on)\s+(?:weekday|work\s*day|working\s+day|business\s+day)s?|weekdays)\b", _I),
)
_ON_WEEKENDS = (re.compile(r"每个?周末"), re.compile(r"\b(?:(?:every|each|on)\s+weekends?|weekends)\b", _I))
_WEEKLY = (re.compile(rf"每个?{_ZH_WEEK}"), re.compile(r"\b(?:weekly|every\s+week)\b", _I))
_DAILY = (
    re.compile(r"每天|每日|天天|每(?P<part>晚)"),
    re.compile(rf"\b(?:every\s*day|daily|each\s+day|every\s+(?P<part>{_EN_PART}))\b", _I),
)

_DELAYS = (
    re.compile(rf"(?P<zh>(?:{_ZH_DURATION}\s*)+)\s*(?:之|以)?后"),
    re.compile(rf"\b(?:in|after)\s+(?P<en>{_EN_DURATION})", _I),
    re.compile(rf"\b(?P<en>{_EN_DURATION})\s+(?:from\s+now|later)\b", _I),
)
_ZH_PIECES = re.compile(_ZH_PIECE)
_DAY_WORD_PATTERNS = (
    re.compile(rf"{_ZH_AT}(?P<word>大后天|后天|今天|今日|今早|今晚|明天|明日|明早|明晚)"),
    re.compile(
        rf"\b(?:on\s+)?(?P<word>(?:the\s+)?day\s+after\s+tomorrow|today|tonight|tomorrow|tmrw?)"
        rf"(?:\s+(?P<part>{_EN_PART}))?\b",
        _I,
    ),
    re.compile(r"\b(?P<word>this)\s+(?P<part>morning|afternoon|evening)\b", _I),
)
_ZH_DATE = re.compile(rf"{_ZH_AT}(?:(?P<year>\d{{4}})\s*年\s*)?(?P<month>{_ZH_NUM})\s*月\s*(?P<day>{_ZH_NUM})\s*[日号]")
_EN_DATE = re.compile(
    rf"\b(?:on\s+)?(?:the\s+)?(?P<date>{_EN_MONTH}\s+{_EN_ORDINAL}(?:,?\s+\d{{4}})?"
    rf"|{_EN_ORDINAL}\s+(?:of\s+)?{_EN_MONTH}(?:,?\s+\d{{4}})?"
    r"|\d{4}-\d{1,2}-\d{1,2}|\d{4}/\d{1,2}/\d{1,2}|\d{1,2}/\d{1,2}(?:/\d{4})?)(?![\w/:-])",
    _I,
)
_ZH_WEEKDAY = re.compile(rf"{_ZH_AT}(?P<which>下个?|这个?|本)?{_ZH_WEEK}(?P<day>{_ZH_DAY_OF_WEEK})")
_EN_WEEKDAY_PATTERNS = (
    re.compile(rf"\b(?P<which>(?:on\s+)?(?:next|this|coming)|on)\s+(?P<day>{_EN_WEEKDAY})\b", _I),
    # A weekday name with no "on" or "next" is a time only when a clock time follows: "friday 10am".
    re.compile(rf"\b(?P<day>{_EN_WEEKDAY})(?=\s+(?:at\s+)?\d)", _I),
)
_CLOCKS = (
    re.compile(
        # 一点 with no part of the day is "a little" (喝一点水) more often than one o'clock.
        rf"{_ZH_AT}(?:(?P<part>{_ZH_PART})\s*|(?!一[点點]))(?P<hour>{_ZH_NUM})\s*[点點时時]"
        rf"(?:\s*(?P<half>半)|\s*(?P<quarter>[一三])刻|\s*(?P<minute>{_ZH_NUM})\s*分?)?(?:钟|整)?"
    ),
    re.compile(
        rf"{_EN_AT}(?<![\d:])(?P<hour>\d{{1,2}})(?::(?P<minute>\d{{2}}))?\s*(?P<meridiem>[ap]\.?m\.?)(?![a-z])", _I
    ),
    re.compile(
        rf"(?:{_EN_AT}|{_ZH_AT})(?P<part>{_ZH_PART})?\s*(?<!\d)(?P<hour>\d{{1,2}}):(?P<minute>\d{{2}})(?!\d)", _I
    ),
    re.compile(rf"{_EN_AT}\b(?P<word>noon|midnight)\b", _I),
    re.compile(r"\bat\s+(?P<hour>\d{1,2})(?![\d:])", _I),
)
_PARTS_APART = (
    re.compile(rf"{_ZH_AT}(?P<part>{_ZH_PART})"),
    re.compile(rf"\b(?:in\s+the|at)\s+(?P<part>{_EN_PART})\b", _I),
)
_TIME_PATTERNS = (
    *_INTERVALS, *_HOURLY, *_MONTHLY, *_WEEKLY_ON, *_ON_WORKDAYS, *_ON_WEEKENDS, *_WEEKLY, *_DAILY, *_DELAYS,
    *_DAY_WORD_PATTERNS, _ZH_DATE, _EN_DATE, _ZH_WEEKDAY, *_EN_WEEKDAY_PATTERNS, *_CLOCKS, *_PARTS_APART,
)  # fmt: skip


@dataclass(frozen=True)
class When:
    """When a reminder or scheduled prompt fires: once (`at`) or on a rule (`cron`)."""

    at: datetime | None  # timezone-aware, for a one-shot; None when recurring
    cron: Mapping[str, str] | None  # APScheduler CronTrigger fields; None for a one-shot
    timezone: str  # the IANA zone the phrase was read in
    what: str  # the text left once the time phrase and "remind me"/提醒我 are taken out

    def describe(self) -> str:
        """e.g. "at 2026-12-01 17:00 (Asia/Shanghai)", "every weekday at 09:00 (Asia/Shanghai)"."""
        if self.at is not None:
            return f"at {self.at.astimezone(ZoneInfo(self.timezone)):%Y-%m-%d %H:%M} ({self.timezone})"
        return f"{_describe_cron(self.cron or {})} ({self.timezone})"


class UnparsedTime(ValueError):
    """A phrase with no time we can read; the message says what was expected, with an example."""


TimeZoneOf = Callable[[str], Awaitable[str | None]]  # a user id -> the zone that user set, if known


async def users_time_zone(time_zone_of: TimeZoneOf | None, user_id: str | None, default: str) -> str:
    """The zone to read a user's times in: their own when known and valid, else `default`."""
    zone = await time_zone_of(user_id) if time_zone_of is not None and user_id else None
    if not zone:
        return default
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return default
    return zone


def parse_when(text: str, *, now: datetime, timezone: str) -> When:
    """`now` is aware; `timezone` is the user's IANA zone. Raises UnparsedTime.

    A rule said without a clock time ("every weekday") fires at 09:00; the module docstring says
    what else is read."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    local_now = now.astimezone(ZoneInfo(timezone))
    phrase = _Phrase(_normalized(text))
    rule = _rule(phrase, local_now.date())
    if rule is None:
        return When(_moment(phrase, local_now, text), None, timezone, _what(phrase))
    if not rule.timed:
        return When(None, rule.fields, timezone, _what(phrase))
    hour, minute = _hour_minute(phrase, rule.part) or (DEFAULT_HOUR, 0)
    # Midnight at the end of a day (晚上12点) is hour 0 in a cron rule.
    cron = {**rule.fields, "hour": str(hour % 24), "minute": str(minute)}
    return When(None, cron, timezone, _what(phrase))


def looks_like_reminder(text: str) -> bool:
    """True for plain requests to be reminded, e.g. 'remind me in 2 hours to ...', '两小时后提醒我交报告',
    '提醒我明天...'; False for ordinary chat ('what is a reminder?', '我忘了提醒他')."""
    normalized = _normalized(text)
    return bool(_ASK.search(normalized)) and any(pattern.search(normalized) for pattern in _TIME_PATTERNS)


class _Phrase:
    """The text being read: each reading cuts its words out, and what is left is the reminder."""

    def __init__(self, text: str) -> None:
        self.text = text

    def take(self, *patterns: re.Pattern[str]) -> re.Match[str] | None:
        """The match of the first pattern that matches, cut out of the text."""
        for pattern in patterns:
            match = pattern.search(self.text)
            if match:
                self.text = f"{self.text[: match.start()]} {self.text[match.end() :]}"
                return match
        return None


@dataclass(frozen=True)
class _Rule:
    fields: dict[str, str]
    timed: bool = True  # False for an interval: it has no clock time to read
    part: str | None = None


@dataclass(frozen=True)
class _Day:
    date: date
    # How far a time already past moves on: a day for a bare clock time, a week for a bare
    # weekday; 0 for a day given outright, which is refused instead.
    roll_days: int
    part: str | None = None


@dataclass(frozen=True)
class _Clock:
    hour: int
    minute: int
    part: str | None = None


def _normalized(text: str) -> str:
    return _COMMAND.sub("", " ".join(unicodedata.normalize("NFKC", text).split()))


def _what(phrase: _Phrase) -> str:
    # Only the first: in 提醒我叫我妈打电话 the second 叫我 is part of the reminder.
    text = _CJK_GAP.sub("", " ".join(_ASK.sub(" ", phrase.text, count=1).split()))
    what = _EDGES.sub("", text)
    if not what:
        raise UnparsedTime(NO_WHAT)
    return what


def _rule(phrase: _Phrase, today: date) -> _Rule | None:
    if match := phrase.take(*_INTERVALS):
        return _Rule(_interval(match), timed=False)
    if phrase.take(*_HOURLY):
        return _Rule({"minute": "0"}, timed=False)
    if match := phrase.take(*_MONTHLY):
        day = int(_zh_number(match["day"]))
        if not 1 <= day <= 31:
            raise UnparsedTime(f"there is no day {day} in a month; say e.g. 每月1号 or `monthly on the 1st`")
        return _Rule({"day": str(day)})
    if match := phrase.take(*_WEEKLY_ON):
        return _Rule(_on_weekdays(_weekday_indexes(match)))
    if phrase.take(*_ON_WORKDAYS):
        return _Rule({"day_of_week": _WORKWEEK})
    if phrase.take(*_ON_WEEKENDS):
        return _Rule({"day_of_week": "sat,sun"})
    if phrase.take(*_WEEKLY):
        return _Rule({"day_of_week": _WEEKDAYS[today.weekday()]})
    if match := phrase.take(*_DAILY):
        part = match.groupdict().get("part")
        return _Rule({}, part=_PARTS[part.lower()] if part else None)
    return None


def _interval(match: re.Match[str]) -> dict[str, str]:
    """A cron rule for "every 30 minutes": only steps that divide the hour or the day keep their pace."""
    found = match.groupdict()
    every = _zh_duration(found["zh"]) if found.get("zh") else _en_duration(found["en"])
    minutes = int(every.total_seconds() // 60)
    if minutes < 60 and minutes > 0 and 60 % minutes == 0:
        return {"minute": f"*/{minutes}"}
    hours = minutes // 60
    if minutes % 60 == 0 and 0 < hours < 24 and 24 % hours == 0:
        return {"minute": "0"} if hours == 1 else {"hour": f"*/{hours}", "minute": "0"}
    raise UnparsedTime(
        f"I cannot repeat every {found.get('zh') or found['en']}: a step must divide the hour "
        "(1, 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 minutes) or the day (1, 2, 3, 4, 6, 8 or 12 hours); "
        "for days say e.g. `every day 9:00` or `every monday 9:00`"
    )


def _weekday_indexes(match: re.Match[str]) -> list[int]:
    found = match.groupdict()
    if found.get("zh"):
        return [_ZH_WEEKDAYS.index("日" if char == "天" else char) for char in re.findall(_ZH_DAY_OF_WEEK, found["zh"])]
    return [_WEEKDAYS.index(name[:3].lower()) for name in re.findall(_EN_WEEKDAY, found["en"], _I)]


def _on_weekdays(indexes: list[int]) -> dict[str, str]:
    days = sorted(set(indexes))
    if len(days) == len(_WEEKDAYS):
        return {}
    if days == [0, 1, 2, 3, 4]:
        return {"day_of_week": _WORKWEEK}
    return {"day_of_week": ",".join(_WEEKDAYS[day] for day in days)}


def _moment(phrase: _Phrase, now: datetime, text: str) -> datetime:
    today = now.date()
    delay = _delay(phrase)
    day = _day(phrase, today)
    hour_minute = _hour_minute(phrase, day.part if day else None)
    if delay is None and day is None and hour_minute is None:
        raise UnparsedTime(NO_TIME.format(text=text))
    if delay is not None:
        if hour_minute is None and day is None:
            return _after(now, delay)
        if day is not None or delay % timedelta(days=1):
            raise UnparsedTime(
                f"say a delay or a day and time, not both: e.g. {EXAMPLE} or `/remind tomorrow 9:00 ...`"
            )
        day = _Day(today + delay, roll_days=0)
    day = day or _Day(today, roll_days=1)
    hour, minute = hour_minute or (DEFAULT_HOUR, 0)
    at = _at(day.date, hour, minute, now)
    if at > now:
        return at
    if not day.roll_days:
        raise UnparsedTime(
            f"{at:%Y-%m-%d %H:%M} ({now.tzinfo}) is in the past; "
            "give a time still ahead, e.g. `/remind tomorrow 9:00 ...`"
        )
    return _at(day.date + timedelta(days=day.roll_days), hour, minute, now)


def _at(day: date, hour: int, minute: int, now: datetime) -> datetime:
    """The moment `hour:minute` on `day` where `now` is; hour 24 is the midnight that ends the day."""
    wall = datetime.combine(day, time(), tzinfo=now.tzinfo) + timedelta(hours=hour, minutes=minute)
    return _settled(wall)


def _after(now: datetime, delay: timedelta) -> datetime:
    """Whole days keep the clock time across a daylight-saving change; hours and minutes are elapsed time."""
    if delay % timedelta(days=1):
        return (now.astimezone(UTC) + delay).astimezone(now.tzinfo)
    return _settled(now + delay)


def _settled(wall: datetime) -> datetime:
    """A wall-clock time that a daylight-saving change skipped, moved to the one that exists."""
    return wall.astimezone(UTC).astimezone(wall.tzinfo)


def _delay(phrase: _Phrase) -> timedelta | None:
    match = phrase.take(*_DELAYS)
    if match is None:
        return None
    found = match.groupdict()
    return _zh_duration(found["zh"]) if found.get("zh") else _en_duration(found["en"])


def _zh_duration(span: str) -> timedelta:
    seconds = 0.0
    for piece in _ZH_PIECES.finditer(span):
        number = _zh_number(piece["number"]) if piece["number"] else 0.0
        halves = 0.5 if piece["half"] or piece["half_alone"] else 0.0
        seconds += (number + halves) * _ZH_UNIT_SECONDS[piece["unit"]]
    return timedelta(seconds=seconds)


def _en_duration(span: str) -> timedelta:
    # dateparser reads "in two hours" and "in 1h30m" but not "in half an hour".
    words = re.sub(r"\bhalf\s+(?:an?\s+)?hour\b", "30 minutes", span, flags=_I)
    settings = {"RELATIVE_BASE": _DURATION_BASE}
    later: datetime | None = dateparser.parse(f"in {words}", languages=["en"], settings=settings)
    if later is None or later <= _DURATION_BASE:
        raise UnparsedTime(f"I cannot read the delay {span!r}; say e.g. {EXAMPLE} or `in 90 minutes`")
    return later - _DURATION_BASE


def _day(phrase: _Phrase, today: date) -> _Day | None:
    if match := phrase.take(*_DAY_WORD_PATTERNS):
        offset, part = _DAY_WORDS[" ".join(match["word"].lower().split()).removeprefix("the ")]
        said_part = match.groupdict().get("part")
        return _Day(today + timedelta(days=offset), roll_days=0, part=_PARTS[said_part.lower()] if said_part else part)
    if match := phrase.take(_ZH_DATE):
        return _zh_date(match, today)
    if match := phrase.take(_EN_DATE):
        return _Day(_en_date(match["date"], today), roll_days=0)
    if match := phrase.take(_ZH_WEEKDAY):
        which = {"下": "next week", "这": "this week", "本": "this week"}.get((match["which"] or "")[:1], "")
        return _weekday(today, _ZH_WEEKDAYS.index("日" if match["day"] == "天" else match["day"]), which)
    if match := phrase.take(*_EN_WEEKDAY_PATTERNS):
        which = "next" if "next" in (match.groupdict().get("which") or "").lower() else ""
        return _weekday(today, _WEEKDAYS.index(match["day"][:3].lower()), which)
    return None


def _zh_date(match: re.Match[str], today: date) -> _Day:
    month, day = int(_zh_number(match["month"])), int(_zh_number(match["day"]))
    try:
        if match["year"]:
            return _Day(date(int(match["year"]), month, day), roll_days=0)
        this_year = date(today.year, month, day)
        return _Day(this_year if this_year >= today else date(today.year + 1, month, day), roll_days=0)
    except ValueError as exc:
        raise UnparsedTime(f"{match.group().strip()!r} is not a date; say e.g. 12月24日18点") from exc


def _en_date(text: str, today: date) -> date:
    """The date `text` names; without a year, its next occurrence, today included."""
    day_before = datetime.combine(today, time()) - timedelta(seconds=1)
    settings = {"PREFER_DATES_FROM": "future", "RELATIVE_BASE": day_before, "REQUIRE_PARTS": ["day", "month"]}
    read: datetime | None = dateparser.parse(text, languages=["en"], settings=settings)
    if read is None:
        raise UnparsedTime(f"{text!r} is not a date I can read; say e.g. `Dec 24 18:00` or `2026-12-24 18:00`")
    return read.date()


def _weekday(today: date, weekday: int, which: str) -> _Day:
    this_monday = today - timedelta(days=today.weekday())
    if which == "next week":
        return _Day(this_monday + timedelta(days=7 + weekday), roll_days=0)
    if which == "this week":
        return _Day(this_monday + timedelta(days=weekday), roll_days=0)
    if which == "next":
        return _Day(today + timedelta(days=(weekday - today.weekday() - 1) % 7 + 1), roll_days=0)
    return _Day(today + timedelta(days=(weekday - today.weekday()) % 7), roll_days=7)


def _hour_minute(phrase: _Phrase, day_part: str | None) -> tuple[int, int] | None:
    """The clock time said, its hour shifted by its part of the day (its own, else the day's, else one
    said apart: "tomorrow at 3 in the afternoon"); a part alone means its usual hour; None if neither."""
    clock = _clock(phrase)
    apart = phrase.take(*_PARTS_APART)
    part = (clock.part if clock else None) or day_part or (_PARTS[apart["part"].lower()] if apart else None)
    if clock is None:
        return None if part is None else (_PART_HOURS[part], 0)
    return _shift(clock.hour, part), clock.minute


def _clock(phrase: _Phrase) -> _Clock | None:
    match = phrase.take(*_CLOCKS)
    if match is None:
        return None
    found = match.groupdict()
    if found.get("word"):
        return _Clock(12 if found["word"].lower() == "noon" else 24, 0)
    hour = int(_zh_number(found["hour"]))
    if found.get("half"):
        minute = 30
    elif found.get("quarter"):
        minute = 15 * int(_zh_number(found["quarter"]))
    else:
        minute = int(_zh_number(found["minute"])) if found.get("minute") else 0
    if hour > 24 or minute > 59:
        raise UnparsedTime(f"{match.group().strip()!r} is not a time of day; say e.g. 17:00, 5pm or 下午5点")
    said = found.get("part") or (found.get("meridiem") or "").replace(".", "").lower()
    return _Clock(hour, minute, _PARTS.get(said))


def _shift(hour: int, part: str | None) -> int:
    """The 24-hour clock of an hour said with a part of the day: 下午3点 15, 晚上12点 24, 凌晨12点 (12am) 0."""
    if part in ("afternoon", "evening") and hour < 12:
        return hour + 12
    if part == "evening" and hour == 12:
        return 24
    if part == "noon" and hour < 6:
        return hour + 12
    if part == "early" and hour == 12:
        return 0
    return hour


def _zh_number(token: str) -> float:
    try:
        return float(cn2an.cn2an(token, "smart"))
    except ValueError as exc:
        raise UnparsedTime(f"I cannot read the number {token!r}") from exc


def _describe_cron(cron: Mapping[str, str]) -> str:
    minute, hour = cron.get("minute", "0"), cron.get("hour")
    if minute.startswith("*/"):
        return _every(minute[2:], "minute")
    if hour is None and minute.isdigit():
        return f"every hour at :{int(minute):02d}"
    if hour is not None and hour.startswith("*/"):
        return _every(hour[2:], "hour")
    if hour is None or not (hour.isdigit() and minute.isdigit()):
        return "on the schedule " + " ".join(f"{key}={value}" for key, value in cron.items())
    clock = f"at {int(hour):02d}:{int(minute):02d}"
    if "day" in cron:
        return f"every month on day {cron['day']} {clock}"
    return f"{_describe_days(cron.get('day_of_week'))} {clock}"


def _describe_days(day_of_week: str | None) -> str:
    if day_of_week is None:
        return "every day"
    if day_of_week == _WORKWEEK:
        return "every weekday"
    names = [_WEEKDAY_NAMES[_WEEKDAYS.index(day)] if day in _WEEKDAYS else day for day in day_of_week.split(",")]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"every {listed}"


def _every(count: str, unit: str) -> str:
    return f"every {unit}" if count == "1" else f"every {count} {unit}s"
