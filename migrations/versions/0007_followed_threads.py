"""Feishu threads the bot answered in, followed up without an @mention until they expire

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "followed_threads",
        sa.Column("root_message_id", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("root_message_id"),
    )
    with op.batch_alter_table("followed_threads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_followed_threads_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("followed_threads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_followed_threads_expires_at"))

    op.drop_table("followed_threads")
