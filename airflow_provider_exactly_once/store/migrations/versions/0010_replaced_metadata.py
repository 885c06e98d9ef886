"""The metadata of the write a revision replaces in a table of its own, ``replaced_metadata``, and
the clean-up queue taking metadata in either stored form.

A Pending revision's row carried the replaced write's metadata inside ``replaces``: megabytes of text
for a write of thousands of files, which SQLite wrote again with every ``UPDATE`` of the row (the
commit decision, the Committed mark). Now the revision's opening moves the replaced write's
``epoch_metadata`` row to ``replaced_metadata`` as stored (deflated, or pre-0007 text), and
``replaces`` keeps the rest (write id, snapshots, identities, revision, time). The revision's commit
copies it on to ``sink_cleanup``, which gains the deflated form and the text's size beside the
text (``metadata``, now nullable); every write queued for clean-up is copied so, in the database.

The upgrade moves the metadata out of the ``replaces`` of revisions in flight, deflated; no other row
is rewritten. The downgrade puts it back, and inflates the clean-up queue's deflated rows (in
Python: neither database inflates zlib), so it cannot be rendered as SQL offline.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import json
import zlib

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replaced_metadata",
        sa.Column("sink_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("metadata_bytes", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.Column("metadata_zlib", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("sink_id", "epoch", name="pk_replaced_metadata"),
    )
    with op.batch_alter_table("sink_cleanup") as batch:
        batch.add_column(sa.Column("metadata_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("metadata_zlib", sa.LargeBinary(), nullable=True))
        batch.alter_column("metadata", existing_type=sa.Text(), nullable=True)
    if op.get_context().dialect.name == "postgresql":
        # Compressed already: kept out of line as it is (as 0007 did for epoch_metadata).
        op.execute("ALTER TABLE replaced_metadata ALTER COLUMN metadata_zlib SET STORAGE EXTERNAL")
        op.execute("ALTER TABLE sink_cleanup ALTER COLUMN metadata_zlib SET STORAGE EXTERNAL")
    if op.get_context().as_sql:
        return  # no revision can be in flight in a database rendered offline from nothing
    bind = op.get_bind()
    in_flight = bind.execute(sa.text("SELECT sink_id, epoch FROM pending_sink_state WHERE replaces IS NOT NULL")).all()
    for sink_id, epoch in in_flight:  # one at a time: each carries megabytes
        key = {"s": sink_id, "e": epoch}
        kept = json.loads(
            bind.execute(
                sa.text("SELECT replaces FROM pending_sink_state WHERE sink_id = :s AND epoch = :e"), key
            ).scalar_one()
        )
        raw = json.dumps(kept.pop("metadata"), sort_keys=True).encode()
        bind.execute(
            sa.text(
                "INSERT INTO replaced_metadata (sink_id, epoch, write_id, metadata_bytes, metadata_zlib) "
                "VALUES (:s, :e, :w, :n, :z)"
            ),
            {**key, "w": kept["write_id"], "n": len(raw), "z": zlib.compress(raw, 1)},
        )
        bind.execute(
            sa.text("UPDATE pending_sink_state SET replaces = :r WHERE sink_id = :s AND epoch = :e"),
            {**key, "r": json.dumps(kept, sort_keys=True)},
        )


def _inflated(bind: sa.Connection, table: str, where: str, key: dict[str, object]) -> str:
    text, packed = bind.execute(sa.text(f"SELECT metadata, metadata_zlib FROM {table} WHERE {where}"), key).one()
    return str(text) if text is not None else zlib.decompress(bytes(packed)).decode("utf-8")


def downgrade() -> None:
    if op.get_context().as_sql:
        raise RuntimeError(
            "the downgrade from 0010 inflates the deflated metadata in Python; run it against the database, not as SQL"
        )
    bind = op.get_bind()
    for sink_id, epoch in bind.execute(sa.text("SELECT sink_id, epoch FROM replaced_metadata")).all():
        key = {"s": sink_id, "e": epoch}
        metadata = json.loads(_inflated(bind, "replaced_metadata", "sink_id = :s AND epoch = :e", key))
        kept = bind.execute(
            sa.text("SELECT replaces FROM pending_sink_state WHERE sink_id = :s AND epoch = :e"), key
        ).scalar()
        if kept is not None:
            bind.execute(
                sa.text("UPDATE pending_sink_state SET replaces = :r WHERE sink_id = :s AND epoch = :e"),
                {**key, "r": json.dumps({**json.loads(kept), "metadata": metadata}, sort_keys=True)},
            )
    for (cleanup_id,) in bind.execute(sa.text("SELECT id FROM sink_cleanup WHERE metadata IS NULL")).all():
        text = _inflated(bind, "sink_cleanup", "id = :i", {"i": cleanup_id})
        bind.execute(sa.text("UPDATE sink_cleanup SET metadata = :m WHERE id = :i"), {"m": text, "i": cleanup_id})
    with op.batch_alter_table("sink_cleanup") as batch:
        batch.drop_column("metadata_zlib")
        batch.drop_column("metadata_bytes")
        batch.alter_column("metadata", existing_type=sa.Text(), nullable=False)
    op.drop_table("replaced_metadata")
