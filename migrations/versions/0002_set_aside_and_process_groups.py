"""Outbox writes the server can never take are set aside, not deleted; a run keeps its
command's process group, so a restart after a crash can stop what is left of it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, so SQLite adds it in place: no copy of a large outbox.
    op.add_column("outbox", sa.Column("set_aside_at", sa.Float, nullable=True))
    op.add_column("runs", sa.Column("process_group", sa.Integer, nullable=True))
    op.add_column("runs", sa.Column("process_start", sa.Text, nullable=True))


def downgrade() -> None:
    # SQLite drops a column in place (3.35 and later); a batch copy would trip on the views.
    op.drop_column("runs", "process_start")
    op.drop_column("runs", "process_group")
    op.drop_column("outbox", "set_aside_at")
