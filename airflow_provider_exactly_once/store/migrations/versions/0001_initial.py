"""The initial meta store: pending_sink_state, sink_cleanup, checkpoint_state, epoch_allocation.

Written out explicitly rather than from the models, so that this revision keeps creating the same
schema after the models have moved on (later revisions then migrate it forward).

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_EPOCH_STATUSES = "status IN ('Pending', 'Committed', 'Aborted')"
_CHECKPOINT_STATUSES = "status IN ('COMPLETED', 'FAILED', 'PENDING')"


def _now() -> sa.TextClause:
    if op.get_bind().dialect.name == "sqlite":
        return sa.text("(strftime('%Y-%m-%d %H:%M:%f','now'))")
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "pending_sink_state",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("commit_decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("committed", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("sink_id", "epoch", name="pk_pending_sink_state"),
        sa.CheckConstraint(_EPOCH_STATUSES, name="ck_pending_sink_state_status"),
    )
    op.create_index("ix_pending_sink_state_sink_id_status", "pending_sink_state", ["sink_id", "status"])

    op.create_table(
        "sink_cleanup",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=False,
            autoincrement=True,
        ),
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sink_cleanup"),
    )
    op.create_index("ix_sink_cleanup_sink_id_done_at", "sink_cleanup", ["sink_id", "done_at"])
    op.create_index("ix_sink_cleanup_sink_id_epoch_write_id", "sink_cleanup", ["sink_id", "epoch", "write_id"])

    op.create_table(
        "checkpoint_state",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("name", "epoch", name="pk_checkpoint_state"),
        sa.CheckConstraint(_CHECKPOINT_STATUSES, name="ck_checkpoint_state_status"),
    )

    op.create_table(
        "epoch_allocation",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("sink_id", "run_id", name="pk_epoch_allocation"),
        sa.UniqueConstraint("sink_id", "epoch", name="uq_epoch_allocation_sink_id_epoch"),
    )


def downgrade() -> None:
    op.drop_table("epoch_allocation")
    op.drop_table("checkpoint_state")
    op.drop_index("ix_sink_cleanup_sink_id_epoch_write_id", table_name="sink_cleanup")
    op.drop_index("ix_sink_cleanup_sink_id_done_at", table_name="sink_cleanup")
    op.drop_table("sink_cleanup")
    op.drop_index("ix_pending_sink_state_sink_id_status", table_name="pending_sink_state")
    op.drop_table("pending_sink_state")
