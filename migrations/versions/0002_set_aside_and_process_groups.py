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
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("process_start")
        batch.drop_column("process_group")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("set_aside_at")
