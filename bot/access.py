"""Who the bot answers, and how often.

Private chats: anyone in the tenant (`feishu.dm_policy: open`), or only `allowed_users` and
`admins` (`allowlist`). Groups: those in `allowed_chats` (empty: every group the bot is in). In a
group, /system, /reset, /persona and /schedule change the conversation of everyone in it, so only `admins` may run
them (empty: every member); in a private chat the user owns the conversation. Then a token bucket
per user (`feishu.requests_per_minute`). A refusal is one reply: no model call, no engine request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.card_actions import NEW_SESSION, CardClick
from bot.commands import parse_command
from bot.policy import IncomingMessage
from chat.rate_limits import TokenBuckets
from settings import FeishuSettings

NOT_OPEN = "This bot is not open to you here; ask an admin to add you."
ADMINS_ONLY = "Only an admin of this bot can run /{command} in a group; ask one of them."
TOO_FAST = "You are sending messages faster than I can answer; try again in {wait_s} s."
GROUP_ADMIN_COMMANDS = frozenset({"system", "reset", "persona", "schedule"})


@dataclass(frozen=True)
class Asking:
    """What the rules look at: who asks, where, and the command if the message is one."""

    open_id: str
    chat_id: str
    private: bool
    command: str | None

    @classmethod
    def of(cls, message: IncomingMessage) -> Asking:
        command = None if message.text is None else parse_command(message.text)
        return cls(
            open_id=message.sender_open_id,
            chat_id=message.chat_id,
            private=message.chat_type == "p2p",
            command=None if command is None else command.name,
        )

    @classmethod
    def of_click(cls, click: CardClick) -> Asking:
        """A click on a card's buttons: "New session" is /reset; "Regenerate" asks again."""
        return cls(
            open_id=click.operator_open_id,
            chat_id=click.chat_id,
            private=click.chat_type == "p2p",
            command="reset" if click.button.action == NEW_SESSION else None,
        )


@dataclass(frozen=True)
class Refusal:
    reason: str
    """For the log: names nobody."""
    text: str
    """The reply."""


@dataclass(frozen=True)
class AccessRules:
    dm_allowlist: bool
    allowed_users: frozenset[str]
    allowed_chats: frozenset[str]
    admins: frozenset[str]

    @classmethod
    def from_settings(cls, settings: FeishuSettings) -> AccessRules:
        return cls(
            dm_allowlist=settings.dm_policy == "allowlist",
            allowed_users=frozenset(settings.allowed_users),
            allowed_chats=frozenset(settings.allowed_chats),
            admins=frozenset(settings.admins),
        )

    def refusal(self, asking: Asking) -> Refusal | None:
        """Why `asking` is not answered, or None."""
        if asking.private:
            return self._private_refusal(asking)
        return self._group_refusal(asking)

    def _private_refusal(self, asking: Asking) -> Refusal | None:
        if not self.dm_allowlist or asking.open_id in self.allowed_users | self.admins:
            return None
        return Refusal("the sender is not on the private-chat allowlist", NOT_OPEN)

    def _group_refusal(self, asking: Asking) -> Refusal | None:
        if self.allowed_chats and asking.chat_id not in self.allowed_chats:
            return Refusal("the group is not allowed", NOT_OPEN)
        if asking.command in GROUP_ADMIN_COMMANDS and self.admins and asking.open_id not in self.admins:
            return Refusal(f"/{asking.command} in a group is for admins", ADMINS_ONLY.format(command=asking.command))
        return None


class Gate:
    """The access rules first, then the sender's quota."""

    def __init__(self, rules: AccessRules, quota: TokenBuckets) -> None:
        self._rules = rules
        self._quota = quota

    @classmethod
    def from_settings(cls, settings: FeishuSettings, clock: Callable[[], float] = time.monotonic) -> Gate:
        return cls(AccessRules.from_settings(settings), TokenBuckets(settings.requests_per_minute, clock))

    def refusal(self, asking: Asking) -> Refusal | None:
        """Why `asking` is not answered, or None; an answered message takes from its sender's quota."""
        refusal = self._rules.refusal(asking)
        if refusal is not None:
            return refusal
        wait_s = self._quota.take(asking.open_id)
        if wait_s:
            return Refusal(f"over the quota for {wait_s} s", TOO_FAST.format(wait_s=wait_s))
        return None
