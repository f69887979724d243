"""The first schema of the mirror: records, registry entries, runs, outbox, tombstones, meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "trigger_records",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("seen_at", sa.Float, nullable=False),
    )
    op.create_table(
        "entries",
        sa.Column("trigger_id", sa.Text, primary_key=True),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("armed_at", sa.Float, nullable=False),
        sa.Column("next_fire", sa.Float, nullable=True),
        sa.Column("consumed", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("run_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("marker", sa.Text, nullable=True),
        sa.Column("claimed_at", sa.Float, nullable=True),
    )
    op.create_index("entries_next_fire", "entries", ["next_fire"])
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("trigger_id", sa.Text, nullable=True),
        sa.Column("program", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("scheduled_at", sa.Float, nullable=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("duration_ms", sa.Integer, nullable=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error_type", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("result", sa.Text, nullable=False, server_default="{}"),
        sa.Column("output", sa.Text, nullable=False, server_default=""),
        sa.Column("output_dropped", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("runs_trigger_started", "runs", ["trigger_id", "started_at"])
    op.create_index("runs_status", "runs", ["status"])
    op.create_index("runs_started", "runs", ["started_at"])
    op.create_table(
        "outbox",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dataset", sa.Text, nullable=False),
        sa.Column("record_id", sa.Text, nullable=False),
        sa.Column("fields", sa.Text, nullable=False),
        sa.Column("unset", sa.Text, nullable=False, server_default="[]"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_table(
        "tombstones",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("deleted_at", sa.Float, nullable=False),
    )
    op.execute(
        """
        CREATE VIEW scheduled_next AS
        SELECT e.trigger_id,
               e.kind,
               datetime(e.next_fire, 'unixepoch') AS next_fire_utc,
               e.next_fire,
               e.enabled,
               e.consecutive_failures,
               e.marker
        FROM entries AS e
        WHERE e.next_fire IS NOT NULL AND e.enabled
        ORDER BY e.next_fire
        """
    )
    op.execute(
        """
        CREATE VIEW recent_runs AS
        SELECT r.run_id,
               r.trigger_id,
               r.program,
               r.status,
               r.error_type,
               datetime(r.started_at, 'unixepoch') AS started_utc,
               r.duration_ms
        FROM runs AS r
        ORDER BY r.started_at DESC
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW recent_runs")
    op.execute("DROP VIEW scheduled_next")
    for table in ("tombstones", "outbox", "runs", "entries", "trigger_records", "meta"):
        op.drop_table(table)
