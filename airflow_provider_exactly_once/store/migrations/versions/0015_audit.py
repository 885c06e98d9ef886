"""An audited sink's write keeps its audit on its row: ``pending_sink_state.audit``.

Write, audit, publish (design.md D23): the write is committed to an audit branch of each table,
its checks run, and only then is it published to the sink's branch. The row keeps the audit branch,
the audit snapshots and the verdict as JSON (``core.epochs.EpochAudit``); NULL for every row written
before and for every sink that is not audited.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column is added in place on both databases (no table rebuild, no default to fill).
    op.add_column("pending_sink_state", sa.Column("audit", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pending_sink_state") as batch:
        batch.drop_column("audit")
