"""reminders and scheduled prompts: APScheduler's job table, exactly as its SQLAlchemyJobStore defines it

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # apscheduler/jobstores/sqlalchemy.py: 191 is MySQL's longest indexed utf8mb4 key, Float(25) an 8-byte float.
    op.create_table(
        "apscheduler_jobs",
        sa.Column("id", sa.Unicode(length=191), nullable=False),
        sa.Column("next_run_time", sa.Float(precision=25), nullable=True),
        sa.Column("job_state", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("apscheduler_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_apscheduler_jobs_next_run_time"), ["next_run_time"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("apscheduler_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_apscheduler_jobs_next_run_time"))
    op.drop_table("apscheduler_jobs")
