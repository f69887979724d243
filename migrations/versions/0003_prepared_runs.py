"""Fires are prepared ahead of their due time: a run row names the due time it was prepared
for until its program starts, and an outbox write can be held until a due time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, so SQLite adds them in place: no copy of a large runs table or outbox.
    op.add_column("runs", sa.Column("prepared_for", sa.Float, nullable=True))
    op.add_column("outbox", sa.Column("not_before", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("outbox", "not_before")
    op.drop_column("runs", "prepared_for")
