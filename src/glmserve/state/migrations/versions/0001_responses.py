"""Stored responses: one row per response (its object and the input items it was made from).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("input_items", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
    )
    op.create_index("responses_expires_at", "responses", ["expires_at"])
    op.create_index("responses_created_at", "responses", ["created_at"])


def downgrade() -> None:
    op.drop_table("responses")
