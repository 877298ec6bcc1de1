"""Who said it: a Feishu sender's display name, read through the contact API and remembered.

A name that cannot be read (the app lacks contact:user.base:readonly, the user is outside the
app's contact range, Feishu fails) becomes a short stand-in made from the id, the same each time,
so the model still tells people apart. The bot's own messages are the assistant's.
"""

from __future__ import annotations

import logging

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


class SenderNames:
    def __init__(self, api: FeishuApi, *, app_id: str) -> None:
        self._api = api
        self._app_id = app_id
        self._names: Recent[str, str] = Recent(NAMES_KEPT, NAME_TTL_S)

    async def sender(self, sender_id: str, sender_type: str) -> str:
        """The name of a message's sender: a user by open_id, an app by app_id."""
        if sender_type != "app":
            return await self.user(sender_id)
        return ASSISTANT if sender_id == self._app_id else stand_in("app", sender_id)

    async def user(self, open_id: str) -> str:
        known = self._names.get(open_id)
        if known is not None:
            return known
        name = await self._read(open_id)
        if name:
            self._names.put(open_id, name)
            return name
        fallback = stand_in("user", open_id)
        self._names.put(open_id, fallback, FAILURE_TTL_S)
        return fallback

    async def _read(self, open_id: str) -> str:
        try:
            return await self._api.user_name(open_id)
        except Exception as exc:  # noqa: BLE001 - permission, network or server: the stand-in serves the same
            log.info("feishu: a sender's name cannot be read (%s); a stand-in is used", exc)
            return ""


def stand_in(kind: str, sender_id: str) -> str:
    return f"{kind}-{sender_id[-STAND_IN_CHARS:]}"
