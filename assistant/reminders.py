"""Reminders and scheduled prompts: APScheduler jobs in the app's database, so they survive a
restart, and fire once when several replicas share that database.

APScheduler 3 does not support several schedulers on one job store, so each replica may run the
same due job: before delivering, a replica claims the run in `processed_events` (one insert wins),
and the job store takes it calmly when another replica removed or rescheduled a job it had read.

A persistent job store keeps a job's callable as a "module:qualname" reference, so a job cannot
name this replica's `Reminders`. Each replica registers its own executor under the jobs' executor
alias instead (`_ReplicaExecutor`): APScheduler hands it every due reminder job, and it calls this
replica's `Reminders.fire`. No registry, no global."""

from __future__ import annotations

import asyncio
import builtins
import logging
import pickle
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal
from uuid import uuid4
from zoneinfo import ZoneInfo

from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.job import Job
from apscheduler.jobstores.base import BaseJobStore, JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from sqlalchemy import Column, Engine, Unicode, func, select
from sqlalchemy.engine.default import DefaultExecutionContext

from assistant.when import When
from chat import Conversation
from storage import Database, EventRepository

log = logging.getLogger(__name__)

# The alias of both the job store and the executor the jobs name.
ALIAS = "reminders"
# APScheduler reads a job store only when it wakes up: at the next run time it knows of, when a job
# is added through it, and for the app's own jobs (the console sample: every 5 s by default, but
# up to an hour). A reminder another replica added is run here only once it is read, so when that
# replica goes down before the reminder's time, the others run it at most 5 s late, whatever the
# settings. Each wake-up reads the store on the event loop: 2 indexed queries, under 1 ms on SQLite.
WAKE_INTERVAL_S = 5
# A run's claim outlives the latest moment any replica may still fire it (its time plus the
# misfire grace), with an hour to spare for clocks that disagree between replicas.
CLAIM_MARGIN = timedelta(hours=1)

Kind = Literal["remind", "prompt"]


class ReminderError(ValueError):
    """A reminder that cannot be set; the message is for the user."""


@dataclass(frozen=True)
class Target:
    """Where a reminder is delivered and whose it is. `thread` is the Feishu thread's first message."""

    channel: str
    chat_id: str
    chat_type: str  # "p2p" or "group": a scheduled prompt's session is found as its chat's
    thread: str | None
    user_id: str

    @classmethod
    def of(cls, conversation: Conversation) -> Target:
        """Where a message was said and by whom: the reminder it sets comes back there, to them."""
        assert conversation.user_id is not None, "reminders belong to a person"
        return cls(
            channel=conversation.channel,
            chat_id=conversation.chat_id,
            chat_type=conversation.chat_type,
            thread=conversation.thread_id,
            user_id=conversation.user_id,
        )


@dataclass(frozen=True)
class Reminder:
    """A reminder or scheduled prompt as its owner sees it."""

    number: int | None  # its place in the owner's list in the chat (1..); None when it is delivered
    id: str
    kind: Kind
    text: str
    description: str
    next_run: datetime | None  # in the reminder's own time zone; None: it will not run again
    target: Target


@dataclass(frozen=True)
class ReminderCounts:
    reminders: int
    prompts: int


Deliver = Callable[[Reminder, datetime], Awaitable[None]]


@dataclass(frozen=True)
class _JobData:
    """What a job keeps, as plain values in its kwargs.

    This class is the job's callable: APScheduler checks a new job's kwargs against its fields,
    and the stored job names it by reference, so renaming it makes every replica drop the stored
    reminders as jobs it cannot restore."""

    kind: Kind
    target: dict[str, Any]  # Target's fields: a field added with a default still reads old jobs
    text: str
    description: str
    timezone: str
    created_at: datetime

    @classmethod
    def of(cls, job: Job) -> _JobData:
        return cls(**job.kwargs)

    def reminder(self, job_id: str, number: int | None, next_run: datetime | None) -> Reminder:
        return Reminder(
            number=number,
            id=job_id,
            kind=self.kind,
            text=self.text,
            description=self.description,
            next_run=None if next_run is None else next_run.astimezone(ZoneInfo(self.timezone)),
            target=Target(**self.target),
        )


