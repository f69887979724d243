"""A run started by a chain names the upstream run it answers, and how deep in a chain it is
(docs/events.md, "Chains"): `runs.upstream_run_id` and `runs.chain_depth`.

Revision ID: chained_runs
Revises: 0006
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "chained_runs"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, and NOT NULL with a default: SQLite adds both in place, no copy of the table.
    op.add_column("runs", sa.Column("upstream_run_id", sa.Text, nullable=True))
    op.add_column("runs", sa.Column("chain_depth", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("runs", "chain_depth")
    op.drop_column("runs", "upstream_run_id")
