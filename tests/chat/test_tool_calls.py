"""Tool calls: the parser of the model's `<tool_call>` blocks, complete and streamed; transcripts
with calls and results framed through the template; such turns in the pipeline (the demo model)."""

from __future__ import annotations

import asyncio
import re

import pytest

from cache.levels import CacheLevel
from chat import ChatMessage, InvalidMessage, Transcript
from chat.tool_calls import ToolCall, ToolCallStream, ToolUse, parse
from chat.transcripts import transcript_digest
from storage import Database, MessageRepository
from tests.chat.chat_support import ManagerFactory

CALL_A = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "巴黎"}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
WEATHER = ("get_weather", '{"city": "巴黎"}')
PING = ("ping", "{}")

# text -> (content, [(name, arguments)])
CASES: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "plain": ("Just text, <b>no</b> calls.", "Just text, <b>no</b> calls.", []),
    "one call": (CALL_A, "", [WEATHER]),
    "text around": (f"Let me check.\n{CALL_A}\nDone soon.", "Let me check.\n\nDone soon.", [WEATHER]),
    "several": (f"{CALL_A}\n{CALL_B}", "", [WEATHER, PING]),
    "compact": ('<tool_call>{"name":"ping","arguments":{}}</tool_call>', "", [PING]),
    "invalid json": (
        f'<tool_call>\n{{"name": "ping", "arguments": {{}}\n</tool_call>\n{CALL_B}',
        '<tool_call>\n{"name": "ping", "arguments": {}\n</tool_call>',
        [PING],
    ),
    "not a call": (
        '<tool_call>{"name": "ping", "arguments": "none"}</tool_call>',
        '<tool_call>{"name": "ping", "arguments": "none"}</tool_call>',
        [],
    ),
    "unclosed, complete": (f"Sure. {CALL_B[: -len('</tool_call>')]}", "Sure.", [PING]),
    "unclosed, cut": ('<tool_call>\n{"name": "ping", "argu', '<tool_call>\n{"name": "ping", "argu', []),
    "a tag's start at the end": ("The answer is <tool_c", "The answer is <tool_c", []),
    "a closing tag alone": ("a </tool_call> b", "a </tool_call> b", []),
    "whitespace": (f"\n  {CALL_B}  \n\n", "", [PING]),
}


def calls_of(parts: list[str | ToolCall]) -> list[tuple[str, str]]:
    return [(part.name, part.arguments) for part in parts if isinstance(part, ToolCall)]


def content_of(parts: list[str | ToolCall]) -> str:
    return "".join(part for part in parts if isinstance(part, str))


@pytest.mark.parametrize(("text", "content", "calls"), CASES.values(), ids=CASES.keys())
def test_a_complete_reply_is_parsed(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    reply = parse(text)
    assert reply.content == content
    assert [(call.name, call.arguments) for call in reply.calls] == calls
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in reply.calls)
    assert len({call.id for call in reply.calls}) == len(calls)


@pytest.mark.parametrize(("text", "content", "calls"), CASES.values(), ids=CASES.keys())
def test_a_streamed_reply_split_anywhere_parses_the_same(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    for cut in range(len(text) + 1):
        stream = ToolCallStream()
        parts = [*stream.feed(text[:cut]), *stream.feed(text[cut:]), *stream.finish()]
        assert (content_of(parts), calls_of(parts)) == (content, calls), cut
    stream = ToolCallStream()
    parts = [part for character in text for part in stream.feed(character)] + stream.finish()
    assert (content_of(parts), calls_of(parts)) == (content, calls)


def test_content_streams_at_once_and_a_possible_tag_waits_only_while_it_may_be_one() -> None:
    stream = ToolCallStream()
    assert stream.feed("Hello <tool") == ["Hello"]
    assert stream.feed("box> there <") == [" <toolbox> there"]
    assert stream.feed("tool_call>\n{") == []
    assert stream.feed('"name": "ping", "arguments": {}}\n</tool_') == []
    [call] = stream.feed("call>")  # the call as soon as its closing tag is complete
    assert isinstance(call, ToolCall) and (call.name, call.arguments) == PING
    assert stream.feed("\n") == []  # whitespace waits for more content, which may never come
    assert stream.finish() == []


TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
)
QUESTION = ChatMessage("user", "What is the weather in Paris? Is the server up?")
CALLS = ChatMessage(
    "assistant",
    "Let me check.",
    (ToolCall("get_weather", '{"city": "Paris"}', "call_a"), ToolCall("ping", "{}", "call_b")),
)
RESULTS = (
    ChatMessage("tool", "Sunny, 24 °C", tool_call_id="call_a"),
    ChatMessage("tool", "pong", tool_call_id="call_b"),
)


