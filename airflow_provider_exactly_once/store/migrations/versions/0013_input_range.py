"""The snapshot ranges incremental epochs read: ``input_range``, one row per (sink, epoch).

An epoch whose input is an upstream Iceberg table reads the snapshots after the position its sink
last committed, up to the snapshot current when it was first written (``core.input_ranges``). The
range is reserved here before the write and never changed, so a retry or a reprocess reads it again;
``position`` chains a sink's reservations and is unique, so two epochs never start from one place.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "input_range",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(512), nullable=False),
        sa.Column("after_snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("to_snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("reserved_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sink_id", "epoch", name="pk_input_range"),
        sa.UniqueConstraint("sink_id", "position", name="uq_input_range_sink_id_position"),
    )


def downgrade() -> None:
    op.drop_table("input_range")
