"""Why an epoch was aborted, as a column (``pending_sink_state.abort_cause``, migration 0009): the
upgrade derives it for earlier rows from their reason's beginning, the store writes it with the
Aborted mark and clears it with the next write; on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import AbortCause, EpochStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied

NOW = datetime(2026, 11, 27, tzinfo=UTC)

#: (epoch, status, reason) as earlier versions wrote them, and the cause the upgrade gives each.
EARLIER_ROWS = [
    (1, "Aborted", "upsert conflict: the epoch is written again: table t moved", "upsert_conflict"),
    (2, "Aborted", "checkpoint FAILED; the write also conflicted: table t moved", "checkpoint_failed"),
    (3, "Aborted", "recovery: checkpoint FAILED", "checkpoint_failed"),
    (4, "Aborted", "task abort of run r: an upstream step failed", None),
    (5, "Aborted", "Checkpoint failed", None),  # not the package's words: no cause is guessed
    (6, "Aborted", None, None),
    (7, "Pending", "upsert conflict: the epoch is written again: a failed commit noted", None),
]


def _causes(engine: sa.Engine) -> dict[int, str | None]:
    with engine.connect() as connection:
        found = connection.execute(sa.text("SELECT epoch, abort_cause FROM pending_sink_state ORDER BY epoch"))
        return {int(epoch): cause for epoch, cause in found}


def test_the_upgrade_derives_the_cause_of_earlier_rows_and_the_downgrade_drops_it(
    fresh_url: str, engine: sa.Engine
) -> None:
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0008")
        for epoch, status, reason, _ in EARLIER_ROWS:
            connection.execute(
                sa.text(
                    "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, created_at, updated_at, error, "
                    "revision) VALUES ('orders', :epoch, :status, :write_id, :now, :now, :error, 0)"
                ),
                {"epoch": epoch, "status": status, "write_id": str(uuid.uuid4()), "now": NOW, "error": reason},
            )
    columns = {c["name"] for c in sa.inspect(engine).get_columns("pending_sink_state")}
    assert "abort_cause" not in columns

    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0009")
    assert _causes(engine) == {epoch: cause for epoch, _, _, cause in EARLIER_ROWS}

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0008")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("pending_sink_state")}
    assert "abort_cause" not in columns
    with engine.connect() as connection:  # the rows themselves stay
        assert connection.execute(sa.text("SELECT count(*) FROM pending_sink_state")).scalar() == len(EARLIER_ROWS)
    forget_applied()

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    try:
        assert store.get("orders", 99) is None
        assert _causes(engine)[1] == "upsert_conflict"
    finally:
        store.dispose()
        forget_applied()


def _write(sink_id: str, epoch: int) -> PreCommit:
    location = f"/data/_eo/{uuid.uuid4()}"
    return PreCommit.parse(
        {
            "sink_id": sink_id,
            "epoch": epoch,
            "write_id": location.rsplit("/", 1)[1],
            "tables": [{"table": "db.t", "location": location, "data_files": []}],
        }
    )


def test_the_store_keeps_the_cause_with_the_aborted_mark_and_clears_it_with_the_next_write(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    first = _write(sink_id, 1)
    store.insert_pending(first, run_id="r", try_number=1)
    aborted = store.mark_aborted(sink_id, 1, write_id=first.write_id, reason="c", cause=AbortCause.UPSERT_CONFLICT)
    assert aborted.status is EpochStatus.ABORTED and aborted.abort_cause is AbortCause.UPSERT_CONFLICT
    assert store.get(sink_id, 1) == aborted

    again = _write(sink_id, 1)
    replaced = store.replace_write(
        again, expected_status=EpochStatus.ABORTED, expected_write_id=first.write_id, run_id="r", try_number=2
    )
    assert replaced.status is EpochStatus.PENDING and replaced.abort_cause is None

    never_persisted = store.insert_aborted(_write(sink_id, 2), reason="r", cause=AbortCause.GIVEN_UP)
    assert never_persisted.abort_cause is AbortCause.GIVEN_UP
    unknown = store.mark_aborted(sink_id, 1, write_id=again.write_id, reason="by hand")
    assert unknown.abort_cause is None
