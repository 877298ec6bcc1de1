"""API sessions store the digest of their transcript, so a conversation resent after a restart finds its session

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("transcript_digest", sa.String(length=32), nullable=True))
        batch_op.create_index(batch_op.f("ix_sessions_transcript_digest"), ["transcript_digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sessions_transcript_digest"))
        batch_op.drop_column("transcript_digest")
