"""The sink registry and per-sink locks of the recovery DAG.

``sink_registry`` records every sink's configuration (and its checkpoint source's) as the epoch
operators use them, so the recovery DAG can rebuild each sink's coordinator without importing the
user's DAG files. ``sink_lock`` lets one recovery at a time work on a sink, whatever schedules,
manual triggers or zombie tasks overlap. An index on ``(sink_id, write_id)`` lets the orphan scan ask
"is this write known?" without reading the sink's whole history.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _now() -> sa.TextClause:
    if op.get_bind().dialect.name == "sqlite":
        return sa.text("(strftime('%Y-%m-%d %H:%M:%f','now'))")
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "sink_registry",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("sink_config", sa.Text(), nullable=False),
        sa.Column("checkpoint_config", sa.Text(), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("sink_id", name="pk_sink_registry"),
    )
    op.create_table(
        "sink_lock",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("holder", sa.String(250), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sink_id", name="pk_sink_lock"),
    )
    op.create_index("ix_pending_sink_state_sink_id_write_id", "pending_sink_state", ["sink_id", "write_id"])


def downgrade() -> None:
    op.drop_index("ix_pending_sink_state_sink_id_write_id", table_name="pending_sink_state")
    op.drop_table("sink_lock")
    op.drop_table("sink_registry")
