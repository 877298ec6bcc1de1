"""sessions remember their compacted context

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("context_seqs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("compacted_through_seq", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("compressions", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("compressions")
        batch_op.drop_column("compacted_through_seq")
        batch_op.drop_column("context_seqs")