def test_calls_and_results_are_framed_as_the_template_writes_them(managers: ManagerFactory) -> None:
    chat_format = managers.engine.chat_format()
    framed = Transcript("Be brief.", (QUESTION, CALLS, *RESULTS)).framed(chat_format, TOOLS)
    assert framed.system_prompt.startswith("Be brief.\n\n# Tools") and '"name": "ping"' in framed.system_prompt
    assert [message.role for message in framed.messages] == ["user", "assistant", "user"]
    assert framed.messages[1].content == (
        "Let me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    )
    assert framed.messages[2].content == (
        "<tool_response>\nSunny, 24 °C\n</tool_response>\n<tool_response>\npong\n</tool_response>"
    )
    framed.validate()


def test_calls_count_in_a_digest_by_name_and_arguments() -> None:
    """The model's own spacing and the calls a client resends as the API returned them match."""
    written = 'Let me check.<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    resent = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    other = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    digest = transcript_digest("", [("user", "q"), ("assistant", written)])
    assert digest == transcript_digest("", [("user", "q"), ("assistant", resent)])
    assert digest != transcript_digest("", [("user", "q"), ("assistant", other)])
    # Without calls, a digest is what it always was: stored sessions keep matching.
    assert transcript_digest("", [("assistant", " hi ")]) == transcript_digest("", [("assistant", "hi")])


@pytest.mark.parametrize(
    "messages",
    [
        (QUESTION, *RESULTS),  # results of no call
        (QUESTION, CALLS, ChatMessage("user", "Well?")),  # calls left unanswered
        (QUESTION, CALLS, ChatMessage("tool", "?", tool_call_id="call_z")),  # a call never made
        (QUESTION, CALLS, *RESULTS, ChatMessage("user", "And?")),  # results not answered
        (QUESTION, CALLS),  # the last message the assistant's
    ],
    ids=["results-of-no-call", "unanswered-calls", "unknown-call-id", "results-then-user", "ends-with-calls"],
)
def test_tool_messages_out_of_order_are_refused(messages: tuple[ChatMessage, ...]) -> None:
    with pytest.raises(InvalidMessage):
        Transcript("", messages).validate()


async def test_a_transcript_with_calls_and_results_seeds_a_session_that_its_follow_up_continues(
    managers: ManagerFactory, db: Database
) -> None:
    manager = await managers()
    chat_format = manager.chat_format
    tools = ToolUse(TOOLS)
    conversation = Transcript("Be brief.", (QUESTION, CALLS, *RESULTS))
    first = await manager.turn_for_transcript(conversation, tools=tools).collect()
    with db.session() as session:
        stored = MessageRepository(session).of_session(first.session_id)
        seeded = [(m.role, m.text, m.token_ids.tolist()) for m in stored[:3]]
    framed = conversation.framed(chat_format, TOOLS).messages
    assert seeded == [
        ("user", QUESTION.content, chat_format.message("user", QUESTION.content)),
        ("assistant", framed[1].content, chat_format.reply(chat_format.encode(framed[1].content))),
        ("user", framed[2].content, chat_format.message("user", framed[2].content)),
    ]
    follow_up = Transcript(
        "Be brief.", (*conversation.messages, ChatMessage("assistant", first.reply), ChatMessage("user", "Thanks!"))
    )
    second = await manager.turn_for_transcript(follow_up, tools=tools).collect()
    assert second.session_id == first.session_id
    assert second.cached_tokens >= first.prompt_tokens // 16 * 16 > 0


async def test_a_named_tool_choice_starts_the_reply_and_what_the_model_wrote_is_what_is_stored(
    managers: ManagerFactory, db: Database
) -> None:
    """The demo model's random weights cannot mean a call: the reply is started for it, and
    whatever it writes on is stored and parsed as it is, a call only if it completes one."""
    manager = await managers()
    opening = '<tool_call>\n{"name": "ping", "arguments": '
    assert manager.chat_format.tool_call_opening("ping") == opening
    turn = manager.turn_for_transcript(Transcript("", (QUESTION,)), tools=ToolUse(TOOLS, "required", "ping"))
    pieces = [piece async for piece in turn]
    assert turn.result is not None
    reply = turn.result.reply
    assert reply.startswith(opening) and "".join(pieces) == reply
    with db.session() as session:
        answer = MessageRepository(session).of_session(turn.result.session_id)[-1]
    started = [*manager.chat_format.generation_prompt, *manager.chat_format.encode(opening)]
    assert answer.text == reply and answer.token_ids[: len(started)].tolist() == started
    parsed = parse(reply)
    assert [call.name for call in parsed.calls] in ([], ["ping"])
    assert parsed.calls or parsed.content == reply.strip()


async def test_turns_with_tools_neither_use_the_cache_nor_share_a_generation(managers: ManagerFactory) -> None:
    manager = await managers(cache=True)
    question = Transcript("", (ChatMessage("user", "Is the server up?"),))
    first = await manager.turn_for_transcript(question, tools=ToolUse(TOOLS)).collect()
    again = await manager.turn_for_transcript(question, tools=ToolUse(TOOLS)).collect()
    both = await asyncio.gather(*(manager.turn_for_transcript(question, tools=ToolUse(TOOLS)).collect() for _ in "ab"))
    assert [result.cache_level for result in (first, again, *both)] == [CacheLevel.MISS] * 4
    await manager.settle()  # what a turn caches, it caches after the turn
    assert manager.cache.figures().entries == 0
    plain = await manager.turn_for_transcript(question).collect()
    await manager.settle()
    assert plain.cache_level is CacheLevel.MISS and manager.cache.figures().entries == 1
