"""Every epoch's history: ``epoch_history``, one row per transition, appended in its transaction.

The epoch's row keeps where it stands; the history keeps how it got there (persists, decisions,
commits, aborts with their cause, revisions, refusals, clean-ups), with the run, the try, how the
run was started and who acted (``core.epochs``). Epochs from before have no history; nothing is
back-filled, and the downgrade drops the table.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "epoch_history",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False, autoincrement=True),
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("status", sa.String(16), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("run_type", sa.String(32), nullable=True),
        sa.Column("clear_number", sa.Integer(), nullable=True),
        sa.Column("actor", sa.String(32), nullable=False),
        sa.Column("actor_name", sa.String(250), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_epoch_history"),
    )
    op.create_index("ix_epoch_history_sink_id_epoch_id", "epoch_history", ["sink_id", "epoch", "id"])


def downgrade() -> None:
    op.drop_index("ix_epoch_history_sink_id_epoch_id", table_name="epoch_history")
    op.drop_table("epoch_history")
