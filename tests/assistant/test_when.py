"""Reading reminder and schedule times, in Chinese and English, at a fixed moment."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger

from assistant.when import UnparsedTime, When, looks_like_reminder, parse_when, users_time_zone

SHANGHAI = "Asia/Shanghai"
NEW_YORK = "America/New_York"
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=ZoneInfo(SHANGHAI))  # a Tuesday morning


def at(month: int, day: int, hour: int, minute: int = 0, *, year: int = 2026, zone: str = SHANGHAI) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone))


ONE_SHOT = [
    # English
    ("in 2h submit the report", at(12, 1, 12), "submit the report"),
    ("/remind in 2h submit the report", at(12, 1, 12), "submit the report"),
    ("in 2 hours call mom", at(12, 1, 12), "call mom"),
    ("in 90 minutes check the build", at(12, 1, 11, 30), "check the build"),
    ("in 1h30m check the oven", at(12, 1, 11, 30), "check the oven"),
    ("in half an hour tea", at(12, 1, 10, 30), "tea"),
    ("in 3 days pay rent", at(12, 4, 10), "pay rent"),
    ("remind me in 2 hours to call Bob", at(12, 1, 12), "call Bob"),
    ("remind me 2 hours from now to stretch", at(12, 1, 12), "stretch"),
    ("tomorrow 9am standup", at(12, 2, 9), "standup"),
    ("tomorrow at 17:00 gym", at(12, 2, 17), "gym"),
    ("remind me tomorrow to call the bank", at(12, 2, 9), "call the bank"),
    ("at 5pm leave the office", at(12, 1, 17), "leave the office"),
    ("remind me to call Bob at 5pm", at(12, 1, 17), "call Bob"),
    ("5:30 pm water the plants", at(12, 1, 17, 30), "water the plants"),
    ("17:00 call Bob", at(12, 1, 17), "call Bob"),
    ("9:00 standup", at(12, 2, 9), "standup"),  # 9:00 has passed today
    ("on friday at 10:00 demo", at(12, 4, 10), "demo"),
    ("on tuesday 9:00 retro", at(12, 8, 9), "retro"),  # today is Tuesday, 9:00 has passed
    ("next monday 9:00 plan the sprint", at(12, 7, 9), "plan the sprint"),
    ("Dec 24 18:00 family dinner", at(12, 24, 18), "family dinner"),
    ("2026-12-24 18:00 family dinner", at(12, 24, 18), "family dinner"),
    ("Jan 5 9am dentist", at(1, 5, 9, year=2027), "dentist"),
    ("remind me on the 24th of December at 6pm to buy gifts", at(12, 24, 18), "buy gifts"),
    ("tonight call mom", at(12, 1, 20), "call mom"),
    ("in 2 days at 9am dentist", at(12, 3, 9), "dentist"),
    # Chinese
    ("两小时后提醒我交报告", at(12, 1, 12), "交报告"),
    ("2小时后交报告", at(12, 1, 12), "交报告"),
    ("半小时后喝水", at(12, 1, 10, 30), "喝水"),
    ("一个半小时后开会", at(12, 1, 11, 30), "开会"),
    ("30分钟后提醒我喝水", at(12, 1, 10, 30), "喝水"),
    ("1小时30分钟后开会", at(12, 1, 11, 30), "开会"),
    ("三天后交房租", at(12, 4, 10), "交房租"),
    ("明天下午3点提醒我开会", at(12, 2, 15), "开会"),
    ("提醒我明天下午3点开会", at(12, 2, 15), "开会"),
    ("后天上午9点半面试", at(12, 3, 9, 30), "面试"),
    ("今晚8点提醒我给妈妈打电话", at(12, 1, 20), "给妈妈打电话"),
    ("下周一上午10点开会", at(12, 7, 10), "开会"),
    ("周五下午两点开会", at(12, 4, 14), "开会"),
    ("12月24日18点聚餐", at(12, 24, 18), "聚餐"),
    ("17:00开会", at(12, 1, 17), "开会"),
    ("17点开会", at(12, 1, 17), "开会"),
    ("9点站会", at(12, 2, 9), "站会"),  # 9点 has passed today
    ("十点一刻交周报", at(12, 1, 10, 15), "交周报"),
    ("明早7点叫我起床", at(12, 2, 7), "起床"),
    ("今晚12点提醒我睡觉", at(12, 2, 0), "睡觉"),
    ("中午1点提醒我吃饭", at(12, 1, 13), "吃饭"),
    ("明天下午提醒我开会", at(12, 2, 15), "开会"),
    ("三天后下午3点交房租", at(12, 4, 15), "交房租"),
    ("下周日下午3点打球", at(12, 13, 15), "打球"),
    ("明天下午3点的会议", at(12, 2, 15), "会议"),
    ("下午3:30开会", at(12, 1, 15, 30), "开会"),
    ("两小时后提醒我喝一点水", at(12, 1, 12), "喝一点水"),
    ("明天下午３点：开会", at(12, 2, 15), "开会"),  # fullwidth digits and colon
    ("1.5小时后提醒我叫我妈打电话", at(12, 1, 11, 30), "叫我妈打电话"),
]

RECURRING = [
    # English
    ("every weekday 9:00 standup", {"day_of_week": "mon-fri", "hour": "9", "minute": "0"}, "standup"),
    ("every weekday standup", {"day_of_week": "mon-fri", "hour": "9", "minute": "0"}, "standup"),
    ("daily 9:00 summarize yesterday's discussion", {"hour": "9", "minute": "0"}, "summarize yesterday's discussion"),
    ("every day at 7:30am run", {"hour": "7", "minute": "30"}, "run"),
    ("every monday 10:00 weekly report", {"day_of_week": "mon", "hour": "10", "minute": "0"}, "weekly report"),
    ("mondays 10am report", {"day_of_week": "mon", "hour": "10", "minute": "0"}, "report"),
    ("every week on friday review", {"day_of_week": "fri", "hour": "9", "minute": "0"}, "review"),
    ("every monday and thursday 8:00 gym", {"day_of_week": "mon,thu", "hour": "8", "minute": "0"}, "gym"),
    ("every weekend 10:00 clean", {"day_of_week": "sat,sun", "hour": "10", "minute": "0"}, "clean"),
    ("hourly drink water", {"minute": "0"}, "drink water"),
    ("every hour drink water", {"minute": "0"}, "drink water"),
    ("every 30 minutes stretch", {"minute": "*/30"}, "stretch"),
    ("every 2 hours look away from the screen", {"hour": "*/2", "minute": "0"}, "look away from the screen"),
    ("monthly on the 1st pay rent", {"day": "1", "hour": "9", "minute": "0"}, "pay rent"),
    # Chinese
    ("每个工作日9点提醒我站会", {"day_of_week": "mon-fri", "hour": "9", "minute": "0"}, "站会"),
    ("工作日9点站会", {"day_of_week": "mon-fri", "hour": "9", "minute": "0"}, "站会"),
    ("每天8点吃药", {"hour": "8", "minute": "0"}, "吃药"),
    ("每日早上7点跑步", {"hour": "7", "minute": "0"}, "跑步"),
    ("每晚10点记账", {"hour": "22", "minute": "0"}, "记账"),
    ("每周一上午10点提醒我写周报", {"day_of_week": "mon", "hour": "10", "minute": "0"}, "写周报"),
    ("每周天晚上9点复盘", {"day_of_week": "sun", "hour": "21", "minute": "0"}, "复盘"),
    ("每星期三提醒我倒垃圾", {"day_of_week": "wed", "hour": "9", "minute": "0"}, "倒垃圾"),
    ("每周一三五下午6点健身", {"day_of_week": "mon,wed,fri", "hour": "18", "minute": "0"}, "健身"),
    ("每周三五点倒垃圾", {"day_of_week": "wed", "hour": "5", "minute": "0"}, "倒垃圾"),
    ("每小时提醒我喝水", {"minute": "0"}, "喝水"),
    ("每隔30分钟提醒我活动", {"minute": "*/30"}, "活动"),
    ("每半小时提醒我喝水", {"minute": "*/30"}, "喝水"),
    ("每隔2个小时看一眼邮箱", {"hour": "*/2", "minute": "0"}, "看一眼邮箱"),
    ("每月1号提醒我交房租", {"day": "1", "hour": "9", "minute": "0"}, "交房租"),
    ("每个周末上午10点打扫", {"day_of_week": "sat,sun", "hour": "10", "minute": "0"}, "打扫"),
]


def test_now_is_a_tuesday() -> None:
    assert NOW.strftime("%A") == "Tuesday"


@pytest.mark.parametrize(("phrase", "expected", "what"), ONE_SHOT, ids=[case[0] for case in ONE_SHOT])
def test_one_shot(phrase: str, expected: datetime, what: str) -> None:
    when = parse_when(phrase, now=NOW, timezone=SHANGHAI)

    assert when.at is not None
    assert when.at.isoformat() == expected.isoformat()
    assert (when.cron, when.timezone, when.what) == (None, SHANGHAI, what)


@pytest.mark.parametrize(("phrase", "cron", "what"), RECURRING, ids=[case[0] for case in RECURRING])
def test_recurring(phrase: str, cron: dict[str, str], what: str) -> None:
    when = parse_when(phrase, now=NOW, timezone=SHANGHAI)

    assert (when.at, when.cron, when.timezone, when.what) == (None, cron, SHANGHAI, what)


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("every weekday 9:00 standup", at(12, 2, 9)),
        ("every monday 10:00 report", at(12, 7, 10)),
        ("every 30 minutes stretch", at(12, 1, 10, 30)),
        ("every 2 hours stretch", at(12, 1, 12)),
        ("每月1号提醒我交房租", at(1, 1, 9, year=2027)),
    ],
)
def test_cron_rules_are_what_apscheduler_takes(phrase: str, expected: datetime) -> None:
    when = parse_when(phrase, now=NOW, timezone=SHANGHAI)
    assert when.cron is not None

    trigger = CronTrigger(**when.cron, timezone=when.timezone)

    assert trigger.get_next_fire_time(None, NOW.replace(minute=5)) == expected


@pytest.mark.parametrize(
    ("phrase", "expected", "what"),
    [
        ("17:00 call Bob", at(12, 1, 17, zone=NEW_YORK), "call Bob"),  # 17:00 has passed in New York
        ("22:00 call Bob", at(11, 30, 22, zone=NEW_YORK), "call Bob"),
        ("tomorrow 9am standup", at(12, 1, 9, zone=NEW_YORK), "standup"),
        ("in 2h submit the report", at(11, 30, 23, zone=NEW_YORK), "submit the report"),
        ("明天下午3点提醒我开会", at(12, 1, 15, zone=NEW_YORK), "开会"),
    ],
)
def test_the_phrase_is_read_in_the_users_zone(phrase: str, expected: datetime, what: str) -> None:
    """NOW, 10:00 on Tuesday in Shanghai, is 21:00 on Monday in New York."""
    when = parse_when(phrase, now=NOW, timezone=NEW_YORK)

    assert when.at is not None
    assert when.at.isoformat() == expected.isoformat()
    assert (when.timezone, when.what) == (NEW_YORK, what)


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("in 1 day water", "2026-03-08T12:00:00-04:00"),  # a day keeps the clock time
        ("in 14 hours water", "2026-03-08T03:00:00-04:00"),  # hours are elapsed: 02:00 EST does not exist
        ("tomorrow 2:30am water", "2026-03-08T03:30:00-04:00"),  # a skipped time moves to one that exists
    ],
)
def test_daylight_saving(phrase: str, expected: str) -> None:
    saturday_noon = datetime(2026, 3, 7, 12, 0, tzinfo=ZoneInfo(NEW_YORK))

    when = parse_when(phrase, now=saturday_noon, timezone=NEW_YORK)

    assert when.at is not None
    assert when.at.isoformat() == expected


@pytest.mark.parametrize("phrase", ["hello there", "提醒我喝一点水", "", "remind me what we discussed"])
def test_no_time_is_refused_with_an_example(phrase: str) -> None:
    with pytest.raises(UnparsedTime, match=r"no time .* e\.g\. `/remind in 2h submit the report`"):
        parse_when(phrase, now=NOW, timezone=SHANGHAI)


@pytest.mark.parametrize("phrase", ["/remind in 2h", "2小时后提醒我", "remind me in 2 hours to", "every weekday 9:00"])
def test_no_text_left_is_refused(phrase: str) -> None:
    with pytest.raises(UnparsedTime) as refused:
        parse_when(phrase, now=NOW, timezone=SHANGHAI)

    assert str(refused.value) == (
        "I read the time, but what should I remind you of? e.g. `/remind in 2h submit the report`"
    )


@pytest.mark.parametrize(
    ("phrase", "past"),
    [
        ("2025-01-01 10:00 renew the domain", "2025-01-01 10:00"),
        ("today 9:00 standup", "2026-12-01 09:00"),
        ("Dec 1 9:00 standup", "2026-12-01 09:00"),
        ("这周一上午9点开会", "2026-11-30 09:00"),
        ("2026年11月30日18点聚餐", "2026-11-30 18:00"),
    ],
)
def test_a_past_date_is_refused(phrase: str, past: str) -> None:
    with pytest.raises(UnparsedTime, match=rf"^{past} \(Asia/Shanghai\) is in the past; give a time still ahead"):
        parse_when(phrase, now=NOW, timezone=SHANGHAI)


@pytest.mark.parametrize(
    ("phrase", "message"),
    [
        ("25:00 call Bob", "'25:00' is not a time of day"),
        ("13月5日开会", "'13月5日' is not a date"),
        ("every 45 minutes stretch", "a step must divide the hour"),
        ("every 2 days water the plants", "a step must divide the hour .* or the day"),
        ("in 2 hours at 5pm call Bob", "a delay or a day and time, not both"),
        ("in 0 minutes call Bob", "cannot read the delay '0 minutes'"),
    ],
)
def test_unreadable_times_say_why(phrase: str, message: str) -> None:
    with pytest.raises(UnparsedTime, match=message):
        parse_when(phrase, now=NOW, timezone=SHANGHAI)


def test_now_must_be_aware() -> None:
    with pytest.raises(ValueError, match="aware"):
        parse_when("in 2h submit the report", now=NOW.replace(tzinfo=None), timezone=SHANGHAI)


@pytest.mark.parametrize(
    "text",
    [
        "remind me in 2 hours to stretch",
        "Remind me tomorrow at 9am to call Bob",
        "please remind me at 5pm to leave",
        "can you remind me to call mom tonight",
        "remind me 2 hours from now to check the oven",
        "两小时后提醒我交报告",
        "提醒我明天交报告",
        "每个工作日9点提醒我站会",
        "明早7点叫我起床",
    ],
)
def test_reminder_requests_are_recognised(text: str) -> None:
    assert looks_like_reminder(text)


@pytest.mark.parametrize(
    "text",
    [
        "what is a reminder?",
        "how do reminders work",
        "remind me what we discussed",
        "he reminded me at 5pm",
        "我忘了提醒他",
        "他提醒我要注意安全",
        "明天下午3点开会",
        "提醒我一下这个词是什么意思",
    ],
)
def test_ordinary_chat_is_not_a_reminder(text: str) -> None:
    assert not looks_like_reminder(text)


@pytest.mark.parametrize(
    ("phrase", "description"),
    [
        ("2026-12-24 18:00 family dinner", "at 2026-12-24 18:00 (Asia/Shanghai)"),
        ("every weekday standup", "every weekday at 09:00 (Asia/Shanghai)"),
        ("daily 9:00 summary", "every day at 09:00 (Asia/Shanghai)"),
        ("每周一上午10点提醒我写周报", "every Monday at 10:00 (Asia/Shanghai)"),
        ("每周一三五下午6点健身", "every Monday, Wednesday and Friday at 18:00 (Asia/Shanghai)"),
        ("every weekend 10:00 clean", "every Saturday and Sunday at 10:00 (Asia/Shanghai)"),
        ("每月1号提醒我交房租", "every month on day 1 at 09:00 (Asia/Shanghai)"),
        ("hourly drink water", "every hour at :00 (Asia/Shanghai)"),
        ("every 30 minutes stretch", "every 30 minutes (Asia/Shanghai)"),
        ("every 2 hours stretch", "every 2 hours (Asia/Shanghai)"),
    ],
)
def test_describe(phrase: str, description: str) -> None:
    assert parse_when(phrase, now=NOW, timezone=SHANGHAI).describe() == description


def test_describe_shows_the_time_in_the_users_zone() -> None:
    when = When(at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC), cron=None, timezone=SHANGHAI, what="call Bob")

    assert when.describe() == "at 2026-12-01 17:00 (Asia/Shanghai)"


def test_describe_a_rule_it_did_not_write() -> None:
    when = When(at=None, cron={"minute": "0,30", "hour": "9-17"}, timezone=SHANGHAI, what="stretch")

    assert when.describe() == "on the schedule minute=0,30 hour=9-17 (Asia/Shanghai)"


async def test_a_users_own_zone_is_used_when_known_and_valid() -> None:
    zones = {"ou_ny": "America/New_York", "ou_bad": "Mars/Olympus"}

    async def zone_of(user: str) -> str | None:
        return zones.get(user)

    assert await users_time_zone(zone_of, "ou_ny", "Asia/Shanghai") == "America/New_York"
    assert await users_time_zone(zone_of, "ou_bad", "Asia/Shanghai") == "Asia/Shanghai"
    assert await users_time_zone(zone_of, "ou_unknown", "Asia/Shanghai") == "Asia/Shanghai"
    assert await users_time_zone(None, "ou_ny", "Asia/Shanghai") == "Asia/Shanghai"
