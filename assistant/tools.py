"""The built-in tools the Feishu bot lets the model call: the time, arithmetic, the asker's
memories, reminders, and Feishu documents.

`BuiltinTools.run` answers every call with text for the model: a mistake of the model's (a tool
that does not exist, arguments off the schema, an expression it cannot compute, a time it cannot
read, a document it cannot open) comes back as "error: ...", which the model can read and act on,
and changes nothing."""

from __future__ import annotations

import ast
import json
import logging
import math
import operator
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from assistant.memory import MemoryRefused, MemoryStore, owner_of
from assistant.reminders import ReminderError, Reminders, Target
from assistant.when import TimeZoneOf, UnparsedTime, parse_when, users_time_zone
from chat import Conversation
from chat.tool_calls import ToolCall
from settings import AssistantSettings

log = logging.getLogger(__name__)

MAX_RESULT_CHARS = 4000
MAX_EXPRESSION_CHARS = 200
# `**` is the one operator that can take the loop's time: 9**9**9 has 370 million digits.
MAX_EXPONENT = 1000
MAX_POWER_BITS = 10_000
MAX_ROUND_DIGITS = 100

DocReader = Callable[[str], Awaitable[str]]  # document_id -> the document's plain text

_DOC_LINK = re.compile(
    r"^https?://(?:[A-Za-z0-9-]+\.)+(?:feishu\.cn|larksuite\.com)/docx/(?P<id>[A-Za-z0-9]{20,40})(?:[/?#].*)?$"
)
_DOC_ID = re.compile(r"^[A-Za-z0-9]{20,40}$")

Number = int | float

_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _round(number: Number, digits: Number | None = None) -> Number:
    # round(5, -10**9) computes 10**(10**9) first.
    if digits is not None and abs(digits) > MAX_ROUND_DIGITS:
        raise ToolError(f"round to at most {MAX_ROUND_DIGITS} digits")
    return round(number, digits)  # type: ignore[arg-type]  # a float `digits` raises TypeError, as it should


_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


class ToolError(Exception):
    """A call the tool cannot do; the message is for the model."""


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    parameters: Mapping[str, str]  # argument -> what it is; every argument is a string
    required: tuple[str, ...]
    run: Callable[[dict[str, str], Conversation], Awaitable[str]]

    def definition(self) -> dict[str, Any]:
        properties = {name: {"type": "string", "description": text} for name, text in self.parameters.items()}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": list(self.required),
                    "additionalProperties": False,
                },
            },
        }

    def arguments(self, text: str) -> dict[str, str]:
        try:
            arguments = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ToolError(f"the arguments are not JSON ({exc})") from None
        if not isinstance(arguments, dict):
            raise ToolError("the arguments must be a JSON object")
        unknown = sorted(set(arguments) - set(self.parameters))
        if unknown:
            raise ToolError(f"{self.name} takes no argument {unknown[0]!r}; it takes {', '.join(self.parameters)}")
        missing = [name for name in self.required if name not in arguments]
        if missing:
            raise ToolError(f"{self.name} needs the argument {missing[0]!r}")
        not_text = [name for name, value in arguments.items() if not isinstance(value, str)]
        if not_text:
            raise ToolError(f"the argument {not_text[0]!r} must be a string")
        return arguments


