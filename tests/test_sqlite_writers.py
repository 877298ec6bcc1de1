"""SQLite writers of one process take turns in the order they asked (storage/sqlite_writers.py),
on a real database file."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from storage import Database


def database(tmp_path: Path, busy_timeout_ms: int = 10_000) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'writers.db'}", busy_timeout_ms=busy_timeout_ms)
    with db.session() as session:
        session.execute(text("CREATE TABLE IF NOT EXISTS notes (writer TEXT)"))
    return db


def write(db: Database, writer: str) -> None:
    with db.session() as session:
        session.execute(text("INSERT INTO notes VALUES (:writer)"), {"writer": writer})


def writers(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.execute(text("SELECT writer FROM notes ORDER BY rowid")).scalars())


class HeldWrite:
    """A unit of work that has written and holds the file until `commit`."""

    def __init__(self, db: Database) -> None:
        self._written, self._commit = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(db,))
        self._thread.start()
        assert self._written.wait(10)

    def _run(self, db: Database) -> None:
        with db.session() as session:
            session.execute(text("INSERT INTO notes VALUES ('held')"))
            self._written.set()
            self._commit.wait(10)

    def commit(self) -> float:
        committed_at = time.perf_counter()
        self._commit.set()
        self._thread.join()
        return committed_at


def test_a_write_that_waits_for_another_goes_in_as_soon_as_that_one_commits(tmp_path: Path) -> None:
    db = database(tmp_path)
    held = HeldWrite(db)
    waiting_since, done_at = threading.Event(), []

    def wait_and_write() -> None:
        waiting_since.set()
        write(db, "waited")
        done_at.append(time.perf_counter())

    waiter = threading.Thread(target=wait_and_write)
    waiter.start()
    assert waiting_since.wait(10)
    # SQLite's busy handler would retry 228 and 328 ms into the wait: a commit at ~240 ms let it
    # in ~90 ms late. In the queue it is woken by the commit itself.
    time.sleep(0.24)
    committed_at = held.commit()
    waiter.join()
    assert done_at[0] - committed_at < 0.04
    assert writers(db) == ["held", "waited"]


def test_writers_go_in_the_order_they_asked(tmp_path: Path) -> None:
    db = database(tmp_path)
    held = HeldWrite(db)
    threads = []
    for name in ("first", "second", "third"):
        asking = threading.Event()

        def ask_and_write(name: str = name, asking: threading.Event = asking) -> None:
            asking.set()
            write(db, name)

        thread = threading.Thread(target=ask_and_write)
        thread.start()
        threads.append(thread)
        assert asking.wait(10)
        time.sleep(0.05)  # so that it has asked before the next one
    held.commit()
    for thread in threads:
        thread.join()
    assert writers(db) == ["held", "first", "second", "third"]


def test_a_writer_that_waits_past_the_busy_timeout_fails_as_sqlite_would_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    db = database(tmp_path, busy_timeout_ms=200)
    held = HeldWrite(db)
    started = time.perf_counter()
    with pytest.raises(OperationalError, match="database is locked"):
        write(db, "gave up")
    assert time.perf_counter() - started >= 0.2
    held.commit()
    write(db, "after")
    assert writers(db) == ["held", "after"]
