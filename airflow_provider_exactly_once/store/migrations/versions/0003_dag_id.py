"""The DAG of each epoch, and the indexes the operations views list epochs by.

``dag_id`` lets the sink view link an epoch to its DAG run and apply per-DAG permissions; it is
nullable because rows written before this revision (and writes coordinated outside Airflow) have
none. The listing indexes make "newest epochs first" a bounded index scan whatever the history:
per sink and status (``(sink_id, status, epoch)``), per status across sinks
(``(status, epoch, sink_id)``) and across everything (``(epoch, sink_id)``); per sink alone the
primary key already serves.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column is added in place on both databases (no table rebuild, no default to fill).
    op.add_column("pending_sink_state", sa.Column("dag_id", sa.String(250), nullable=True))
    op.create_index("ix_pending_sink_state_sink_id_status_epoch", "pending_sink_state", ["sink_id", "status", "epoch"])
    op.create_index("ix_pending_sink_state_status_epoch_sink_id", "pending_sink_state", ["status", "epoch", "sink_id"])
    op.create_index("ix_pending_sink_state_epoch_sink_id", "pending_sink_state", ["epoch", "sink_id"])


def downgrade() -> None:
    op.drop_index("ix_pending_sink_state_epoch_sink_id", table_name="pending_sink_state")
    op.drop_index("ix_pending_sink_state_status_epoch_sink_id", table_name="pending_sink_state")
    op.drop_index("ix_pending_sink_state_sink_id_status_epoch", table_name="pending_sink_state")
    with op.batch_alter_table("pending_sink_state") as batch:
        batch.drop_column("dag_id")
