"""An outbox write can be conditional: sent with the record version it was made against, so
that a claim never overwrites an owner written on the server after the claim's read.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, so SQLite adds it in place: no copy of a large outbox.
    op.add_column("outbox", sa.Column("if_version", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("outbox", "if_version")
