"""Two bot replicas behind one webhook address, on one database (SQLite, then PostgreSQL): each
is the whole app (`build_app`) with its own sessions, cache and engine in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from cache.response_cache import ResponseCache
from chat import Conversation, SessionStore
from storage import Database
from tests.bot.bot_support import AppServer, app_settings, final_text
from tests.bot.test_feishu_webhook import ENCRYPT_KEY, TOKEN, deliver
from tests.fakes.events import message_event
from tests.fakes.feishu import FakeFeishu, wait_for

pytestmark = pytest.mark.both_databases

CHAT = "oc_replicas"


@pytest.fixture
def replicas(tmp_path: Path, fake: FakeFeishu, db: Database) -> Iterator[list[AppServer]]:
    url = db.url.render_as_string(hide_password=False)
    apps = [
        AppServer(
            app_settings(
                tmp_path,
                fake,
                database_url=url,
                cache={"sync_interval_s": 0.5},
                mode="webhook",
                encrypt_key=ENCRYPT_KEY,
                verification_token=TOKEN,
            )
        )
        for _ in range(2)
    ]
    for app in apps:
        app.launch()
    try:
        for app in apps:
            app.started()
        yield apps
    finally:
        for app in apps:
            app.stop()


def history_ids(app: AppServer, fresh: bool) -> tuple[list[str], list[int]]:
    """(user texts, ids) of the chat's session: as the replica holds it, or as a replica that
    never saw it loads it."""
    sessions: SessionStore = app.app.state.chat_manager.sessions
    conversation = Conversation(channel="feishu", chat_id=CHAT)
    if fresh:
        store = SessionStore(sessions.db, sessions.chat_format, sessions.settings)
        state = asyncio.run(store.open(conversation))
    else:
        loaded = sessions.loaded(conversation)
        assert loaded is not None
        state = loaded
    return [record.text for record in state.history.records if record.role == "user"], state.history.token_ids.tolist()


def holds(cache: ResponseCache, question: str) -> bool:
    return any(entry.question == question for entry in asyncio.run(cache.entries(question)))


def test_one_reply_per_message_one_conversation_one_cache_across_replicas(
    replicas: list[AppServer], fake: FakeFeishu
) -> None:
    first, second = replicas
    # Feishu delivers the same message to both (a retry that the load balancer sent elsewhere).
    event = message_event(chat_id=CHAT, text="What is the refund policy?", token=TOKEN)
    message_id = event["event"]["message"]["message_id"]
    for app in replicas:
        assert fake.post_event(f"{app.base_url}/feishu/events", event, encrypt_key=ENCRYPT_KEY).status_code == 200
    final_text(fake, message_id)

    # The conversation goes on, a turn on each replica; one lane per chat on each means each has
    # dealt with the message above before these.
    for app, text in ((second, "And for damaged goods?"), (first, "How long does it take?")):
        response, later_id = deliver(fake, app, CHAT, text)
        assert response.status_code == 200
        final_text(fake, later_id)
    assert len(fake.replies_to(message_id)) == 1

    said, ids = history_ids(first, fresh=False)
    assert said == ["What is the refund policy?", "And for damaged goods?", "How long does it take?"]
    assert (said, ids) == history_ids(first, fresh=True)  # the prompt the last turn extended was the whole story

    # The first question's answer, stored by whichever replica gave it, is served by both.
    for app in replicas:
        cache = app.app.state.chat_manager.cache
        wait_for(partial(holds, cache, "What is the refund policy?"), 10, what="the replicas to follow the cache")
        response, elsewhere_id = deliver(
            fake, app, f"oc_other_{app.settings.server.port}", "What is the refund policy?"
        )
        assert response.status_code == 200
        final_text(fake, elsewhere_id)
        assert cache.figures().hits_exact == 1
