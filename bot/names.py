"""Who said it: a Feishu sender's display name (and time zone), read through the contact API and
remembered.

A name that cannot be read (the app lacks contact:user.base:readonly, the user is outside the
app's contact range, Feishu fails) becomes a short stand-in made from the id, the same each time,
so the model still tells people apart. The bot's own messages are the assistant's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bot.feishu_api import FeishuApi
from bot.recent import Recent

log = logging.getLogger(__name__)

ASSISTANT = "Assistant"
NAMES_KEPT = 4096
NAME_TTL_S = 3600.0
# A failure is asked again sooner, so a passing error does not rename someone for an hour; yet
# not at each message, for an app without the scope fails for every user.
FAILURE_TTL_S = 300.0
STAND_IN_CHARS = 6


@dataclass(frozen=True)
class Person:
    name: str
    time_zone: str | None  # as the user set it in Feishu; None when it cannot be read


class SenderNames:
    def __init__(self, api: FeishuApi, *, app_id: str) -> None:
        self._api = api
        self._app_id = app_id
        self._people: Recent[str, Person] = Recent(NAMES_KEPT, NAME_TTL_S)

    async def sender(self, sender_id: str, sender_type: str) -> str:
        """The name of a message's sender: a user by open_id, an app by app_id."""
        if sender_type != "app":
            return await self.user(sender_id)
        return ASSISTANT if sender_id == self._app_id else stand_in("app", sender_id)

    async def user(self, open_id: str) -> str:
        return (await self.person(open_id)).name

    async def time_zone(self, open_id: str) -> str | None:
        """The time zone the user set in Feishu, if it can be read."""
        return (await self.person(open_id)).time_zone

    async def person(self, open_id: str) -> Person:
        known = self._people.get(open_id)
        if known is not None:
            return known
        person = await self._read(open_id)
        if person is not None and person.name:
            self._people.put(open_id, person)
            return person
        fallback = Person(stand_in("user", open_id), person.time_zone if person else None)
        self._people.put(open_id, fallback, FAILURE_TTL_S)
        return fallback

    async def _read(self, open_id: str) -> Person | None:
        try:
            user = await self._api.user(open_id)
        except Exception as exc:  # noqa: BLE001 - permission, network or server: the stand-in serves the same
            log.info("feishu: a sender's name cannot be read (%s); a stand-in is used", exc)
            return None
        return Person(user.name or "", user.time_zone or None)


def stand_in(kind: str, sender_id: str) -> str:
    return f"{kind}-{sender_id[-STAND_IN_CHARS:]}"
