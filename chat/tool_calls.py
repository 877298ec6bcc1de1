"""Tool calls (OpenAI function calling) in the format Qwen3 and Hermes-style templates teach the
model: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` inside the reply's text.

`ToolCallStream` reads a reply as it streams: text before a tag is content at once, text that may
be the start of a tag waits only while it may be one, and a call comes out when its closing tag
arrives, or at the end if the model stopped before the closing tag with the JSON complete. What is
not a call (JSON that does not parse, or is not an object with a name and an arguments object)
stays content, tags and all, as vLLM's hermes parser keeps it. Content is the text outside the
calls, without whitespace at either end. `parse` reads a complete reply the same way."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chat.turns import lone_surrogate_at
from engine import ChatFormat
from engine.chat_format import NoToolSupport

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=new_call_id)

    def for_template(self) -> dict[str, Any]:
        """The call as chat templates take it: its arguments an object, unless they are not one."""
        try:
            arguments = json.loads(self.arguments)
        except ValueError:
            arguments = None
        return {
            "type": "function",
            "function": {"name": self.name, "arguments": arguments if isinstance(arguments, dict) else self.arguments},
        }


@dataclass(frozen=True)
class ToolUse:
    """The functions a request offers the model (OpenAI `tools`, as the template renders them) and
    how it may use them (`tool_choice`): "none" offers none; "required" starts the reply with a
    call, of `function` when one is named."""

    definitions: tuple[Mapping[str, Any], ...]
    choice: Literal["none", "auto", "required"] = "auto"
    function: str | None = None

    @property
    def offered(self) -> tuple[Mapping[str, Any], ...]:
        return () if self.choice == "none" else self.definitions

    def prefill(self, chat_format: ChatFormat) -> str:
        """What the reply starts with, before the model writes a token."""
        return chat_format.tool_call_opening(self.function) if self.choice == "required" else ""


def system_with_tools(chat_format: ChatFormat, definitions: Sequence[Mapping[str, Any]]) -> Callable[[str], str] | None:
    """How a system prompt offers the model `definitions`; None when its template writes no tools."""
    try:
        chat_format.tools_system("", definitions)
    except NoToolSupport:
        return None
    return lambda system: chat_format.tools_system(system, definitions)


@dataclass(frozen=True)
class ParsedReply:
    content: str
    calls: list[ToolCall]


def parse(text: str) -> ParsedReply:
    stream = ToolCallStream()
    parts = [*stream.feed(text), *stream.finish()]
    return ParsedReply(
        "".join(part for part in parts if isinstance(part, str)), [part for part in parts if isinstance(part, ToolCall)]
    )


class ToolCallStream:
    """Fed a reply's text as it comes; gives back content pieces and calls as soon as they are known."""

    def __init__(self) -> None:
        self._pending = ""  # what is not given back yet: a possible start of a tag, or a call's JSON so far
        self._in_call = False
        self._space = ""  # whitespace after the content so far: given back only if more content follows
        self._started = False  # content given back: whitespace before any is dropped

    def feed(self, text: str) -> list[str | ToolCall]:
        self._pending += text
        parts: list[str | ToolCall] = []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    return parts
                self._end_call(parts, self._pending[:end], CLOSE)
                self._pending = self._pending[end + len(CLOSE) :]
                continue
            start = self._pending.find(OPEN)
            if start < 0:
                held = len(self._pending) - _tag_start(self._pending)
                self._content(parts, self._pending[:held])
                self._pending = self._pending[held:]
                return parts
            self._content(parts, self._pending[:start])
            self._pending = self._pending[start + len(OPEN) :]
            self._in_call = True

    def finish(self) -> list[str | ToolCall]:
        """What is left once the reply is complete."""
        parts: list[str | ToolCall] = []
        if self._in_call:
            self._end_call(parts, self._pending, "")
        else:
            self._content(parts, self._pending)
        self._pending = ""
        return parts

    def _end_call(self, parts: list[str | ToolCall], body: str, closing: str) -> None:
        self._in_call = False
        call = _call(body)
        if call is None:
            self._content(parts, OPEN + body + closing)
        else:
            parts.append(call)

    def _content(self, parts: list[str | ToolCall], text: str) -> None:
        text = self._space + text if self._started else text.lstrip()
        visible = text.rstrip()
        self._space = text[len(visible) :]
        if visible:
            self._started = True
            parts.append(visible)


def _tag_start(text: str) -> int:
    """How many characters at the end of `text` may be the start of an opening tag."""
    return next((size for size in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:size])), 0)


def _call(body: str) -> ToolCall | None:
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json's limit (~1,000)
        return None
    if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)):
        return None
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    # JSON's "\ud800" decodes to a lone surrogate, which no encoder takes: such a call is text.
    if not call["name"] or lone_surrogate_at(call["name"] + arguments) is not None:
        return None
    return ToolCall(call["name"], arguments)
