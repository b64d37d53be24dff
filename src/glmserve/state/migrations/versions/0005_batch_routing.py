"""Batch lines that run where their model is served, retried after a transient refusal, and
recorded as failed after too many lost runs; batches that expire.

``batch_lines.model``: the request's ``model`` (a server claims only lines of models it
serves; NULL: any server); ``attempts``: how many times the line was claimed, ``retries``: how
many of those ended in a transient refusal (429, 503), ``not_before``: the earliest time it is
claimed again (its back-off), ``size``: the bytes of its request and result (what counts
against ``--store-max-bytes``); ``batches.expires_at``: the end of its completion window (epoch
seconds; NULL for batches made before this revision: they do not expire). And
``conversation_items.item_id`` becomes text: the client names its items, and an id past 80
characters failed on PostgreSQL after the generation (SQLite does not check a length).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_lines", sa.Column("model", sa.Text, nullable=True))
    op.add_column("batch_lines", sa.Column("attempts", sa.Integer, nullable=False, server_default="0"))
    op.add_column("batch_lines", sa.Column("retries", sa.Integer, nullable=False, server_default="0"))
    op.add_column("batch_lines", sa.Column("not_before", sa.Float, nullable=True))
    op.add_column("batches", sa.Column("expires_at", sa.Float, nullable=True))
    op.add_column("batch_lines", sa.Column("size", sa.BigInteger, nullable=False, server_default="0"))
    op.execute("UPDATE batch_lines SET size = length(request) + coalesce(length(result), 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("conversation_items", "item_id", type_=sa.Text)


def downgrade() -> None:
    for column in ("model", "attempts", "retries", "not_before", "size"):
        op.drop_column("batch_lines", column)
    op.drop_column("batches", "expires_at")
