"""Each stored write's head beside its metadata: ``head_zlib`` on ``epoch_metadata`` and
``replaced_metadata``.

The head is the write's metadata without its data file descriptors, plus each table's file count,
rows and paths (``store.rows``). A commit task reads the head and parses the descriptors only
if its commit needs them; parsing 10,000 of them cost more than the rest of the commit. Rows written
before have no head and are read whole, as before; nothing is rewritten, and the downgrade drops the
column.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_TABLES = ("epoch_metadata", "replaced_metadata")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("head_zlib", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("head_zlib")
