"""New writes' pre-commit metadata stored deflated, in ``epoch_metadata.metadata_zlib``.

The JSON of an epoch of 10,000 files is megabytes, and its descriptors repeat the same column names
and path prefix: zlib at its fastest level shrinks it many times over in less time than SQLite takes
to write (and wait for) the pages it saves, or than psycopg2 takes to quote it into the ``INSERT``'s
text for PostgreSQL to parse. Binary, so nothing is spent on an encoding such as base64; on
PostgreSQL kept out of line without compression (``STORAGE EXTERNAL``), as it is compressed already.

A row holds one form: the deflated JSON, or (rows written before this revision) the JSON text in
``metadata``, now nullable, which is read as before. ``metadata_bytes`` stays the size of the JSON in
UTF-8 bytes, whichever form holds it. No row is rewritten by the upgrade.

The downgrade inflates every deflated row back into ``metadata`` (in Python: neither database
inflates zlib), so it cannot be rendered as SQL offline, and drops the column.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import zlib

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("epoch_metadata") as batch:
        batch.add_column(sa.Column("metadata_zlib", sa.LargeBinary(), nullable=True))
        batch.alter_column("metadata", existing_type=sa.Text(), nullable=True)
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER TABLE epoch_metadata ALTER COLUMN metadata_zlib SET STORAGE EXTERNAL")


def downgrade() -> None:
    if op.get_context().as_sql:
        raise RuntimeError(
            "the downgrade from 0007 inflates the deflated metadata in Python; run it against the database, not as SQL"
        )
    bind = op.get_bind()
    deflated = bind.execute(sa.text("SELECT sink_id, epoch FROM epoch_metadata WHERE metadata IS NULL")).all()
    for sink_id, epoch in deflated:  # one at a time: each is megabytes once inflated
        key = {"s": sink_id, "e": epoch}
        packed = bind.execute(
            sa.text("SELECT metadata_zlib FROM epoch_metadata WHERE sink_id = :s AND epoch = :e"), key
        ).scalar_one()
        text = zlib.decompress(bytes(packed)).decode("utf-8")
        bind.execute(
            sa.text("UPDATE epoch_metadata SET metadata = :m, metadata_zlib = NULL WHERE sink_id = :s AND epoch = :e"),
            {**key, "m": text},
        )
    with op.batch_alter_table("epoch_metadata") as batch:
        batch.drop_column("metadata_zlib")
        batch.alter_column("metadata", existing_type=sa.Text(), nullable=False)
