"""Why an epoch was aborted, as a value: ``pending_sink_state.abort_cause``.

The rewrite task writes an upsert epoch again only when its write was given up for a conflict with
the table; it read that from the words the reason began with. The cause is now a column
(``core.epochs.AbortCause``), written with the Aborted mark, and the reason stays the operator's
text. Rows aborted before get the cause their reason's beginning tells (the two beginnings the
package itself wrote for it); the others keep NULL, which no rule reads as a rewrite.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: (how the reason begins, the cause): the texts earlier versions wrote for these causes.
_CAUSE_OF_REASON = (
    ("upsert conflict: the epoch is written again", "upsert_conflict"),
    ("checkpoint FAILED", "checkpoint_failed"),
    ("recovery: checkpoint FAILED", "checkpoint_failed"),
)


def upgrade() -> None:
    # A nullable column is added in place on both databases (no table rebuild, no default to fill).
    op.add_column("pending_sink_state", sa.Column("abort_cause", sa.String(32), nullable=True))
    table = sa.table(
        "pending_sink_state",
        sa.column("status", sa.String),
        sa.column("error", sa.Text),
        sa.column("abort_cause", sa.String),
    )
    for prefix, cause in _CAUSE_OF_REASON:
        # substr, not LIKE: SQLite's LIKE ignores case, and these words were written exactly so.
        begins = sa.func.substr(table.c.error, 1, len(prefix)) == prefix
        op.execute(
            table.update()
            .where(table.c.status == "Aborted", table.c.abort_cause.is_(None), begins)
            .values(abort_cause=cause)
        )


def downgrade() -> None:
    with op.batch_alter_table("pending_sink_state") as batch:
        batch.drop_column("abort_cause")
