"""Files stored in pieces: ``file_chunks`` (``file_id``, ``seq`` from 0, ``data`` of at most
``state/files.CHUNK_BYTES``) replaces ``files.content``, so that an upload is written, and a
file read, a piece at a time (a 64 MiB file was one value, read and written whole). A file
stored before this revision becomes its one piece. And an index on ``batch_lines (batch_id,
line_no)``: a batch's results are read a page at a time, in the input's order.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _recreate() -> str:
    """SQLite drops a column by copying the table (its ``DROP COLUMN`` came in 3.35; RHEL 9 and
    Debian 11 have 3.34); PostgreSQL alters it."""
    return "always" if op.get_bind().dialect.name == "sqlite" else "never"


def upgrade() -> None:
    op.create_table("file_chunks",
                    sa.Column("file_id", sa.String(80), primary_key=True),
                    sa.Column("seq", sa.Integer, primary_key=True),
                    sa.Column("data", sa.LargeBinary, nullable=False))
    op.execute("INSERT INTO file_chunks (file_id, seq, data) SELECT id, 0, content FROM files")
    with op.batch_alter_table("files", recreate=_recreate()) as files:  # SQLite < 3.35 has no DROP COLUMN
        files.drop_column("content")
    op.create_index("batch_lines_order", "batch_lines", ["batch_id", "line_no"])


def downgrade() -> None:
    op.drop_index("batch_lines_order", "batch_lines")
    op.add_column("files", sa.Column("content", sa.LargeBinary, nullable=True))
    conn = op.get_bind()
    for (file_id,) in conn.execute(sa.text("SELECT id FROM files")).all():  # one file's pieces at a time
        pieces = conn.execute(sa.text("SELECT data FROM file_chunks WHERE file_id = :id ORDER BY seq"), {"id": file_id})
        conn.execute(sa.text("UPDATE files SET content = :content WHERE id = :id"),
                     {"content": b"".join(bytes(row.data) for row in pieces), "id": file_id})
    op.drop_table("file_chunks")
