"""reminders: each job's chat, owner and kind in columns of their own, so that a user's list and the
console's counts read those rows or none, not every job's pickled state

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

import pickle

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("apscheduler_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chat_id", sa.Unicode(length=191), nullable=True))
        batch_op.add_column(sa.Column("user_id", sa.Unicode(length=191), nullable=True))
        batch_op.add_column(sa.Column("kind", sa.Unicode(length=191), nullable=True))
        batch_op.create_index("ix_apscheduler_jobs_owner", ["chat_id", "user_id"], unique=False)
    # The jobs set before: their state is APScheduler's dict, the job's kwargs are _JobData's
    # fields (assistant/reminders.py). One that cannot be read keeps NULLs, and APScheduler drops
    # it the next time it reads it, as it drops any job it cannot restore.
    jobs = sa.table(
        "apscheduler_jobs",
        sa.column("id", sa.Unicode),
        sa.column("job_state", sa.LargeBinary),
        sa.column("chat_id", sa.Unicode),
        sa.column("user_id", sa.Unicode),
        sa.column("kind", sa.Unicode),
    )
    connection = op.get_bind()
    for job_id, job_state in connection.execute(sa.select(jobs.c.id, jobs.c.job_state)).all():
        try:
            kwargs = pickle.loads(job_state)["kwargs"]
            owner = {"chat_id": kwargs["target"]["chat_id"], "user_id": kwargs["target"]["user_id"]}
            values = owner | {"kind": kwargs["kind"]}
        except Exception:  # noqa: BLE001 - whatever an unreadable pickle raises
            continue
        connection.execute(jobs.update().where(jobs.c.id == job_id).values(**values))


def downgrade() -> None:
    with op.batch_alter_table("apscheduler_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_apscheduler_jobs_owner")
        batch_op.drop_column("kind")
        batch_op.drop_column("user_id")
        batch_op.drop_column("chat_id")
