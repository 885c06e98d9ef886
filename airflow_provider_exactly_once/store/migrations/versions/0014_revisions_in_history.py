"""One history: an epoch's revision records are read from ``epoch_history``, and ``epoch_revision`` goes.

Each event that makes or changes a revision record keeps the record whole (``revision_record``:
write, revision, status, generation, the run that wrote it, rows, files, snapshots) or names the
write a revision's commit replaced (``replaced_write_id``); a record is as its newest event says,
since its first (design.md D11). The retention clean-up never deletes those events.

The upgrade moves every ``epoch_revision`` row into the history as ``revision recorded`` events of
no actor: one at the row's ``created_at`` with the record as it was made (Committed, or Aborted
with its reason), and one at its ``updated_at`` for a row changed since (Committed again, or
Replaced). The downgrade rebuilds ``epoch_revision`` from the events, the way the package reads
them, and deletes the ``revision recorded`` events, which 0013's package does not know.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

RECORDED = "revision recorded"
_FACTS = ("write_id", "revision", "status", "generation", "dag_id", "run_id", "try_number", "rows", "files")


def upgrade() -> None:
    op.add_column("epoch_history", sa.Column("revision_record", sa.Text(), nullable=True))
    op.add_column("epoch_history", sa.Column("replaced_write_id", sa.String(36), nullable=True))
    if not op.get_context().as_sql:  # a database rendered offline from nothing has no revision rows
        bind = op.get_bind()
        kept = bind.execute(sa.text("SELECT * FROM epoch_revision ORDER BY sink_id, epoch, revision, write_id"))
        events = [(e["at"], n, e) for row in kept.mappings().all() for n, e in enumerate(_events(row))]
        # in time order, a row's second event after its first: a record is as its newest event says
        for _, _, event in sorted(events, key=lambda t: t[:2]):
            bind.execute(
                sa.text(
                    "INSERT INTO epoch_history (sink_id, epoch, event, write_id, revision, actor, reason, at, "
                    f"revision_record, replaced_write_id) VALUES (:sink_id, :epoch, '{RECORDED}', :write_id, "
                    ":revision, 'unknown', :reason, :at, :revision_record, :replaced_write_id)"
                ),
                event,
            )
    op.drop_table("epoch_revision")


def _events(row: sa.RowMapping) -> list[dict[str, Any]]:
    """The ``revision recorded`` events of one ``epoch_revision`` row (see the module docstring)."""
    if row["status"] not in ("Committed", "Replaced", "Aborted"):
        raise RuntimeError(
            f"epoch_revision of sink {row['sink_id']!r} epoch {row['epoch']} write {row['write_id']} has status "
            f"{row['status']!r}, which no release wrote; correct it to Committed, Replaced or Aborted and upgrade again"
        )
    made = {k: row[k] for k in _FACTS} | {
        "status": "Aborted" if row["status"] == "Aborted" else "Committed",
        "committed": None if row["committed"] is None else json.loads(row["committed"]),
    }
    event = {k: row[k] for k in ("sink_id", "epoch", "write_id", "revision", "reason")} | {
        "at": row["created_at"],
        "revision_record": json.dumps(made),
        "replaced_write_id": None,
    }
    if row["status"] == "Replaced":
        replaced = {"reason": None, "revision_record": None, "replaced_write_id": row["write_id"]}
        return [event, event | replaced | {"at": row["updated_at"]}]
    return [event] if row["updated_at"] == row["created_at"] else [event, event | {"at": row["updated_at"]}]


def downgrade() -> None:
    if op.get_context().as_sql:
        raise RuntimeError("the downgrade from 0014 rebuilds epoch_revision in Python; run it against the database")
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
    bind = op.get_bind()
    events = bind.execute(
        sa.text(
            "SELECT sink_id, epoch, reason, at, revision_record, replaced_write_id FROM epoch_history "
            "WHERE revision_record IS NOT NULL OR replaced_write_id IS NOT NULL ORDER BY id"
        )
    ).all()
    records: dict[tuple[str, int, str], dict[str, Any]] = {}
    for sink_id, epoch, reason, at, revision_record, replaced_write_id in events:
        if revision_record is not None:
            made = json.loads(revision_record)
            key = (sink_id, epoch, made["write_id"])
            since = records[key]["created_at"] if key in records else at
            committed = None if made["committed"] is None else json.dumps(made["committed"], sort_keys=True)
            records[key] = {k: made[k] for k in _FACTS} | {
                "sink_id": sink_id,
                "epoch": epoch,
                "committed": committed,
                "reason": reason if made["status"] == "Aborted" else None,
                "created_at": since,
                "updated_at": at,
            }
        if (sink_id, epoch, replaced_write_id) in records:
            records[(sink_id, epoch, replaced_write_id)] |= {"status": "Replaced", "updated_at": at}
    for values in records.values():
        bind.execute(
            sa.text(f"INSERT INTO epoch_revision ({', '.join(values)}) VALUES ({', '.join(':' + k for k in values)})"),
            values,
        )
    bind.execute(sa.text("DELETE FROM epoch_history WHERE event = :e"), {"e": RECORDED})
    with op.batch_alter_table("epoch_history") as batch:
        batch.drop_column("replaced_write_id")
        batch.drop_column("revision_record")
