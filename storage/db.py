"""The database handle: a SQLAlchemy engine with SQLite pragmas, Alembic upgrade at start-up, units of work."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from storage.sqlite_writers import QueuedWriterConnection

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
# The advisory-lock namespace of migrations (each lock user has its own: `ProcessLocks`' callers).
MIGRATION_LOCKS = 0


class Database:
    def __init__(self, url: str, *, busy_timeout_ms: int = 5000, echo: bool = False) -> None:
        self.url = make_url(url)
        sqlite = self.url.get_backend_name() == "sqlite"
        if sqlite and self.url.database not in (None, "", ":memory:"):
            Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
        # sqlite3's timeout is SQLite's busy timeout; the connections take turns to write
        connect_args = {"factory": QueuedWriterConnection, "timeout": busy_timeout_ms / 1000} if sqlite else {}
        self.sql_engine: Engine = create_engine(self.url, echo=echo, connect_args=connect_args)
        if sqlite:
            _install_sqlite_pragmas(self.sql_engine)
        self._sessionmaker = sessionmaker(self.sql_engine, expire_on_commit=False)
        self.locks = ProcessLocks(self.sql_engine)

    def alembic_config(self) -> AlembicConfig:
        config = AlembicConfig()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.set_main_option("sqlalchemy.url", self.url.render_as_string(hide_password=False).replace("%", "%%"))
        return config

    def upgrade(self, revision: str = "head") -> None:
        with self.sql_engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Replicas starting together migrate one after the other: the later ones find
                # the schema at head. Released when this transaction ends.
                connection.execute(text("SELECT pg_advisory_xact_lock(:namespace, 0)"), {"namespace": MIGRATION_LOCKS})
            config = self.alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
        log.info("database %s at migration %s", self.url.render_as_string(hide_password=True), revision)

    def downgrade(self, revision: str) -> None:
        with self.sql_engine.begin() as connection:
            config = self.alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: committed on success, rolled back on any exception."""
        with self._sessionmaker() as session, session.begin():
            yield session

    def ping(self) -> bool:
        try:
            with self.sql_engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return True
        except Exception:
            log.warning("database ping failed", exc_info=True)
            return False

    def close(self) -> None:
        self.locks.close()
        self.sql_engine.dispose()


class ProcessLocks:
    """Locks every process on the database shares: PostgreSQL advisory locks, all held on one
    connection of their own, so a thousand sessions mid-turn cost one connection, not a thousand
    from the pool. Taking one never waits (`try_take`): two replicas in one session's turn at the
    same moment is rare, and the caller polls. On SQLite every lock is free: replicas that share
    state run on a server database, and one process keeps its own locks. Any thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.shared = engine.dialect.name == "postgresql"
        self._connection: Connection | None = None
        self._mutex = threading.Lock()

    def try_take(self, namespace: int, key: int) -> bool:
        return not self.shared or bool(self._run("SELECT pg_try_advisory_lock(:namespace, :key)", namespace, key))

    def release(self, namespace: int, key: int) -> None:
        if self.shared:
            self._run("SELECT pg_advisory_unlock(:namespace, :key)", namespace, key)

    def close(self) -> None:
        with self._mutex:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _run(self, statement: str, namespace: int, key: int) -> object:
        with self._mutex:
            if self._connection is None:
                self._connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                return self._connection.execute(text(statement), {"namespace": namespace, "key": key}).scalar()
            except BaseException:
                # A broken connection's server session is gone, and every lock it held with it.
                self._connection.invalidate()
                self._connection = None
                raise


def _install_sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
