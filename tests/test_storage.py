from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from storage import (
    ChatRepository,
    Database,
    EventRepository,
    MessageRepository,
    NewMessage,
    ProcessedEvent,
    SessionQuery,
    SessionRepository,
    utcnow,
)
from storage.maintenance import run_maintenance
from tests.support import database_url

TABLES = {"chats", "sessions", "messages", "processed_events"}


pytestmark = pytest.mark.both_databases  # every test here runs on SQLite and on PostgreSQL


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_empty_database_to_head_and_back(backend: str, tmp_path: Path) -> None:
    with database_url(backend, tmp_path) as url:
        upgrade_and_back(Database(url))


def test_replicas_starting_together_migrate_one_after_the_other(tmp_path: Path) -> None:
    """On PostgreSQL; a SQLite file is one process's."""
    with database_url("postgresql", tmp_path) as url:
        replicas = [Database(url) for _ in range(3)]
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(Database.upgrade, replicas))  # each raises if it ran into another's tables
        assert set(inspect(replicas[0].sql_engine).get_table_names()) >= TABLES
        for replica in replicas:
            replica.close()


def upgrade_and_back(database: Database) -> None:
    assert not TABLES & set(inspect(database.sql_engine).get_table_names())
    database.upgrade()
    assert set(inspect(database.sql_engine).get_table_names()) >= TABLES
    database.downgrade("base")
    assert set(inspect(database.sql_engine).get_table_names()) == {"alembic_version"}
    database.upgrade()  # and forward again: the downgrade left nothing behind
    assert set(inspect(database.sql_engine).get_table_names()) >= TABLES
    database.close()


def test_sqlite_pragmas(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    with database.sql_engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 5000
    database.close()


def test_sqlite_parent_folder_is_created(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'a' / 'b' / 'bot.db'}")
    database.upgrade()
    assert (tmp_path / "a" / "b" / "bot.db").exists()
    database.close()


def test_messages_keep_token_ids_exactly(db: Database) -> None:
    ids = [0, 1, 151643, 151645, 2**31 + 5, 7] * 50
    with db.session() as session:
        chat = ChatRepository(session).get_or_create("oc_1", channel="feishu", chat_type="group")
        chat_session = SessionRepository(session).create("feishu:oc_1", chat_id=chat.id, system_prompt="be brief")
        MessageRepository(session).add(chat_session.id, [NewMessage(0, 0, "user", "你好", ids)])
        session_id = chat_session.id
    with db.session() as session:
        [message] = MessageRepository(session).of_session(session_id)
        assert message.token_ids.tolist() == ids
        assert message.text == "你好"
        assert message.created_at.tzinfo is not None


def test_one_active_session_per_key(db: Database) -> None:
    with db.session() as session:
        first = SessionRepository(session).create("k")
    with pytest.raises(IntegrityError), db.session() as session:
        SessionRepository(session).create("k")
    with db.session() as session:
        sessions = SessionRepository(session)
        sessions.close(first.id)
        second = sessions.create("k")
        active = sessions.active("k")
        assert active is not None and active.id == second.id
        assert sessions.count() == 2


def test_sessions_are_found_by_a_word_in_their_chat_or_messages_and_filtered(db: Database) -> None:
    chats = [("feishu", "oc_team", "Platform team"), ("api", "a1", None), ("web", "w1", None), ("web", "w2", None)]
    texts = {"oc_team": "Deploy the GATEWAY tonight", "a1": "100% sure?", "w1": "网关超时了", "w2": "hello"}
    with db.session() as session:
        for channel, chat_id, name in chats:
            ChatRepository(session).get_or_create(chat_id, channel=channel, name=name)
            row = SessionRepository(session).create(f"{channel}:{chat_id}", chat_id=chat_id)
            MessageRepository(session).add(row.id, [NewMessage(0, 0, "user", texts[chat_id], [1])])
        SessionRepository(session).close(row.id)  # w2's

    def found(**query: str) -> list[str]:
        with db.session() as session:
            sessions = SessionRepository(session)
            rows = sessions.recent(10, 0, SessionQuery(**query))
            assert sessions.count_matching(SessionQuery(**query)) == len(rows)
            return sorted(row.chat_id or "" for row in rows)

    assert found(text="gateway") == ["oc_team"]  # a message, whatever the case
    assert found(text="platform") == ["oc_team"]  # the chat's name
    assert found(text="web:w") == ["w1", "w2"]  # the key
    assert found(text="网关") == ["w1"]
    assert found(text="%") == ["a1"]  # a literal, not a wildcard
    assert found(channel="web") == ["w1", "w2"]
    assert found(channel="web", state="active") == ["w1"]
    assert found(text="nowhere") == [] and len(found()) == 4
    with db.session() as session:
        assert SessionRepository(session).count_by_channel() == {"api": 1, "feishu": 1, "web": 2}


def test_failed_unit_of_work_writes_nothing(db: Database) -> None:
    with db.session() as session:
        chat_session = SessionRepository(session).create("k")
    with pytest.raises(IntegrityError), db.session() as session:
        messages = MessageRepository(session)
        messages.add(chat_session.id, [NewMessage(0, 0, "user", "q", [1])])
        messages.add(chat_session.id, [NewMessage(0, 0, "assistant", "a", [2])])
    with db.session() as session:
        assert MessageRepository(session).of_session(chat_session.id) == []


def test_deleting_a_session_deletes_its_messages(db: Database) -> None:
    with db.session() as session:
        chat_session = SessionRepository(session).create("k")
        MessageRepository(session).add(chat_session.id, [NewMessage(0, 0, "user", "q", [1])])
    with db.session() as session:
        session.delete(SessionRepository(session).get(chat_session.id))
    with db.session() as session:
        assert session.execute(text("SELECT count(*) FROM messages")).scalar() == 0


def test_event_claim_is_once_until_expiry(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        events = EventRepository(session)
        assert events.claim("om_1", timedelta(hours=24), now=now)
        assert not events.claim("om_1", timedelta(hours=24), now=now + timedelta(hours=1))
        assert events.claim("om_1", timedelta(hours=24), now=now + timedelta(hours=25))


def test_maintenance_purges_expired_events_and_closes_idle_sessions(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        events = EventRepository(session)
        for index in range(5):
            events.claim(f"old-{index}", timedelta(hours=24), now=now - timedelta(hours=30))
        for index in range(3):
            events.claim(f"new-{index}", timedelta(hours=24), now=now - timedelta(hours=1))
        sessions = SessionRepository(session)
        idle = sessions.create("idle")
        sessions.touch(idle.id, now - timedelta(hours=48))
        busy = sessions.create("busy")
        sessions.touch(busy.id, now - timedelta(minutes=5))

    report = run_maintenance(db, session_idle_ttl=timedelta(hours=24), now=now)

    assert report.purged_events == 5
    assert report.closed_session_keys == ["idle"]
    with db.session() as session:
        remaining = sorted(event.key for event in session.query(ProcessedEvent))
        assert remaining == ["new-0", "new-1", "new-2"]
        sessions = SessionRepository(session)
        assert sessions.active("idle") is None
        closed = sessions.get(idle.id)
        assert closed is not None
        assert closed.state == "closed"
        assert closed.closed_at is not None
        assert sessions.active("busy") is not None
    assert run_maintenance(db, session_idle_ttl=timedelta(hours=24), now=now).purged_events == 0


def test_migrations_match_the_models(db: Database) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from storage import Base

    with db.sql_engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
