"""The DAG runs that persisted writes: their logical date and data interval.

``dag_run_record`` keeps, per (DAG, run id), what Airflow gave the run: its logical date and data
interval. The views show them beside each epoch and each revision, so an operator selects the run
of the day they mean (a ``dags test`` run's logical date is its interval's end, a scheduled run's
its start), also after Airflow deleted the run. Rows written before have no record; the views then
show the interval start the epoch stands for.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dag_run_record",
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("logical_date", sa.DateTime(timezone=True), nullable=True),
        sa.Column("interval_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("interval_end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", name="pk_dag_run_record"),
    )


def downgrade() -> None:
    op.drop_table("dag_run_record")
