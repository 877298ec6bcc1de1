"""A token bucket per user, for every door a person can ask through: the API and the chat page by
client address (web/limits.py), Feishu by open_id (bot/access.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MAX_TRACKED_USERS = 10_000
# A bucket refills completely within a minute; one untouched for longer is full.
FULL_AFTER_S = 60.0


class TokenBuckets:
    """`per_minute` requests a minute per user on average, bursts of as many; 0 turns the limit off."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, updated)

    def take(self, user: str) -> int:
        """Take one request from `user`'s bucket: 0, or nothing taken and the whole seconds until
        the next request is allowed."""
        if not self.per_minute:
            return 0
        now = self._clock()
        rate = self.per_minute / 60.0
        tokens, updated = self._buckets.get(user, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - updated) * rate)
        if tokens < 1.0:
            self._buckets[user] = (tokens, now)
            return math.ceil((1.0 - tokens) / rate)
        self._buckets[user] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_TRACKED_USERS:
            self._forget_idle(now)
        return 0

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that have refilled: forgetting them changes nothing."""
        self._buckets = {user: b for user, b in self._buckets.items() if now - b[1] < FULL_AFTER_S}
