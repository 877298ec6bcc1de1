"""processed events record whether their reply was finished, so unfinished ones are answered after a restart

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chat_type", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("resumed_at", sa.DateTime(), nullable=True))
    # Whether they were answered is not known; answering them again could answer twice.
    op.execute("UPDATE processed_events SET finished_at = created_at")


def downgrade() -> None:
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.drop_column("resumed_at")
        batch_op.drop_column("finished_at")
        batch_op.drop_column("chat_type")