class _SharedJobStore(SQLAlchemyJobStore):
    """APScheduler's SQLAlchemy job store on the app's engine, in a table several replicas share,
    with each job's chat, owner and kind in columns of their own (migration 0013): a user's list
    and the console's counts read those, not every job's pickled state."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine=engine)
        # APScheduler inserts its own three columns: these take their values from the job's state
        # as it is inserted (context-sensitive defaults), in the same statement.
        for name in ("chat_id", "user_id", "kind"):
            self.jobs_t.append_column(Column(name, Unicode(191), default=_from_state(name)))

    def jobs_of(self, chat_id: str, user_id: str) -> builtins.list[Job]:
        columns = self.jobs_t.c
        return self._get_jobs(columns.chat_id == chat_id, columns.user_id == user_id)

    def kinds(self) -> Counter[str]:
        """How many jobs of each kind there are."""
        kind = self.jobs_t.c.kind
        with self.engine.begin() as connection:
            rows = connection.execute(select(kind, func.count()).where(kind.is_not(None)).group_by(kind)).all()
        return Counter({row[0]: row[1] for row in rows})

    def start(self, scheduler: BaseScheduler, alias: str) -> None:
        # Not SQLAlchemyJobStore.start, which creates the table where it is missing: it is migration 0009's.
        BaseJobStore.start(self, scheduler, alias)

    def shutdown(self) -> None:
        # Not SQLAlchemyJobStore.shutdown, which disposes of the engine: it is the app's (Database.close).
        BaseJobStore.shutdown(self)

    def update_job(self, job: Job) -> None:
        try:
            super().update_job(job)
        except JobLookupError:
            # Cancelled on another replica after this one read it as due: it stays cancelled.
            log.info("reminder %s was removed by another replica", job.id)

    def remove_job(self, job_id: str) -> None:
        try:
            super().remove_job(job_id)
        except JobLookupError:
            # Another replica fired the same one-shot job first and removed it. Raising would end
            # this scheduler's pass with a traceback, before it sets its timer for the next one.
            log.info("reminder %s was removed by another replica", job_id)


class _ReplicaExecutor(AsyncIOExecutor):
    """Runs the due reminder jobs as `Reminders.fire` of this replica, on the event loop."""

    def __init__(self, reminders: Reminders) -> None:
        super().__init__()
        self._reminders = reminders

    def _do_submit_job(self, job: Job, run_times: builtins.list[datetime]) -> None:
        # coalesce=True: the scheduler hands the latest run time due only.
        task = self._eventloop.create_task(self._reminders.fire(job, run_times[-1]))
        self._pending_futures.add(task)
        task.add_done_callback(partial(self._finished, job.id))

    def _finished(self, job_id: str, task: asyncio.Task[None]) -> None:
        self._pending_futures.discard(task)
        self._run_job_success(job_id, [])


class Reminders:
    """Reminders and scheduled prompts on the app's scheduler, each fired once by one replica.

    The constructor adds the job store and the executor to `scheduler` (started or not); `start()`
    (on the event loop) keeps it reading the store every `WAKE_INTERVAL_S`, `stop()` before the
    scheduler's shutdown ends that. `deliver(reminder, fired_at)` is awaited once per run, on the
    replica that claimed it; `fired_at` is the time the run was due (aware). A run missed while no
    replica ran is delivered when one starts if it is at most `misfire_grace_s` late (the grace is
    kept with each job as it is set); of a recurring job's missed runs, the latest only."""

    def __init__(
        self,
        scheduler: BaseScheduler,
        db: Database,
        deliver: Deliver,
        *,
        misfire_grace_s: int = 3600,
        max_per_user: int = 50,
    ) -> None:
        self._scheduler = scheduler
        self._db = db
        self._deliver = deliver
        self._misfire_grace_s = misfire_grace_s
        self._max_per_user = max_per_user
        self._store = _SharedJobStore(engine=db.sql_engine)
        self._waking: asyncio.Task[None] | None = None
        # The executor first: a running scheduler runs the store's due jobs as soon as it has it.
        scheduler.add_executor(_ReplicaExecutor(self), ALIAS)
        scheduler.add_jobstore(self._store, ALIAS)

    def start(self) -> None:
        self._waking = asyncio.get_running_loop().create_task(self._wake_regularly())

    def stop(self) -> None:
        if self._waking is not None:
            self._waking.cancel()

    async def add(self, kind: Kind, target: Target, when: When) -> Reminder:
        return await asyncio.to_thread(self._add, kind, target, when)

    async def list(self, chat_id: str, user_id: str) -> builtins.list[Reminder]:
        """That user's reminders in that chat, numbered 1.. by their next run."""
        owned = await asyncio.to_thread(self._owned, chat_id, user_id)
        return [_JobData.of(job).reminder(job.id, number, job.next_run_time) for number, job in enumerate(owned, 1)]

    async def cancel(self, chat_id: str, user_id: str, number: int) -> Reminder | None:
        """Cancel that user's reminder by its number in `list`; None if the user has no such number."""
        return await asyncio.to_thread(self._cancel, chat_id, user_id, number)

    async def counts(self) -> ReminderCounts:
        kinds = await asyncio.to_thread(self._store.kinds)
        return ReminderCounts(reminders=kinds["remind"], prompts=kinds["prompt"])

    async def fire(self, job: Job, run_time: datetime) -> None:
        """Deliver one run of `job` if it is within its grace and this replica claims it first."""
        late = datetime.now(UTC) - run_time
        if late > timedelta(seconds=job.misfire_grace_time):
            log.warning("reminder %s missed its time by %s: not delivered", job.id, late)
            return
        ttl = timedelta(seconds=job.misfire_grace_time) + CLAIM_MARGIN
        key = f"reminder:{job.id}:{run_time.astimezone(UTC).isoformat()}"
        next_run = job.trigger.get_next_fire_time(run_time, run_time)  # the run after this one
        reminder = _JobData.of(job).reminder(job.id, None, next_run)
        try:
            if not await asyncio.to_thread(self._claim, key, ttl):
                log.debug("reminder %s at %s was delivered by another replica", job.id, run_time)
                return
            await self._deliver(reminder, run_time)
        except Exception:  # one failed delivery must not stop the scheduler or the next run
            log.exception("reminder %s: delivery failed", job.id)

    def _add(self, kind: Kind, target: Target, when: When) -> Reminder:
        owned = self._owned(target.chat_id, target.user_id)
        if len(owned) >= self._max_per_user:
            raise ReminderError(
                f"You already have {self._max_per_user} reminders and scheduled prompts in this chat: "
                "cancel one first (/reminders)."
            )
        trigger = _trigger(when)
        now = datetime.now(UTC)
        first = trigger.get_next_fire_time(None, now)
        if first is None:
            raise ReminderError("That schedule never comes round.")
        if first <= now:
            raise ReminderError("That time has already passed.")
        data = _JobData(kind, asdict(target), when.what, when.describe(), when.timezone, now)
        job = self._scheduler.add_job(
            _JobData,
            trigger,
            kwargs=asdict(data),
            id=uuid4().hex,
            name=kind,  # what APScheduler logs: never the text
            jobstore=ALIAS,
            executor=ALIAS,
            next_run_time=first,
            misfire_grace_time=self._misfire_grace_s,
            coalesce=True,
            max_instances=1,
        )
        number = sorted([*owned, job], key=_order).index(job) + 1
        return data.reminder(job.id, number, first)

    def _cancel(self, chat_id: str, user_id: str, number: int) -> Reminder | None:
        owned = self._owned(chat_id, user_id)
        if not 1 <= number <= len(owned):
            return None
        job = owned[number - 1]
        self._store.remove_job(job.id)
        return _JobData.of(job).reminder(job.id, number, job.next_run_time)

    def _owned(self, chat_id: str, user_id: str) -> builtins.list[Job]:
        return sorted(self._store.jobs_of(chat_id, user_id), key=_order)

    def _claim(self, key: str, ttl: timedelta) -> bool:
        with self._db.session() as session:
            return EventRepository(session).claim(key, ttl)

    async def _wake_regularly(self) -> None:
        while True:
            await asyncio.sleep(WAKE_INTERVAL_S)
            if self._scheduler.running:
                self._scheduler.wakeup()


def _trigger(when: When) -> BaseTrigger:
    if when.at is not None:
        return DateTrigger(run_date=when.at)
    assert when.cron is not None, "a When has a time or a schedule"
    return CronTrigger(timezone=when.timezone, **when.cron)


def _from_state(name: str) -> Callable[[DefaultExecutionContext], str]:
    """A column's value, read from the job being inserted: its state is APScheduler's dict,
    pickled; its kwargs are _JobData's fields. (A plain function of one argument: SQLAlchemy passes
    the context only to such.)"""

    def value(context: DefaultExecutionContext) -> str:
        kwargs = pickle.loads(context.get_current_parameters()["job_state"])["kwargs"]
        return str(kwargs["kind"] if name == "kind" else kwargs["target"][name])

    return value


def _order(job: Job) -> tuple[datetime, datetime, str]:
    # Ties in time keep the order they were set in, so a number means the same reminder each time.
    return job.next_run_time, _JobData.of(job).created_at, job.id
