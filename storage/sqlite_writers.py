"""SQLite connections that take turns to write, in the order they asked, within this process.

SQLite lets one connection write at a time. Another that tries meanwhile sleeps in SQLite's busy
handler, 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, then 100 ms between tries, and gets in only if
the file is free at one of them. Under a stream of turns each committing in a few milliseconds, a
writer that came first slept through the others' commits: a new session's row waited 346 ms, the
whole schedule, while two dozen units of work came and went, and its user's first token waited
with it. Here a writer waits in a queue instead and is woken the moment the one ahead commits or
rolls back. The busy timeout bounds that wait as it bounds SQLite's, and SQLite's own handler
still covers other processes on the same file.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self, TypeVar, overload

# What opens a write: a statement starting with one of these takes the writer's turn first.
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")

_CursorT = TypeVar("_CursorT", bound=sqlite3.Cursor)


class WriterQueue:
    """A lock handed over in the order it was asked for: a released threading.Lock goes to
    whichever thread runs first, often the one that released it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiting: deque[threading.Event] = deque()

    def acquire(self, timeout_s: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            turn = threading.Event()
            self._waiting.append(turn)
        if turn.wait(timeout_s):
            return True
        with self._mutex:
            if turn.is_set():  # handed over as the wait ran out
                return True
            self._waiting.remove(turn)
            return False

    def release(self) -> None:
        with self._mutex:
            assert self._held, "released a writer's turn nobody held"
            if self._waiting:
                self._waiting.popleft().set()  # the next writer holds it from now
            else:
                self._held = False


_queues: dict[str, WriterQueue] = {}
_queues_lock = threading.Lock()


def _queue_for(database: str) -> WriterQueue | None:
    """The queue of every connection of this process to `database`; None for a private in-memory one."""
    if database in ("", ":memory:"):
        return None
    key = str(Path(database).resolve())
    with _queues_lock:
        return _queues.setdefault(key, WriterQueue())


class QueuedWriterConnection(sqlite3.Connection):
    """A sqlite3 connection (`sqlite3.connect(path, factory=QueuedWriterConnection)`) that waits
    for its turn before its first write and gives the turn back when its transaction ends."""

    def __init__(self, database: str, timeout: float = 5.0, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, timeout, *args, **kwargs)
        self.timeout_s = timeout
        self.writers = _queue_for(str(database))
        self.writing = False

    @overload
    def cursor(self, factory: None = None) -> sqlite3.Cursor: ...

    @overload
    def cursor(self, factory: Callable[[sqlite3.Connection], _CursorT]) -> _CursorT: ...

    def cursor(self, factory: Callable[[sqlite3.Connection], sqlite3.Cursor] | None = None) -> sqlite3.Cursor:
        return super().cursor(factory or QueuedWriterCursor)

    def commit(self) -> None:
        self._ending(super().commit)

    def rollback(self) -> None:
        self._ending(super().rollback)

    def close(self) -> None:
        self._ending(super().close)

    def wait_to_write(self) -> None:
        if self.writing or self.writers is None:
            return
        if not self.writers.acquire(self.timeout_s):
            raise sqlite3.OperationalError("database is locked")
        self.writing = True

    def done_writing(self) -> None:
        if self.writing:
            self.writing = False
            assert self.writers is not None
            self.writers.release()

    def _ending(self, end: Callable[[], None]) -> None:
        """`end`s the transaction (commit, rollback, close), then gives the turn back."""
        try:
            end()
        finally:
            self.done_writing()


class QueuedWriterCursor(sqlite3.Cursor):
    connection: QueuedWriterConnection

    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        self._before(sql)
        try:
            return super().execute(sql, parameters)
        finally:
            self._after()

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> Self:
        self._before(sql)
        try:
            return super().executemany(sql, seq_of_parameters)
        finally:
            self._after()

    def _before(self, sql: str) -> None:
        if sql.lstrip().upper().startswith(_WRITES):
            self.connection.wait_to_write()

    def _after(self) -> None:
        # no transaction open: the write was its own (autocommit), or it failed before it began
        if not self.connection.in_transaction:
            self.connection.done_writing()
