"""The Feishu bot's tool loop, end to end: a model that calls `current_time` after every generation
prompt (a chained Qwen3: real vocabulary, real forward passes, known greedy output), so each round
of calls runs the real tool, its result goes back as the session's next message, and the step cap
ends the loop. Whether tools are offered at all: the settings and the model decide."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from transformers import PreTrainedTokenizerBase

from settings import AssistantSettings, Settings
from storage import ChatSession, Database, Message
from tests.bot.bot_support import AppServer, app_settings, final_text, pushed, start_connected
from tests.fakes.events import message_event
from tests.fakes.feishu import FakeFeishu
from tests.models import IM_END, chained_model

CALL = '<tool_call>\n{"name":"current_time","arguments":{}}\n</tool_call>'
MAX_STEPS = 2


def calling_checkpoint(path: Path, tokenizer: PreTrainedTokenizerBase) -> Path:
    generation_prompt_end = tokenizer.encode("</think>\n\n")[-1]
    model = chained_model([[generation_prompt_end, *tokenizer.encode(CALL), IM_END]])
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def with_model(settings: Settings, model: str, assistant: AssistantSettings) -> Settings:
    engine = settings.engine.model_copy(update={"model": model})
    generation = settings.generation.model_copy(update={"max_tokens": 32})  # a whole call
    return settings.model_copy(update={"engine": engine, "generation": generation, "assistant": assistant})


@pytest.fixture(scope="module")
def app(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu, tokenizer: PreTrainedTokenizerBase
) -> Iterator[AppServer]:
    checkpoint = calling_checkpoint(tmp_path_factory.mktemp("calling"), tokenizer)
    settings = app_settings(tmp_path_factory.mktemp("tools"), fake, requests_per_minute=0)
    server = start_connected(with_model(settings, str(checkpoint), AssistantSettings(tool_max_steps=MAX_STEPS)), fake)
    yield server
    server.stop()


def stored(app: AppServer, chat_id: str) -> list[tuple[str, str]]:
    """(role, text) of the chat's stored messages, in order."""
    db = Database(str(app.settings.storage.url))
    try:
        with db.session() as session:
            rows = session.execute(
                select(Message.role, Message.text)
                .join(ChatSession, Message.session_id == ChatSession.id)
                .where(ChatSession.chat_id == chat_id)
                .order_by(Message.id)
            ).all()
            system = session.scalars(select(ChatSession.system_prompt).where(ChatSession.chat_id == chat_id)).one()
    finally:
        db.close()
    return [("system", system or ""), *((role, text) for role, text in rows)]


def test_the_model_calls_a_tool_sees_its_result_and_the_step_cap_ends_the_loop(
    app: AppServer, fake: FakeFeishu
) -> None:
    chat = "oc_tool_loop"
    answer = final_text(fake, pushed(fake, message_event(chat_id=chat, text="What time is it?")))

    assert answer == f"(I stopped using tools here: {MAX_STEPS} rounds of calls is the most I make for one message.)"
    (_, prompt), *messages = stored(app, chat)
    assert '"name": "current_time"' in prompt  # the session offers the tools
    roles = [role for role, _ in messages]
    assert roles == ["user", "assistant"] + ["user", "assistant"] * MAX_STEPS
    assert messages[0][1] == "What time is it?"
    results = [text for role, text in messages[2::2]]
    assert all(text.startswith("<tool_response>") and "(Asia/Shanghai)" in text for text in results)
    assert all(text == CALL for role, text in messages[1::2])  # the calls, as the model wrote them


def test_tools_are_offered_only_when_settings_and_model_allow(tmp_path: Path, fake: FakeFeishu, app: AppServer) -> None:
    demo = AppServer(app_settings(tmp_path / "demo", fake))  # auto, and the demo model: no tools
    off = AppServer(
        with_model(app_settings(tmp_path / "off", fake), app.settings.engine.model, AssistantSettings(tools=False))
    )
    for server in (demo, off):
        assert server.app.state.chat_manager.sessions.tools_prompt == {}
    assert "feishu" in app.app.state.chat_manager.sessions.tools_prompt
