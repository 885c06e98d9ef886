"""Which incarnation of each table an epoch was committed to, and a warning an operator must see.

``table_uuids`` (JSON, table -> Iceberg table UUID at commit) lets a later write tell a table that
was dropped and re-created under the same name from the one that holds the epoch: a commit into
the old table is no proof for the new one. ``warning`` keeps what a persist found suspicious about
a Committed epoch (a sink id reused by another DAG) on the row, where the sink view shows it.
Both are nullable: rows committed before this revision have no recorded identity.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pending_sink_state", sa.Column("table_uuids", sa.Text(), nullable=True))
    op.add_column("pending_sink_state", sa.Column("warning", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pending_sink_state") as batch:
        batch.drop_column("warning")
        batch.drop_column("table_uuids")
