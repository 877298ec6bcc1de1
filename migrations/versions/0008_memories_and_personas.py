"""Long-term memories per owner (a private chat, or one person in a group), distilled from closed
sessions; a persona per chat

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=256), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("embedder", sa.String(length=128), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_memories_owner"), ["owner"], unique=False)
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.add_column(sa.Column("persona_name", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("persona_manner", sa.Text(), nullable=True))
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("distilled_at", sa.DateTime(), nullable=True))
    # Sessions closed before memory existed are not gone over all at once after the upgrade.
    op.execute("UPDATE sessions SET distilled_at = closed_at WHERE state = 'closed'")


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("distilled_at")
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_column("persona_manner")
        batch_op.drop_column("persona_name")
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memories_owner"))
    op.drop_table("memories")
