"""The document tool reading through the real lark-oapi SDK from the fake Feishu on loopback."""

from __future__ import annotations

import itertools
import json
from datetime import datetime

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from assistant.reminders import Reminder, Reminders
from assistant.tools import BuiltinTools
from bot.feishu_api import FeishuApi, FeishuApiError
from chat import Conversation
from chat.tool_calls import ToolCall
from settings import AssistantSettings
from storage import Database
from tests.fakes.feishu import DOCUMENT_NOT_FOUND_CODE, FakeFeishu

DOC_ID = "doxcnFakeFakeFakeFakeFake1"
ANN = Conversation("feishu", "oc_team", "group", "ou_ann")

_app_ids = itertools.count(1)


@pytest.fixture
def api(fake: FakeFeishu) -> FeishuApi:
    return FeishuApi.connect(f"cli_docs_{next(_app_ids)}", "secret", fake.domain)


@pytest.fixture
def reminders(db: Database) -> Reminders:
    async def deliver(reminder: Reminder, fired_at: datetime) -> None:
        raise AssertionError(f"nothing is due in these tests: {reminder}")

    # Never started: the document tool does not touch reminders.
    return Reminders(AsyncIOScheduler(timezone="UTC"), db, deliver)


async def test_document_text(fake: FakeFeishu, api: FeishuApi) -> None:
    fake.documents[DOC_ID] = "Q4 plan\nShip the bot."
    assert await api.document_text(DOC_ID) == "Q4 plan\nShip the bot."
    with pytest.raises(FeishuApiError) as refused:
        await api.document_text("doxcnMissingMissingMissing")
    assert refused.value.code == DOCUMENT_NOT_FOUND_CODE


async def test_the_tool_reads_a_link_and_reports_an_unreadable_one(
    fake: FakeFeishu, api: FeishuApi, reminders: Reminders
) -> None:
    fake.documents[DOC_ID] = "Q4 plan\nShip the bot."
    tools = BuiltinTools(None, reminders, AssistantSettings(), api.document_text)

    async def read(url: str) -> str:
        return await tools.run(ToolCall("read_feishu_doc", json.dumps({"url": url})), ANN)

    assert await read(f"https://acme.feishu.cn/docx/{DOC_ID}") == "Q4 plan\nShip the bot."
    unreadable = await read("https://acme.feishu.cn/docx/doxcnMissingMissingMissing")
    assert unreadable.startswith("error: the document could not be read")
    assert str(DOCUMENT_NOT_FOUND_CODE) in unreadable
