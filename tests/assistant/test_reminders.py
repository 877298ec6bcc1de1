"""Reminders on a real APScheduler over real SQLite files, in real time: each reminder is due a
second or two ahead."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import inspect, text

from assistant.reminders import ALIAS, Reminder, ReminderCounts, ReminderError, Reminders, Target
from assistant.when import When
from storage import Database
from tests.support import until

SHANGHAI = ZoneInfo("Asia/Shanghai")
ANN = Target(channel="feishu", chat_id="oc_team", chat_type="group", thread="om_root", user_id="ou_ann")
BOB = Target(channel="feishu", chat_id="oc_team", chat_type="group", thread=None, user_id="ou_bob")

T = TypeVar("T")


@dataclass
class Delivery:
    reminder: Reminder
    fired_at: datetime
    delivered_at: datetime


@dataclass
class Replica:
    """One app's scheduler and reminders on the shared database file."""

    scheduler: AsyncIOScheduler
    reminders: Reminders
    delivered: list[Delivery] = field(default_factory=list)


@asynccontextmanager
async def replica(path: Path, *, fail_first: bool = False, **options: int) -> AsyncIterator[Replica]:
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    delivered: list[Delivery] = []

    async def deliver(reminder: Reminder, fired_at: datetime) -> None:
        delivered.append(Delivery(reminder, fired_at, datetime.now(UTC)))
        if fail_first and len(delivered) == 1:
            raise RuntimeError("the chat is gone")

    scheduler = AsyncIOScheduler(timezone="UTC")
    reminders = Reminders(scheduler, db, deliver, **options)
    scheduler.start()
    reminders.start()
    try:
        yield Replica(scheduler, reminders, delivered)
    finally:
        reminders.stop()
        scheduler.shutdown(wait=False)
        await asyncio.sleep(0.05)  # AsyncIOScheduler shuts down on a later turn of the loop
        db.close()