class BuiltinTools:
    """The tools on offer: the memory tools only with a `memory`, the document tool only with a
    `read_doc`. `definitions` are their OpenAI function definitions."""

    def __init__(
        self,
        memory: MemoryStore | None,
        reminders: Reminders,
        settings: AssistantSettings,
        read_doc: DocReader | None,
        *,
        time_zone_of: TimeZoneOf | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._memory = memory
        self._time_zone_of = time_zone_of
        self._reminders = reminders
        self._settings = settings
        self._read_doc = read_doc
        self._now = now
        tools = [
            _Tool(
                "current_time",
                "The current date, time and weekday.",
                {"timezone": "an IANA time zone such as Europe/London; the asker's own if not given"},
                (),
                self._current_time,
            ),
            _Tool(
                "calculate",
                "Compute an arithmetic expression: numbers, + - * / // % **, parentheses, "
                "sqrt log exp sin cos tan abs round min max, pi, e.",
                {"expression": "e.g. (3 + 4) * sqrt(2)"},
                ("expression",),
                self._calculate,
            ),
            _Tool(
                "set_reminder",
                "Remind the user in this chat at a time, once or on a schedule.",
                {
                    "when": "e.g. 'in 2 hours', 'tomorrow at 9am', 'every weekday at 10:00', '明天下午3点'",
                    "text": "what to remind of",
                },
                ("when", "text"),
                self._set_reminder,
            ),
        ]
        if memory is not None:
            tools += [
                _Tool(
                    "search_memory",
                    "Search the facts the user asked you to remember.",
                    {"query": "what to look for, e.g. 'my desk'"},
                    ("query",),
                    self._search_memory,
                ),
                _Tool(
                    "save_memory",
                    "Remember a fact about the user for later conversations.",
                    {"fact": "the fact, e.g. 'my desk is 4F-12'"},
                    ("fact",),
                    self._save_memory,
                ),
            ]
        if read_doc is not None:
            tools.append(
                _Tool(
                    "read_feishu_doc",
                    "Read the text of a Feishu (Lark) document.",
                    {"url": "the document's link, https://<tenant>.feishu.cn/docx/<id>, or its id"},
                    ("url",),
                    self._read_feishu_doc,
                )
            )
        self._tools = {tool.name: tool for tool in tools}
        self.definitions: tuple[dict[str, Any], ...] = tuple(tool.definition() for tool in tools)

    async def run(self, call: ToolCall, conversation: Conversation) -> str:
        """The tool's result for the model, at most MAX_RESULT_CHARS characters."""
        tool = self._tools.get(call.name)
        if tool is None:
            return _capped(f"error: there is no tool {call.name!r}; the tools are {', '.join(self._tools)}")
        try:
            return _capped(await tool.run(tool.arguments(call.arguments), conversation))
        except ToolError as exc:
            return _capped(f"error: {exc}")

    async def _current_time(self, arguments: dict[str, str], conversation: Conversation) -> str:
        asker = await users_time_zone(self._time_zone_of, conversation.user_id, self._settings.time_zone)
        zone = arguments.get("timezone") or asker
        try:
            local = self._now().astimezone(ZoneInfo(zone))
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"{zone!r} is not an IANA time zone, e.g. Asia/Shanghai") from None
        return f"{local:%Y-%m-%d %H:%M %A} ({zone})"

    async def _calculate(self, arguments: dict[str, str], _: Conversation) -> str:
        return calculate(arguments["expression"])

    async def _search_memory(self, arguments: dict[str, str], conversation: Conversation) -> str:
        assert self._memory is not None, "offered only with a memory"
        memories = await self._memory.recall(owner_of(conversation), arguments["query"])
        return "\n".join(memories) or "nothing remembered about that"

    async def _save_memory(self, arguments: dict[str, str], conversation: Conversation) -> str:
        assert self._memory is not None, "offered only with a memory"
        try:
            record = await self._memory.save(owner_of(conversation), arguments["fact"])
        except MemoryRefused as exc:
            raise ToolError(str(exc)) from None
        return f"saved (#{record.number})"

    async def _set_reminder(self, arguments: dict[str, str], conversation: Conversation) -> str:
        if conversation.user_id is None:
            raise ToolError("reminders belong to a person, and this conversation has none")
        if not arguments["text"].strip():
            raise ToolError("say what to remind of in 'text'")
        phrase = f"{arguments['when']} {arguments['text']}"
        try:
            zone = await users_time_zone(self._time_zone_of, conversation.user_id, self._settings.time_zone)
            when = parse_when(phrase, now=self._now(), timezone=zone)
            reminder = await self._reminders.add("remind", Target.of(conversation), when)
        except (UnparsedTime, ReminderError) as exc:
            raise ToolError(str(exc)) from None
        return f"reminder set (#{reminder.number}), {reminder.description}: {reminder.text}"

    async def _read_feishu_doc(self, arguments: dict[str, str], _: Conversation) -> str:
        assert self._read_doc is not None, "offered only with a reader"
        url = arguments["url"].strip()
        link = _DOC_LINK.match(url)
        if link is None and _DOC_ID.match(url) is None:
            raise ToolError("that is not a Feishu document link: give https://<tenant>.feishu.cn/docx/<id>")
        document_id = url if link is None else link["id"]
        try:
            text = await self._read_doc(document_id)
        except Exception as exc:  # noqa: BLE001 - the bot's reader: permission, missing document, network
            log.warning("document %s could not be read: %s", document_id, exc)
            raise ToolError(f"the document could not be read ({exc})") from None
        return text.strip() or "the document is empty"


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text; raises ToolError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a null character
        raise ToolError(f"{expression!r} is not an arithmetic expression") from None
    try:
        value = _value(tree.body)
        if isinstance(value, int):
            return str(value)  # past 4,300 digits, a ValueError
    except (ArithmeticError, ValueError, TypeError) as exc:  # 1/0, sqrt(-1), exp(1000), round(1, 2, 3)
        raise ToolError(f"cannot compute {expression!r}: {exc}") from None
    if not math.isfinite(value):
        raise ToolError(f"{expression!r} has no finite value")
    return f"{value:.15g}"


def _value(node: ast.expr) -> Number:
    match node:
        case ast.Constant(value=bool()):
            raise ToolError("only numbers are allowed")
        case ast.Constant(value=int() | float() as number):
            return number
        case ast.Name(id=name) if name in _CONSTANTS:
            return _CONSTANTS[name]
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_value(operand)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return _value(operand)
        case ast.BinOp(left=left, op=ast.Pow(), right=right):
            return _power(_value(left), _value(right))
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPERATORS:
            return _OPERATORS[type(op)](_value(left), _value(right))
        case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in _FUNCTIONS:
            return _FUNCTIONS[name](*(_value(arg) for arg in args))
        case ast.Name(id=name) | ast.Call(func=ast.Name(id=name)) if name not in _FUNCTIONS:
            raise ToolError(f"unknown name {name!r}; known: {', '.join([*_FUNCTIONS, *_CONSTANTS])}")
    raise ToolError(f"{ast.unparse(node)!r} is not allowed: only numbers, + - * / // % **, and the math functions")


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"an exponent may be at most {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and abs(base).bit_length() * exponent > MAX_POWER_BITS:
        raise ToolError("that power is too large")
    power = base**exponent
    if isinstance(power, complex):  # (-8) ** 0.5
        raise ToolError("the result is not a real number")
    return power


def _capped(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    marker = f"\n… (cut at {MAX_RESULT_CHARS} characters)"
    return text[: MAX_RESULT_CHARS - len(marker)] + marker
