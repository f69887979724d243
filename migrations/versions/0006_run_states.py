"""A run's state is a column (`anyrtd/lifecycle.py`): prepared, started, running or ended.
A `once`'s consumption is queued when its start is noted, so no outbox write waits for a
due time any longer: `runs.prepared_for` and `outbox.not_before` go.

A mirror written by an earlier anyrtd may hold runs prepared ahead (a crash before their
start) and, for each such `once`, its consumption held in the outbox until the start.
Those rows become `prepared` and the held writes are deleted: the next start settles the
prepared runs, and queues the consumption of each that may have started
(`lifecycle.settle_at_open`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOT NULL with a default: SQLite adds it in place, no copy of a large runs table.
    op.add_column("runs", sa.Column("state", sa.Text, nullable=False, server_default="ended"))
    op.execute("UPDATE runs SET state = 'prepared' WHERE prepared_for IS NOT NULL")
    op.execute(
        "UPDATE runs SET state = 'running' WHERE prepared_for IS NULL AND status = 'running'"
    )
    op.execute("DELETE FROM outbox WHERE not_before IS NOT NULL")
    # SQLite 3.35 and later drop a column in place.
    op.execute("ALTER TABLE runs DROP COLUMN prepared_for")
    op.execute("ALTER TABLE outbox DROP COLUMN not_before")


def downgrade() -> None:
    op.add_column("outbox", sa.Column("not_before", sa.Float, nullable=True))
    op.add_column("runs", sa.Column("prepared_for", sa.Float, nullable=True))
    op.execute("UPDATE runs SET prepared_for = started_at WHERE state = 'prepared'")
    op.execute("UPDATE runs SET status = 'running' WHERE state != 'ended'")
    op.drop_column("runs", "state")
