"""Background runs' heartbeats: the server running a ``queued`` or ``in_progress`` response
writes the time here every few seconds, so a run whose server died can be told from one that
runs on another replica.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("heartbeat_at", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("responses", "heartbeat_at")
