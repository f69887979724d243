"""The notices this device sent or is sending (docs/notices.md): a notice is made once, its
channels are tried until each is delivered or given up, and a restart resumes them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("trigger_id", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("notice", sa.Text, nullable=False),
        sa.Column("pending", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_try_at", sa.Float, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_index("notices_created", "notices", ["created_at"])


def downgrade() -> None:
    op.drop_index("notices_created", table_name="notices")
    op.drop_table("notices")
