"""Slash commands, answered by the bot itself: /help, /reset, /system, /stats."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from chat import ChatManager, Conversation

HELP = """I answer in private chats, and in groups when you @mention me or write in a thread I answered in.

/reset - start a new conversation (I forget what we said so far)
/system <prompt> - set this chat's system prompt; /system alone clears it
/stats - this chat's session, cache and engine figures
/help - this text"""

# "/usr/bin is gone" is a message, not a command: a command is a bare word after the slash.
COMMAND = re.compile(r"/(?P<name>[A-Za-z]+)(?:\s+(?P<argument>.*))?", re.DOTALL)


@dataclass(frozen=True)
class Command:
    name: str
    argument: str


def parse_command(text: str) -> Command | None:
    match = COMMAND.fullmatch(text.strip())
    if match is None:
        return None
    return Command(match["name"].lower(), (match["argument"] or "").strip())


class Commands:
    def __init__(self, chat_manager: ChatManager) -> None:
        self._chat_manager = chat_manager
        self._handlers: dict[str, Callable[[Conversation, str], Awaitable[str]]] = {
            "help": self._help,
            "reset": self._reset,
            "system": self._system,
            "stats": self._stats,
        }

    async def run(self, command: Command, conversation: Conversation) -> str:
        """The reply to `command`; an unknown command gets the help text."""
        handler = self._handlers.get(command.name, self._help)
        return await handler(conversation, command.argument)

    async def _help(self, _: Conversation, __: str) -> str:
        return HELP

    async def _reset(self, conversation: Conversation, _: str) -> str:
        await self._chat_manager.sessions.reset(conversation)
        return "Started a new conversation."

    async def _system(self, conversation: Conversation, prompt: str) -> str:
        await self._chat_manager.sessions.set_system_prompt(conversation, prompt or None)
        if not prompt:
            return "System prompt cleared; a new conversation starts with the default."
        return "System prompt set; a new conversation starts with it."

    async def _stats(self, conversation: Conversation, _: str) -> str:
        figures = self._chat_manager.figures()
        sections = {
            "This chat": dataclasses.asdict(await self._chat_manager.sessions.overview(conversation)),
            "Cache": dataclasses.asdict(figures.cache),
            "Engine": dataclasses.asdict(figures.engine),
        }
        return "\n\n".join(_format_section(title, values) for title, values in sections.items())


def _format_section(title: str, values: Mapping[str, object]) -> str:
    return "\n".join([f"{title}:", *(f"  {key}: {_format_value(value)}" for key, value in values.items())])


def _format_value(value: object) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {_format_nested(item)}" for key, item in value.items())
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _format_nested(value: object) -> str:
    return f"({_format_value(value)})" if isinstance(value, Mapping) else _format_value(value)
