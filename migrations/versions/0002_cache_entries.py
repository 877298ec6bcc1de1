"""response cache entries

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cache_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("embedder", sa.String(length=256), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_hit_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    with op.batch_alter_table("cache_entries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cache_entries_scope"), ["scope"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("cache_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cache_entries_scope"))

    op.drop_table("cache_entries")
