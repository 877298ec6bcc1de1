"""cache entries' ids are never reused on SQLite either, so replicas follow the table by id

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    _recreate(autoincrement=True)


def downgrade() -> None:
    _recreate(autoincrement=False)


def _recreate(*, autoincrement: bool) -> None:
    # SQLite reuses the largest id after it is deleted unless the table is AUTOINCREMENT, which
    # only a new table can be; PostgreSQL's sequences never reuse one.
    if op.get_bind().dialect.name != "sqlite":
        return
    table_kwargs = {"sqlite_autoincrement": autoincrement}
    with op.batch_alter_table("cache_entries", recreate="always", table_kwargs=table_kwargs) as batch_op:
        batch_op.alter_column("id", existing_type=sa.Integer(), existing_nullable=False, autoincrement=autoincrement)
