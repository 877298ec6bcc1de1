"""RequestMerger: identical in-flight requests share one producer (single-flight, streaming).

The caller builds the key, and must include in it everything that makes two requests
identical: the cache scope, the L1 key of the question and the sampling parameters. Requests
that ask for independent random samples must not share a key.

    async with merger.run(key, lambda: engine.stream(prompt_ids, params)) as stream:
        async for token in stream:
            ...
        stream.leader  # False: this caller joined a generation already running

A flight may also carry a group (what two requests must share to be answered alike: the scope
and the sampling parameters) and a label (its question), so that a caller who finds a paraphrase
among the group's recent flights (`running`) can `join` it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

Producer = Callable[[], AsyncIterator[T]]


@dataclass
class _Flight(Generic[T]):
    """One running producer, what it has yielded so far and who is listening."""

    items: list[T] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    waiters: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    began: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None
    group: str = ""
    label: str = ""
    started_at: float = field(default_factory=time.monotonic)

    def publish(self) -> None:
        if not self.began.done():
            self.began.set_result(None)
        self.changed.set()
        self.changed = asyncio.Event()


class MergedStream(Generic[T]):
    """One waiter's view of a flight: every item from the first, then the live ones.

    Use it as `async with`: leaving the block (normally, by an exception or by cancellation)
    is what tells the merger this waiter is gone."""

    def __init__(self, merger: RequestMerger[T], key: str, flight: _Flight[T], leader: bool) -> None:
        self.leader = leader
        self._merger = merger
        self._key = key
        self._flight = flight
        self._left = False

    async def __aenter__(self) -> MergedStream[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.leave()

    async def __aiter__(self) -> AsyncIterator[T]:
        flight, position = self._flight, 0
        while True:
            if position < len(flight.items):
                position += 1
                yield flight.items[position - 1]
            elif flight.done:
                if flight.error is not None:
                    raise flight.error
                return
            else:
                await flight.changed.wait()

    @property
    def began(self) -> asyncio.Future[None]:
        """Done once the flight has its first item, or has ended: what a cache lookup racing
        the generation waits for."""
        return self._flight.began

    @property
    def started_at(self) -> float:
        """When the flight started (time.monotonic)."""
        return self._flight.started_at

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._merger._leave(self._key, self._flight)


@dataclass(frozen=True)
class MergerFigures:
    leaders: int  # generations started: every one is a flight, if only of its own request
    merged: int  # requests that joined an identical one's flight
    merged_paraphrases: int  # requests that joined the flight of a question they paraphrase
    cancelled: int  # producers stopped because every waiter left (the turn went, or a hit came)
    in_flight: int


class RequestMerger(Generic[T]):
    """Event loop only."""

    def __init__(self) -> None:
        self._flights: dict[str, _Flight[T]] = {}
        self._leaders = self._merged = self._merged_paraphrases = self._cancelled = 0

    def __contains__(self, key: str) -> bool:
        return key in self._flights

    def run(self, key: str, producer: Producer[T], *, group: str = "", label: str = "") -> MergedStream[T]:
        """Join the flight for `key`, starting `producer` if there is none. Call from the event loop."""
        flight = self._flights.get(key)
        if flight is not None:
            self._merged += 1
            return self._board(key, flight, leader=False)
        flight = self._flights[key] = _Flight(group=group, label=label)
        flight.task = asyncio.create_task(self._drive(key, flight, producer))
        self._leaders += 1
        return self._board(key, flight, leader=True)

    def running(self, group: str, started_since: float, started_before: float) -> list[tuple[str, str]]:
        """(key, label) of the flights of `group` started from `started_since` up to, not
        including, `started_before` (time.monotonic)."""
        return [
            (key, flight.label)
            for key, flight in self._flights.items()
            if flight.group == group and started_since <= flight.started_at < started_before
        ]

    def join(self, key: str) -> MergedStream[T] | None:
        """Join the flight for `key` as a paraphrase of its question; None if it has ended."""
        flight = self._flights.get(key)
        if flight is None:
            return None
        self._merged_paraphrases += 1
        return self._board(key, flight, leader=False)

    def figures(self) -> MergerFigures:
        return MergerFigures(self._leaders, self._merged, self._merged_paraphrases, self._cancelled, len(self._flights))

    def _board(self, key: str, flight: _Flight[T], *, leader: bool) -> MergedStream[T]:
        flight.waiters += 1
        return MergedStream(self, key, flight, leader)

    async def _drive(self, key: str, flight: _Flight[T], producer: Producer[T]) -> None:
        try:
            async for item in producer():
                flight.items.append(item)
                flight.publish()
        except asyncio.CancelledError:
            flight.error = asyncio.CancelledError("every waiter left")
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every waiter, who re-raises it
            flight.error = exc
        finally:
            flight.done = True
            flight.publish()
            self._forget(key, flight)

    def _leave(self, key: str, flight: _Flight[T]) -> None:
        flight.waiters -= 1
        assert flight.waiters >= 0
        if flight.waiters == 0 and not flight.done:
            assert flight.task is not None
            flight.task.cancel()
            self._cancelled += 1
            # Forget it now, not when the task ends: a request arriving meanwhile starts afresh.
            self._forget(key, flight)

    def _forget(self, key: str, flight: _Flight[T]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
