"""Cache entries say whether the model's answer was cut at max_tokens, and where

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cache_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cut_at", sa.Integer(), nullable=True))
    # Earlier versions cached answers cut at max_tokens as if complete, and which ones were is not
    # known: each is marked cut at 0 tokens, so it serves no request until an answer replaces it.
    op.execute("UPDATE cache_entries SET cut_at = 0")


def downgrade() -> None:
    with op.batch_alter_table("cache_entries", schema=None) as batch_op:
        batch_op.drop_column("cut_at")
