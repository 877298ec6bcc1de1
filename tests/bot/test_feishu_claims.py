"""Claims of Feishu messages: finished once the reply is shown, taken again once after a restart."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from storage import Database, EventRepository, ProcessedEvent, utcnow

pytestmark = pytest.mark.both_databases  # every test here runs on SQLite and on PostgreSQL


TTL = timedelta(days=2)
PREFIX = "feishu:message:"


def test_unfinished_claims_since_a_time_are_taken_once_oldest_first(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        events = EventRepository(session)
        events.claim(PREFIX + "late", TTL, now - timedelta(seconds=10), chat_type="group")
        events.claim(PREFIX + "early", TTL, now - timedelta(seconds=20), chat_type="p2p")
        events.claim(PREFIX + "answered", TTL, now - timedelta(seconds=20), chat_type="p2p")
        events.finish(PREFIX + "answered")
        events.claim(PREFIX + "too-old", TTL, now - timedelta(seconds=700), chat_type="p2p")
        events.claim("another:kind", TTL, now - timedelta(seconds=10))

    with db.session() as session:
        taken = EventRepository(session).resume_unfinished(PREFIX, since=now - timedelta(seconds=600), now=now)
        assert [(claim.key, claim.chat_type) for claim in taken] == [
            (PREFIX + "early", "p2p"),
            (PREFIX + "late", "group"),
        ]
    with db.session() as session:
        assert EventRepository(session).resume_unfinished(PREFIX, since=now - timedelta(seconds=600)) == []
        too_old = session.get(ProcessedEvent, PREFIX + "too-old")
        assert too_old is not None and too_old.resumed_at is None


def test_a_claim_taken_again_after_it_expired_is_unfinished(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        events = EventRepository(session)
        events.claim(PREFIX + "m", TTL, now - timedelta(days=3), chat_type="p2p")
        events.finish(PREFIX + "m", now - timedelta(days=3))
        assert events.claim(PREFIX + "m", TTL, now, chat_type="group")

    with db.session() as session:
        [claim] = EventRepository(session).resume_unfinished(PREFIX, since=now - timedelta(seconds=600))
        assert (claim.key, claim.chat_type) == (PREFIX + "m", "group")


def test_claims_from_before_the_migration_count_as_finished(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'old.db'}")
    database.upgrade("0003")
    with database.sql_engine.begin() as connection:
        connection.execute(
            text("INSERT INTO processed_events (key, created_at, expires_at) VALUES (:key, :created, :expires)"),
            {
                "key": PREFIX + "old",
                "created": utcnow().replace(tzinfo=None),
                "expires": utcnow().replace(tzinfo=None) + TTL,
            },
        )
    database.upgrade()

    with database.session() as session:
        claim = session.get(ProcessedEvent, PREFIX + "old")
        assert claim is not None and claim.finished_at == claim.created_at
        assert EventRepository(session).resume_unfinished(PREFIX, since=utcnow() - timedelta(days=1)) == []
    database.downgrade("0003")
    with database.sql_engine.connect() as connection:
        assert connection.execute(text("SELECT key FROM processed_events")).scalars().all() == [PREFIX + "old"]
    database.close()


def test_a_claim_under_a_live_lease_is_left_to_its_replica(db: Database) -> None:
    now = utcnow()
    lease = timedelta(seconds=30)
    since = now - timedelta(seconds=600)
    with db.session() as session:
        events = EventRepository(session)
        events.claim(PREFIX + "answering", TTL, now - timedelta(seconds=20), chat_type="p2p", lease=lease)
        events.claim(PREFIX + "stopped", TTL, now - timedelta(seconds=40), chat_type="p2p", lease=lease)
        events.claim(PREFIX + "failed", TTL, now - timedelta(seconds=5), chat_type="p2p", lease=lease)
        events.lease(PREFIX + "failed", timedelta(0), now - timedelta(seconds=1))  # given up on an error
    with db.session() as session:
        taken = EventRepository(session).resume_unfinished(PREFIX, since, now, lease=lease)
        assert [claim.key for claim in taken] == [PREFIX + "stopped", PREFIX + "failed"]
        assert all(claim.lease_until == now + lease for claim in taken)  # leased to the replica taking them

    with db.session() as session:
        EventRepository(session).lease(PREFIX + "answering", lease, now + timedelta(seconds=25))  # renewed
    with db.session() as session:
        events = EventRepository(session)
        assert events.resume_unfinished(PREFIX, since, now + timedelta(seconds=40), lease=lease) == []
        [claim] = events.resume_unfinished(PREFIX, since, now + timedelta(seconds=60), lease=lease)
        assert claim.key == PREFIX + "answering"


def test_an_unfinished_claim_is_taken_with_the_card_its_reply_was_streaming_into(db: Database) -> None:
    now = utcnow()
    with db.session() as session:
        events = EventRepository(session)
        events.claim(PREFIX + "cut", TTL, now - timedelta(seconds=30), chat_type="p2p")
        events.showing(PREFIX + "cut", "cardkit:7000000001")
        events.showing(PREFIX + "cut", "cardkit:7000000002")  # the answer went on in a second card
        events.claim(PREFIX + "answered", TTL, now - timedelta(seconds=20), chat_type="p2p")
        events.finish(PREFIX + "answered")
        events.showing(PREFIX + "answered", "cardkit:7000000003")  # too late: the claim is finished
        events.claim(PREFIX + "no-card", TTL, now - timedelta(seconds=10), chat_type="p2p")

    with db.session() as session:
        taken = EventRepository(session).resume_unfinished(PREFIX, since=now - timedelta(seconds=600), now=now)
        assert [(claim.key, claim.reply_card) for claim in taken] == [
            (PREFIX + "cut", "cardkit:7000000002"),
            (PREFIX + "no-card", None),
        ]
        answered = session.get(ProcessedEvent, PREFIX + "answered")
        assert answered is not None and answered.reply_card is None

    with db.session() as session:  # claimed anew once expired: an earlier reply's card is not its own
        assert EventRepository(session).claim(PREFIX + "cut", TTL, now + TTL + timedelta(seconds=1))
        claim = session.get(ProcessedEvent, PREFIX + "cut")
        assert claim is not None and claim.reply_card is None
