"""Slash commands, answered by the bot itself without the model: the conversation (/help, /reset,
/system, /persona, /stats), long-term memory (/remember, /memory, /forget) and reminders (/remind,
/schedule, /reminders). They work with every model, the demo one included."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from assistant.memory import MemoryRefused, MemoryStore, owner_of
from assistant.reminders import Kind, Reminder, ReminderError, Reminders, Target
from assistant.when import TimeZoneOf, UnparsedTime, parse_when, users_time_zone
from chat import ChatManager, Conversation
from chat.sessions import Persona
from settings import AssistantSettings

HELP = """I answer in private chats, and in groups when you @mention me or write in a thread I answered in.

/reset - start a new conversation (I forget what we said so far, not what you asked me to remember)
/system <prompt> - set this chat's instructions; /system alone clears them
/persona <name>: <manner> - who I am in this chat; /persona off clears it
/remember <fact> - keep a fact about you for later conversations ("remember that ..." works too)
/memory - what I keep for you; /forget N or /forget all - drop it
/remind <when> <what> - e.g. /remind in 2h submit the report, /remind every weekday 9:00 standup
/schedule <when> <prompt> - I answer the prompt at that time here, e.g. /schedule daily 9:00 summarize yesterday
/reminders - your reminders here; /reminders cancel N - drop one
/stats - this chat's session, cache and engine figures
/help - this text"""

# "/usr/bin is gone" is a message, not a command: a command is a bare word after the slash.
COMMAND = re.compile(r"/(?P<name>[A-Za-z]+)(?:\s+(?P<argument>.*))?", re.DOTALL)
# "/persona Ada: calm and brief" or "/persona Ada - calm and brief"; a name alone is fine too.
PERSONA = re.compile(r"(?P<name>[^:：\-\n]{1,64}?)\s*(?:[:：\-]\s*(?P<manner>.+))?", re.DOTALL)
MAX_MANNER_CHARS = 1000


@dataclass(frozen=True)
class Command:
    name: str
    argument: str


def parse_command(text: str) -> Command | None:
    match = COMMAND.fullmatch(text.strip())
    if match is None:
        return None
    return Command(match["name"].lower(), (match["argument"] or "").strip())


Handler = Callable[[Conversation, str], Awaitable[str]]


class Commands:
    def __init__(
        self,
        chat_manager: ChatManager,
        memory: MemoryStore | None,
        reminders: Reminders,
        settings: AssistantSettings,
        *,
        time_zone_of: TimeZoneOf | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(ZoneInfo("UTC")),
    ) -> None:
        self._chat_manager = chat_manager
        self._time_zone_of = time_zone_of
        self._memory = memory
        self._reminders = reminders
        self._settings = settings
        self._now = now
        self._handlers: dict[str, Handler] = {
            "help": self._help,
            "reset": self._reset,
            "system": self._system,
            "persona": self._persona,
            "stats": self._stats,
            "remember": self.remember,
            "memory": self._memories,
            "forget": self._forget,
            "remind": self.remind,
            "schedule": self._schedule,
            "reminders": self._reminders_command,
        }

    async def run(self, command: Command, conversation: Conversation) -> str:
        """The reply to `command`; an unknown command gets the help text."""
        handler = self._handlers.get(command.name, self._help)
        return await handler(conversation, command.argument)

    # --- the conversation -------------------------------------------------------------------------

    async def _help(self, conversation: Conversation, _: str) -> str:
        persona = await self._chat_manager.sessions.persona(conversation)
        if persona is None:
            return HELP
        return f"Here I am {persona.name}. {persona.manner}".strip() + "\n\n" + HELP

    async def _reset(self, conversation: Conversation, _: str) -> str:
        await self._chat_manager.sessions.reset(conversation)
        return "Started a new conversation."

    async def _system(self, conversation: Conversation, prompt: str) -> str:
        await self._chat_manager.sessions.set_system_prompt(conversation, prompt or None)
        if not prompt:
            return "System prompt cleared; a new conversation starts with the default."
        return "System prompt set; a new conversation starts with it."

    async def _persona(self, conversation: Conversation, argument: str) -> str:
        sessions = self._chat_manager.sessions
        if not argument:
            persona = await sessions.persona(conversation)
            if persona is None:
                return "I have no persona here. Set one with `/persona Ada: calm, brief, a little dry`."
            return f"Here I am {persona.name}. {persona.manner}".strip()
        if argument.lower() in ("off", "clear", "none"):
            await sessions.set_persona(conversation, None)
            return "Persona cleared; a new conversation starts without it."
        match = PERSONA.fullmatch(argument)
        if match is None or len(match["manner"] or "") > MAX_MANNER_CHARS:
            return (
                "Say `/persona <name>: <manner>`: a name of at most 64 characters, "
                f"a manner of at most {MAX_MANNER_CHARS}."
            )
        persona = Persona(match["name"].strip(), (match["manner"] or "").strip())
        await sessions.set_persona(conversation, persona)
        return f"I am {persona.name} here now; a new conversation starts with it."

    async def _stats(self, conversation: Conversation, _: str) -> str:
        figures = self._chat_manager.figures()
        sections = {
            "This chat": dataclasses.asdict(await self._chat_manager.sessions.overview(conversation)),
            "Cache": dataclasses.asdict(figures.cache),
            "Engine": dataclasses.asdict(figures.engine),
        }
        return "\n\n".join(_format_section(title, values) for title, values in sections.items())

    # --- memory -----------------------------------------------------------------------------------

    async def remember(self, conversation: Conversation, fact: str) -> str:
        if self._memory is None:
            return MEMORY_OFF
        try:
            record = await self._memory.save(owner_of(conversation), fact)
        except MemoryRefused as exc:
            return str(exc)
        return f"I'll remember that (#{record.number}): {record.text}"

    async def _memories(self, conversation: Conversation, _: str) -> str:
        if self._memory is None:
            return MEMORY_OFF
        records = await self._memory.memories(owner_of(conversation))
        if not records:
            return "I keep nothing for you yet. Tell me with `/remember <fact>`."
        lines = [f"{record.number}. {record.text}" for record in records]
        return "What I keep for you:\n" + "\n".join(lines) + "\n\n`/forget N` drops one, `/forget all` every one."

    async def _forget(self, conversation: Conversation, argument: str) -> str:
        if self._memory is None:
            return MEMORY_OFF
        owner = owner_of(conversation)
        if argument.lower() == "all":
            count = await self._memory.forget_all(owner)
            return f"Forgotten: all {count} of what I kept for you." if count else "I kept nothing for you."
        if not argument.isascii() or not argument.isdigit() or len(argument) > 6:
            return "Say `/forget N` with a number from `/memory`, or `/forget all`."
        record = await self._memory.forget(owner, int(argument))
        if record is None:
            return f"There is no memory #{argument}; `/memory` lists them."
        return f"Forgotten: {record.text}"

    # --- reminders and scheduled prompts ----------------------------------------------------------

    async def remind(self, conversation: Conversation, phrase: str) -> str:
        return await self._add("remind", conversation, phrase)

    async def _schedule(self, conversation: Conversation, phrase: str) -> str:
        return await self._add("prompt", conversation, phrase)

    async def _add(self, kind: Kind, conversation: Conversation, phrase: str) -> str:
        try:
            zone = await users_time_zone(self._time_zone_of, conversation.user_id, self._settings.time_zone)
            when = parse_when(phrase, now=self._now(), timezone=zone)
            reminder = await self._reminders.add(kind, Target.of(conversation), when)
        except (UnparsedTime, ReminderError) as exc:
            return str(exc)
        if kind == "prompt":
            return f"Scheduled (#{reminder.number}), {reminder.description}: I'll answer “{reminder.text}” here."
        return f"OK (#{reminder.number}), {reminder.description}: {reminder.text}"

    async def _reminders_command(self, conversation: Conversation, argument: str) -> str:
        assert conversation.user_id is not None, "reminders belong to a person"
        words = argument.split()
        if words and words[0].lower() == "cancel":
            number = words[1] if len(words) == 2 else ""
            if not (number.isascii() and number.isdigit() and len(number) <= 6):
                return "Say `/reminders cancel N` with a number from `/reminders`."
            cancelled = await self._reminders.cancel(conversation.chat_id, conversation.user_id, int(number))
            if cancelled is None:
                return f"You have no reminder #{number} here; `/reminders` lists them."
            return f"Cancelled: {_describe(cancelled)}"
        reminders = await self._reminders.list(conversation.chat_id, conversation.user_id)
        if not reminders:
            return "You have no reminders here. Set one with `/remind in 2h submit the report`."
        lines = [f"{reminder.number}. {_describe(reminder)}" for reminder in reminders]
        return "Your reminders here:\n" + "\n".join(lines) + "\n\n`/reminders cancel N` drops one."


MEMORY_OFF = "Long-term memory is off on this bot (assistant.memory)."


def _describe(reminder: Reminder) -> str:
    what = f"answer “{reminder.text}”" if reminder.kind == "prompt" else reminder.text
    return f"{reminder.description}: {what}"


def _format_section(title: str, values: Mapping[str, object]) -> str:
    return "\n".join([f"{title}:", *(f"  {key}: {_format_value(value)}" for key, value in values.items())])


def _format_value(value: object) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {_format_nested(item)}" for key, item in value.items())
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _format_nested(value: object) -> str:
    return f"({_format_value(value)})" if isinstance(value, Mapping) else _format_value(value)
