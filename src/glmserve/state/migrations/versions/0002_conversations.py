"""Conversations (OpenAI's Conversations API): one row per conversation, one per item.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
    )
    op.create_table(
        "conversation_items",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.String(80), nullable=False),
        sa.Column("item_id", sa.String(80), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
    )
    op.create_index("conversation_items_conversation", "conversation_items", ["conversation_id", "seq"])


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_table("conversations")
