"""a claim records the card its reply streams into, so a replica answering it again can close a card left streaming

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reply_card", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.drop_column("reply_card")
