"""Running totals of stored bytes: ``store_usage`` holds each owner's bytes (its responses,
files, batch lines, and its conversations' items) and, in the row ``'*'``, all owners'
together, changed in the transaction of each write (``state/quota.py``), where before each
response write summed four whole tables. Conversation items whose conversation is gone (added
while it was being deleted) are deleted: they counted for no key and no route could reach them.
And ``batches.build``, ``batches.build_at``: an ending batch's output and error files are
written a piece at a time, each piece its own transaction (``state/batches.py``'s ``Build``),
where before one transaction held the write lock until the whole files were made.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OWNED = """
    SELECT owner, size AS bytes FROM responses
    UNION ALL SELECT owner, bytes FROM files
    UNION ALL SELECT c.owner, i.size FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id
    UNION ALL SELECT b.owner, l.size FROM batch_lines l JOIN batches b ON b.id = l.batch_id
"""


def upgrade() -> None:
    op.create_table("store_usage",
                    sa.Column("owner", sa.String(64), primary_key=True),
                    sa.Column("bytes", sa.BigInteger, nullable=False))
    op.add_column("batches", sa.Column("build", sa.Text, nullable=True))
    op.add_column("batches", sa.Column("build_at", sa.Float, nullable=True))
    op.execute("DELETE FROM conversation_items WHERE conversation_id NOT IN (SELECT id FROM conversations)")
    op.execute(f"INSERT INTO store_usage (owner, bytes) SELECT owner, SUM(bytes) FROM ({_OWNED}) owned GROUP BY owner")
    op.execute(f"INSERT INTO store_usage (owner, bytes) SELECT '*', COALESCE(SUM(bytes), 0) FROM ({_OWNED}) owned")


def downgrade() -> None:
    with op.batch_alter_table("batches", recreate="always" if op.get_bind().dialect.name == "sqlite" else "never") \
            as batch:
        batch.drop_column("build_at")
        batch.drop_column("build")
    op.drop_table("store_usage")
