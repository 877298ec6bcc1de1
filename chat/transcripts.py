"""OpenAI semantics: a client sends the whole conversation with every call. The session whose
messages are exactly the earlier ones continues, from its stored ids, so the prefix cache hits.
Sessions are found by the digest of their transcript, stored on the session's row
(`SessionStore`), so a conversation resent after a restart continues its session too.

A conversation with tools is `framed` first into the plain user and assistant messages the model
reads (the template's own texts for the tool list, the calls and the results), so sessions hold
and match it like any other; an assistant's calls count in a digest by name and arguments, so
the calls a client resends as the API returned them match the text the model wrote."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from chat.tool_calls import ToolCall, parse
from chat.turns import InvalidMessage, require_unicode
from engine import ChatFormat

ORDER = (
    "After an optional system message, messages must go user, assistant, user, ...; an assistant message "
    "with tool_calls is followed by the tool messages that answer them, then the assistant's next message"
)


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's
    tool_call_id: str | None = None  # a tool's: the call it answers


@dataclass(frozen=True)
class Transcript:
    """A conversation as a client sends it: a system prompt and the messages, the last one the
    question (a user's, or the results of the tools the assistant called)."""

    system_prompt: str
    messages: tuple[ChatMessage, ...]

    def validate(self) -> None:
        if not self.messages or self.messages[-1].role == "assistant":
            raise InvalidMessage("The last message must be the user's (or the tools' results).")
        require_unicode(self.system_prompt, "The system prompt")
        called: set[str] = set()  # the ids of the calls the latest assistant message made
        for index, message in enumerate(self.messages):
            previous = self.messages[index - 1] if index else None
            if not _may_follow(previous, message):
                raise InvalidMessage(f"{ORDER} (message {index} is the {message.role}'s).")
            if message.role == "tool" and message.tool_call_id not in called:
                raise InvalidMessage(f"Message {index} answers no tool call of the assistant message before it.")
            if message.role == "assistant":
                called = {call.id for call in message.tool_calls}
            require_unicode(message.content, f"Message {index}")

    def framed(self, chat_format: ChatFormat, tools: Sequence[Mapping[str, Any]] = ()) -> Transcript:
        """The conversation in the user and assistant messages the model reads: `tools` written
        into the system prompt, calls into the assistant's text, each run of tool results into
        one user message, all as the template writes them. Raises NoToolSupport if it does not."""
        system_prompt = chat_format.tools_system(self.system_prompt, tools) if tools else self.system_prompt
        messages: list[ChatMessage] = []
        for role, run in itertools.groupby(self.messages, key=lambda message: message.role):
            if role == "tool":
                messages.append(ChatMessage("user", chat_format.tool_results([message.content for message in run])))
            else:
                messages += (_calls_written(message, chat_format) for message in run)
        return Transcript(system_prompt, tuple(messages))

    @property
    def earlier(self) -> Transcript:
        """The conversation before the question."""
        return Transcript(self.system_prompt, self.messages[:-1])

    def digest(self) -> str:
        return transcript_digest(self.system_prompt, [(m.role, m.content) for m in self.messages])


def _calls_written(message: ChatMessage, chat_format: ChatFormat) -> ChatMessage:
    if not message.tool_calls:
        return message
    calls = [call.for_template() for call in message.tool_calls]
    return ChatMessage("assistant", chat_format.assistant_with_calls(message.content.strip(), calls))


def _may_follow(previous: ChatMessage | None, message: ChatMessage) -> bool:
    if previous is None:
        return message.role == "user"
    if message.role == "assistant":
        return previous.role != "assistant"
    if message.role == "user":
        return previous.role == "assistant" and not previous.tool_calls
    return previous.role == "tool" or bool(previous.tool_calls)


def transcript_digest(system_prompt: str, messages: Sequence[tuple[str, str]]) -> str:
    digest = hashlib.blake2b(system_prompt.encode(), digest_size=16)
    for role, content in messages:
        digest.update(f"\x00{role}\x00{_canonical(role, content)}".encode())
    return digest.hexdigest()


def _canonical(role: str, content: str) -> str:
    """A message as its digest reads it: stripped, and an assistant's calls by name and arguments."""
    if role != "assistant":
        return content.strip()
    reply = parse(content)
    return reply.content + "".join(f"\x00call\x00{call.name}\x00{call.arguments}" for call in reply.calls)