class ThreadedReplica:
    """A replica on an event loop of its own, in a thread: like another process, it runs due jobs
    at the same moments as the other replica, not after it."""

    def __init__(self, path: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._context = replica(path)
        self.replica = self.run(self._context.__aenter__)

    def run(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=10)

    def close(self) -> None:
        self.run(lambda: self._context.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def in_(seconds: float, what: str = "submit the report") -> When:
    moment = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0) + timedelta(seconds=1)
    return When(at=moment.astimezone(SHANGHAI), cron=None, timezone="Asia/Shanghai", what=what)


def time_of(when: When) -> datetime:
    assert when.at is not None
    return when.at


def every_second(what: str = "drink water") -> When:
    return When(at=None, cron={"second": "*"}, timezone="UTC", what=what)


async def test_a_reminder_fires_once_with_its_target_and_text(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db") as app:
        when = in_(1)
        added = await app.reminders.add("remind", ANN, when)
        assert (added.number, added.kind, added.text, added.target) == (1, "remind", "submit the report", ANN)
        assert added.next_run == when.at
        assert added.description == when.describe()

        await until(lambda: bool(app.delivered))
        await asyncio.sleep(1)

        [delivery] = app.delivered
        assert delivery.reminder.id == added.id
        assert (delivery.reminder.kind, delivery.reminder.text, delivery.reminder.target) == ("remind", when.what, ANN)
        assert delivery.reminder.next_run is None
        assert delivery.fired_at == when.at
        assert delivery.delivered_at >= delivery.fired_at
        assert await app.reminders.list(ANN.chat_id, ANN.user_id) == []


async def test_a_reminder_set_before_a_restart_fires_after_it(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db") as before:
        when = in_(1.5)
        added = await before.reminders.add("remind", ANN, when)
    assert before.delivered == []

    async with replica(tmp_path / "bot.db") as after:
        await until(lambda: bool(after.delivered))
        await asyncio.sleep(1)

    [delivery] = after.delivered
    assert delivery.reminder.id == added.id
    assert delivery.delivered_at >= time_of(when)
    assert before.delivered == []


def test_two_replicas_on_one_database_deliver_each_run_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    first, second = ThreadedReplica(tmp_path / "bot.db"), ThreadedReplica(tmp_path / "bot.db")
    try:
        once = first.run(lambda: first.replica.reminders.add("remind", ANN, in_(1)))
        recurring = first.run(lambda: first.replica.reminders.add("prompt", BOB, every_second()))
        second.replica.scheduler.wakeup()  # reads the store now, as its regular wake-up would within 5 s
        time.sleep(3.5)
        cancelled = second.run(lambda: second.replica.reminders.cancel(BOB.chat_id, BOB.user_id, 1))
        assert cancelled is not None and cancelled.id == recurring.id
        time.sleep(1)  # a run already under way when it was cancelled ends
        runs = [delivery.fired_at for delivery in first.replica.delivered + second.replica.delivered]
        time.sleep(1)
        deliveries = first.replica.delivered + second.replica.delivered
    finally:
        first.close()
        second.close()

    assert [d.fired_at for d in deliveries] == runs, "a cancelled job ran on"
    assert len([d for d in deliveries if d.reminder.id == once.id]) == 1
    recurring_runs = [d.fired_at for d in deliveries if d.reminder.id == recurring.id]
    assert len(recurring_runs) >= 2
    assert len(set(recurring_runs)) == len(recurring_runs), "a run was delivered twice"
    assert [record.getMessage() for record in caplog.records] == []


async def test_a_replica_that_read_a_job_another_fired_first_goes_on_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING)
    async with replica(tmp_path / "bot.db") as first, replica(tmp_path / "bot.db") as second:
        # Each replica runs only the job this test gives it: a running scheduler that reads the
        # store (at its start, on its regular wake-up) sets a timer for any job there, and then the
        # two replicas race for the claim.
        second.scheduler.pause()
        await first.reminders.add("remind", ANN, in_(1))
        store = second.scheduler._lookup_jobstore(ALIAS)
        # What the second replica reads as due, before the first fires the job and removes it.
        read = store.get_due_jobs(datetime.now(UTC) + timedelta(seconds=10))
        assert len(read) == 1
        await until(lambda: bool(first.delivered))
        first.scheduler.pause()

        monkeypatch.setattr(store, "get_due_jobs", lambda now: read)
        second.scheduler.resume()
        await asyncio.sleep(0.5)
        monkeypatch.undo()

        later = await second.reminders.add("remind", BOB, in_(1))
        await until(lambda: bool(second.delivered))

    assert len(first.delivered) == 1
    assert [delivery.reminder.id for delivery in second.delivered] == [later.id]
    assert [record.getMessage() for record in caplog.records] == []


async def test_reminders_are_numbered_by_next_run_and_only_their_owner_cancels_them(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db") as app:
        for hours, what in [(3, "third"), (1, "first"), (2, "second")]:
            await app.reminders.add("remind", ANN, in_(hours * 3600, what))
        await app.reminders.add("prompt", BOB, in_(3600, "bob's"))
        elsewhere = Target(channel="feishu", chat_id="oc_other", chat_type="group", thread=None, user_id="ou_ann")
        await app.reminders.add("remind", elsewhere, in_(3600, "other chat"))

        listed = await app.reminders.list(ANN.chat_id, ANN.user_id)
        assert [(r.number, r.text) for r in listed] == [(1, "first"), (2, "second"), (3, "third")]
        assert all(r.next_run is not None and r.next_run.tzinfo == SHANGHAI for r in listed)
        assert await app.reminders.counts() == ReminderCounts(reminders=4, prompts=1)

        assert await app.reminders.cancel(BOB.chat_id, BOB.user_id, 2) is None  # Bob has one only
        assert await app.reminders.cancel(ANN.chat_id, ANN.user_id, 4) is None
        assert await app.reminders.cancel(ANN.chat_id, ANN.user_id, 0) is None
        cancelled = await app.reminders.cancel(ANN.chat_id, ANN.user_id, 2)
        assert cancelled is not None and (cancelled.number, cancelled.text) == (2, "second")

        listed = await app.reminders.list(ANN.chat_id, ANN.user_id)
        assert [(r.number, r.text) for r in listed] == [(1, "first"), (2, "third")]
        assert [r.text for r in await app.reminders.list(BOB.chat_id, BOB.user_id)] == ["bob's"]
        added = await app.reminders.add("remind", ANN, in_(5400, "between"))
        assert added.number == 2


async def test_a_cancelled_reminder_never_fires(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db") as app:
        when = in_(1)
        await app.reminders.add("remind", ANN, when)
        assert await app.reminders.cancel(ANN.chat_id, ANN.user_id, 1) is not None
        await until(lambda: datetime.now(UTC) > time_of(when) + timedelta(seconds=1))
    assert app.delivered == []


async def test_one_user_may_hold_so_many_reminders_in_a_chat(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db", max_per_user=2) as app:
        await app.reminders.add("remind", ANN, in_(3600))
        await app.reminders.add("prompt", ANN, in_(7200))
        with pytest.raises(ReminderError, match="already have 2"):
            await app.reminders.add("remind", ANN, in_(3600))
        await app.reminders.add("remind", BOB, in_(3600))
        assert len(await app.reminders.list(ANN.chat_id, ANN.user_id)) == 2


async def test_a_time_already_passed_is_refused(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db") as app:
        with pytest.raises(ReminderError, match="passed"):
            await app.reminders.add("remind", ANN, in_(-60))
        assert await app.reminders.list(ANN.chat_id, ANN.user_id) == []


async def test_a_failed_delivery_is_logged_and_the_next_run_comes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with replica(tmp_path / "bot.db", fail_first=True) as app:
        await app.reminders.add("remind", ANN, every_second())
        await until(lambda: len(app.delivered) >= 2)
    assert "delivery failed" in caplog.text


async def test_a_reminder_missed_while_down_fires_on_start_within_its_grace(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db", misfire_grace_s=60) as before:
        when = in_(0.5)
        await before.reminders.add("remind", ANN, when)
    await until(lambda: datetime.now(UTC) > time_of(when) + timedelta(seconds=0.5))

    async with replica(tmp_path / "bot.db") as after:
        await until(lambda: bool(after.delivered))
        await asyncio.sleep(0.5)
    [delivery] = after.delivered
    assert delivery.fired_at == when.at


async def test_a_reminder_missed_past_its_grace_never_fires(tmp_path: Path) -> None:
    async with replica(tmp_path / "bot.db", misfire_grace_s=1) as before:
        when = in_(0.5)
        await before.reminders.add("remind", ANN, when)
    await until(lambda: datetime.now(UTC) > time_of(when) + timedelta(seconds=1.5))

    async with replica(tmp_path / "bot.db") as after:
        await asyncio.sleep(0.5)
        assert await after.reminders.list(ANN.chat_id, ANN.user_id) == []
    assert after.delivered == []


def test_migration_0009_up_and_down(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    db.upgrade()
    assert sorted(str(index["name"]) for index in inspect(db.sql_engine).get_indexes("apscheduler_jobs")) == [
        "ix_apscheduler_jobs_next_run_time",
        "ix_apscheduler_jobs_owner",
    ]
    db.downgrade("0008")
    assert "apscheduler_jobs" not in inspect(db.sql_engine).get_table_names()
    db.upgrade()
    assert "apscheduler_jobs" in inspect(db.sql_engine).get_table_names()
    db.close()


def job_columns(path: Path) -> list[tuple[str, str | None, str | None, str | None]]:
    """Each stored job's id, chat, owner and kind, soonest first."""
    db = Database(f"sqlite:///{path}")
    try:
        with db.sql_engine.begin() as connection:
            query = "SELECT id, chat_id, user_id, kind FROM apscheduler_jobs ORDER BY next_run_time"
            return [(row[0], row[1], row[2], row[3]) for row in connection.execute(text(query))]
    finally:
        db.close()


def set_job_state(path: Path, job_id: str, state: bytes) -> None:
    db = Database(f"sqlite:///{path}")
    try:
        with db.sql_engine.begin() as connection:
            update = "UPDATE apscheduler_jobs SET job_state = :state WHERE id = :id"
            connection.execute(text(update), {"state": state, "id": job_id})
    finally:
        db.close()


async def test_a_users_list_reads_their_jobs_only(tmp_path: Path) -> None:
    path = tmp_path / "bot.db"
    async with replica(path) as app:
        await app.reminders.add("remind", ANN, in_(3600, "mine"))
        bobs = await app.reminders.add("prompt", BOB, in_(7200, "bob's"))
        # Bob's job unreadable: reading it, APScheduler would drop it as a job it cannot restore
        set_job_state(path, bobs.id, b"\x00")
        assert [r.text for r in await app.reminders.list(ANN.chat_id, ANN.user_id)] == ["mine"]
        assert await app.reminders.counts() == ReminderCounts(reminders=1, prompts=1)
    assert [job[0] for job in job_columns(path)][1] == bobs.id


async def test_migration_0013_fills_the_columns_of_the_jobs_set_before_it(tmp_path: Path) -> None:
    path = tmp_path / "bot.db"
    async with replica(path) as app:
        mine = await app.reminders.add("remind", ANN, in_(3600, "mine"))
        bobs = await app.reminders.add("prompt", BOB, in_(7200, "bob's"))
    db = Database(f"sqlite:///{path}")
    db.downgrade("0012")
    with db.sql_engine.begin() as connection:
        insert = "INSERT INTO apscheduler_jobs (id, next_run_time, job_state) VALUES ('unreadable', 1e10, :state)"
        connection.execute(text(insert), {"state": b"\x00"})
    db.upgrade()
    db.close()
    assert job_columns(path) == [
        (mine.id, ANN.chat_id, ANN.user_id, "remind"),
        (bobs.id, BOB.chat_id, BOB.user_id, "prompt"),
        ("unreadable", None, None, None),
    ]
    async with replica(path) as app:
        assert [r.text for r in await app.reminders.list(ANN.chat_id, ANN.user_id)] == ["mine"]
        assert await app.reminders.counts() == ReminderCounts(reminders=1, prompts=1)
