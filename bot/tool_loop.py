"""The model's answer with its tools: while a reply calls tools, they run and their results go
back to the model as the next message of the session, until it answers without a call, or the
step or time cap ends it. The calls and results are stored turns of the session, so the console's
session view shows them; what the user sees is the text around the calls, in one card."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence

from assistant.tools import BuiltinTools
from chat import ChatManager, Conversation, InvalidMessage, Turn
from chat.tool_calls import ToolCall, ToolCallStream, system_with_tools
from settings import AssistantSettings

log = logging.getLogger(__name__)

STOPPED = "(I stopped using tools here: {why}.)"


class ToolLoop:
    def __init__(self, chat_manager: ChatManager, tools: BuiltinTools, settings: AssistantSettings) -> None:
        self.chat_manager = chat_manager
        self.chat_format = chat_manager.chat_format
        self.tools = tools
        self.max_steps = settings.tool_max_steps
        self.max_seconds = settings.tool_max_seconds

    @classmethod
    def offered(cls, chat_manager: ChatManager, tools: BuiltinTools, settings: AssistantSettings) -> ToolLoop | None:
        """The loop, with the Feishu sessions' system prompt offering the tools from now on; None
        when the settings or the model's chat template do not allow tools."""
        if settings.tools is False or (settings.tools == "auto" and chat_manager.engine.is_demo_model):
            return None
        offer = system_with_tools(chat_manager.chat_format, tools.definitions)
        if offer is None:
            log.info("the model's chat template writes no tools: the Feishu bot answers without them")
            return None
        chat_manager.sessions.tools_prompt["feishu"] = offer
        return cls(chat_manager, tools, settings)

    async def answer(self, conversation: Conversation, first: Turn) -> AsyncIterator[str]:
        """The visible text of `first` (a turn of a session whose system prompt offers the tools)
        and of every turn after it that the tools' results start."""
        deadline = time.monotonic() + self.max_seconds
        turn, shown = first, False
        for step in range(self.max_steps + 1):
            calls: list[ToolCall] = []
            first_piece = True
            async for text in _visible(turn, calls):
                yield _after(shown, text) if first_piece else text
                first_piece, shown = False, True
            if not calls:
                return
            if step == self.max_steps:
                why = f"{self.max_steps} rounds of calls is the most I make for one message"
                yield _after(shown, STOPPED.format(why=why))
                return
            if time.monotonic() > deadline:
                yield _after(shown, STOPPED.format(why=f"this message has taken over {self.max_seconds:.0f} s"))
                return
            results = [await self._run(call, conversation) for call in calls]
            try:
                # Private: what the tools said now (the time, a document) is no answer for the cache.
                turn = self.chat_manager.turn(conversation, self.chat_format.tool_results(results), private=True)
            except InvalidMessage:
                yield _after(shown, STOPPED.format(why="the tools' results are too long for one message"))
                return

    async def _run(self, call: ToolCall, conversation: Conversation) -> str:
        started = time.perf_counter()
        result = await self.tools.run(call, conversation)
        # The tool's name only: its arguments and result are the user's words.
        elapsed_ms = (time.perf_counter() - started) * 1000
        log.info("tool %s ran for %s:%s in %.0f ms", call.name, conversation.channel, conversation.chat_id, elapsed_ms)
        return result


async def _visible(turn: Turn, calls: list[ToolCall]) -> AsyncIterator[str]:
    """The turn's text outside its tool calls, as it streams; its calls are added to `calls`."""
    stream = ToolCallStream()
    async for piece in turn:
        for text in _texts(stream.feed(piece), calls):
            yield text
    for text in _texts(stream.finish(), calls):
        yield text


def _after(shown: bool, text: str) -> str:
    """`text` as a new paragraph when something was shown before it."""
    return f"\n\n{text}" if shown else text


def _texts(parts: Sequence[str | ToolCall], calls: list[ToolCall]) -> list[str]:
    calls.extend(part for part in parts if isinstance(part, ToolCall))
    return [part for part in parts if isinstance(part, str)]
