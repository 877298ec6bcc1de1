"""a claim holds a lease while its replica answers, so another replica starting meanwhile leaves it alone

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Claims made before have none: taken again after a restart, as they were.
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_until", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("processed_events", schema=None) as batch_op:
        batch_op.drop_column("lease_until")
