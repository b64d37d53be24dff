"""Files (``/v1/files``) and batches (``/v1/batches``, ``/v1/messages/batches``): one row per
file with its bytes, one per batch, one per request line of a batch with its result.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
    )
    op.create_index("files_owner", "files", ["owner", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("api", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index("batches_owner", "batches", ["owner", "created_at"])
    op.create_index("batches_status", "batches", ["status"])
    op.create_table(
        "batch_lines",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("batch_id", sa.String(80), nullable=False),
        sa.Column("line_no", sa.Integer, nullable=False),
        sa.Column("custom_id", sa.Text, nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("done", sa.Boolean, nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.Float, nullable=True),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
    )
    op.create_index("batch_lines_batch", "batch_lines", ["batch_id", "done", "line_no"])
    op.create_index("batch_lines_pending", "batch_lines", ["done", "claimed_at"])


def downgrade() -> None:
    op.drop_table("batch_lines")
    op.drop_table("batches")
    op.drop_table("files")
