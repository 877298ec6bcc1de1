"""Alembic environment: upgrades run at start-up through storage.db.Database.upgrade,
or from the command line with `alembic upgrade head` (alembic.ini reads CLAWDBOT_DATABASE_URL)."""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine

from storage.models import Base

config = context.config
if config.config_file_name and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def url() -> str:
    url = os.environ.get("CLAWDBOT_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    assert url, "no database URL: set sqlalchemy.url or CLAWDBOT_DATABASE_URL"
    return url


if context.is_offline_mode():
    context.configure(url=url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    run_migrations(connection)
else:
    with create_engine(url()).begin() as connection:
        run_migrations(connection)
