"""Revisions of an epoch: a newer generation's write replaces the committed one.

``pending_sink_state.revision`` counts the epoch's replacements (0: its first write).
``replaces`` holds, while a revision is Pending, the committed write it will replace (its
pre-commit, snapshots and table identities): the revision's commit removes exactly those files, and
an abort of the revision restores that write as the epoch's, Committed. ``epoch_revision`` keeps
every revision on record for operators (write, generation, run and try, status, snapshots, rows).
``sink_cleanup.removed_by`` marks the clean-up of a replaced write: its files stay while any retained
snapshot older than the replacing snapshots may reference them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "pending_sink_state", sa.Column("revision", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("pending_sink_state", sa.Column("replaces", sa.Text(), nullable=True))
    op.add_column("sink_cleanup", sa.Column("removed_by", sa.Text(), nullable=True))
    op.create_table(
        "epoch_revision",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("revision", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("generation", sa.String(40), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("committed", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sink_id", "epoch", "write_id", name="pk_epoch_revision"),
    )


def downgrade() -> None:
    op.drop_table("epoch_revision")
    with op.batch_alter_table("sink_cleanup") as batch:
        batch.drop_column("removed_by")
    with op.batch_alter_table("pending_sink_state") as batch:
        batch.drop_column("replaces")
        batch.drop_column("revision")
