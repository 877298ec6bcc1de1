"""A small in-memory map whose entries expire and whose size is bounded: what the bot remembers
for a while (user names, a chat's language), per process."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


@dataclass(frozen=True)
class _Entry(Generic[Value]):
    value: Value
    expires_at: float


class Recent(Generic[Key, Value]):
    """At most `capacity` entries, the least recently used dropped first; each lives `ttl_s`
    unless `put` says otherwise."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[Key, _Entry[Value]] = OrderedDict()

    def get(self, key: Key) -> Value | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: Key, value: Value, ttl_s: float | None = None) -> None:
        expires_at = self._clock() + (self._ttl_s if ttl_s is None else ttl_s)
        self._entries[key] = _Entry(value, expires_at)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
