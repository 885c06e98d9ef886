"""Each epoch's metadata in ``epoch_metadata`` (migration 0006): moved there and back by the migration,
kept the write's own through every transition that hands the epoch to another write, and left alone
by the transitions that do not, which read the row back from the statement that changed it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from tests.store.store_helpers import another_process
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


class _Statements:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(" ".join(statement.split()))


def _statements(store: SqlSinkStateStore, action: Callable[[], object]) -> list[str]:
    """The queries and changes ``action`` ran (no transaction control, settings or connection checks)."""
    recorder = _Statements()
    sa.event.listen(store.engine, "before_cursor_execute", recorder)
    try:
        action()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", recorder)
    return [s for s in recorder.seen if s.split(" ", 1)[0].upper() in {"SELECT", "INSERT", "UPDATE", "DELETE"}]


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def test_the_migration_moves_the_metadata_out_of_the_row_and_back(fresh_url: str, engine: sa.Engine) -> None:
    older = make_pre_commit("old-sink", EPOCH, files=3)
    written = make_pre_commit("old-sink", EPOCH + 1)
    accented = written.model_copy(update={"tables": [written.tables[0].model_copy(update={"table": "db.évents"})]})
    texts = {older.epoch: older.to_json(), accented.epoch: accented.to_json()}
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0005")
        for pre, status in ((older, "Committed"), (accented, "Pending")):
            connection.execute(
                sa.text(
                    "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, metadata, created_at, "
                    "updated_at) VALUES (:s, :e, :status, :w, :m, '2025-01-01 00:00:00', '2025-01-01 00:00:00')"
                ),
                {"s": pre.sink_id, "e": pre.epoch, "status": status, "w": pre.write_id, "m": texts[pre.epoch]},
            )
    forget_applied()

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    try:
        assert "metadata" not in _columns(engine, "pending_sink_state")
        with engine.connect() as connection:
            moved = connection.execute(
                sa.text("SELECT epoch, write_id, metadata_bytes, metadata FROM epoch_metadata ORDER BY epoch")
            ).all()
        assert [(e, w, m) for e, w, _, m in moved] == [
            (older.epoch, older.write_id, texts[older.epoch]),
            (accented.epoch, accented.write_id, texts[accented.epoch]),
        ]
        assert [size for _, _, size, _ in moved] == [len(texts[e].encode()) for e, *_ in moved]
        for pre in (older, accented):
            row = store.get(pre.sink_id, pre.epoch)
            assert row is not None and row.pre_commit == pre
        assert len(store.epochs_with_status("old-sink", EpochStatus.PENDING)) == 1
    finally:
        store.dispose()

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0005")
    assert "epoch_metadata" not in sa.inspect(engine).get_table_names()
    with engine.connect() as connection:
        back = connection.execute(sa.text("SELECT epoch, metadata FROM pending_sink_state ORDER BY epoch")).all()
    assert back == sorted(texts.items())
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(  # NOT NULL again, as 0001 made it
            sa.text(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, created_at, updated_at) "
                "VALUES ('s', 1, 'Pending', 'w', '2025-01-01 00:00:00', '2025-01-01 00:00:00')"
            )
        )
    forget_applied()


def test_deciding_and_marking_a_commit_write_one_statement_and_its_event_and_leave_the_metadata_alone(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    # Another epoch's metadata first, of another size: the size read back must be this write's.
    store.insert_pending(make_pre_commit(sink_id, EPOCH - 1, files=3), run_id="scheduled__0", try_number=1)
    pre = make_pre_commit(sink_id, EPOCH, files=50)
    store.insert_pending(pre, run_id="scheduled__1", try_number=1)

    decide = _statements(store, lambda: store.decide_commit(sink_id, EPOCH, write_id=pre.write_id))
    mark = _statements(
        store, lambda: store.mark_committed(sink_id, EPOCH, write_id=pre.write_id, committed={"db.events": "7"})
    )

    for statements in (decide, mark):  # the change, read back by itself, and its history event (D19)
        assert len(statements) == 2, statements
        statement, event = statements
        assert statement.upper().startswith("UPDATE PENDING_SINK_STATE") and "RETURNING" in statement.upper()
        assert event.upper().startswith("INSERT INTO EPOCH_HISTORY")
    row = store.get(sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.pre_commit is pre


def test_a_first_persist_inserts_the_row_and_its_metadata_reading_only_the_clean_up_queue(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    """The row itself is not read first (its primary key refuses a second one); the queue is, in the
    same transaction, so that persist needs no transaction of its own to refuse a discarded write."""
    pre = make_pre_commit(sink_id, EPOCH)
    statements = _statements(store, lambda: store.insert_pending(pre, run_id="scheduled__1", try_number=1))
    assert [s.split(" ", 3)[:3] for s in statements] == [
        ["INSERT", "INTO", "pending_sink_state"],
        ["SELECT", "sink_cleanup.id", "FROM"],
        ["INSERT", "INTO", "epoch_metadata"],
        ["INSERT", "INTO", "epoch_history"],
    ]


@pytest.mark.parametrize(("run_id", "try_number", "dag_id"), [("scheduled__1", 2, "events_dag"), (None, None, None)])
def test_the_record_a_first_persist_returns_is_the_row_as_read_back(
    store: SqlSinkStateStore,
    meta_url: str,
    sink_id: str,
    run_id: str | None,
    try_number: int | None,
    dag_id: str | None,
) -> None:
    """The record is built from the values inserted and the timestamps the insert read back, not
    from the row read again: it must be what a read of the row gives, field by field."""
    pre = make_pre_commit(sink_id, EPOCH, files=4)
    inserted = store.insert_pending(pre, run_id=run_id, try_number=try_number, dag_id=dag_id)
    assert inserted.pre_commit is pre
    read = _read_afresh(meta_url, sink_id)
    assert read.pre_commit is not pre and read.pre_commit == pre
    assert inserted == read
    assert inserted.created_at == inserted.updated_at and inserted.created_at.tzinfo is not None


def _read_afresh(meta_url: str, sink_id: str, epoch: int = EPOCH) -> Any:
    with another_process(meta_url) as store:
        return store.get(sink_id, epoch)


def test_every_new_write_of_an_epoch_brings_its_own_metadata(
    store: SqlSinkStateStore, meta_url: str, sink_id: str
) -> None:
    """Replaced, re-opened, revised and a revision aborted: the row and its metadata name the same write."""
    first, second, third, fourth = (make_pre_commit(sink_id, EPOCH, files=n) for n in range(1, 5))
    store.insert_pending(first, run_id="r", try_number=1)
    store.replace_write(
        second, expected_status=EpochStatus.PENDING, expected_write_id=first.write_id, run_id="r", try_number=2
    )
    assert _read_afresh(meta_url, sink_id).pre_commit == second

    store.decide_commit(sink_id, EPOCH, write_id=second.write_id)
    store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "1"})
    store.reopen_committed(third, expected_write_id=second.write_id, run_id="r", try_number=3, reason="re-created")
    assert _read_afresh(meta_url, sink_id).pre_commit == third

    store.decide_commit(sink_id, EPOCH, write_id=third.write_id)
    store.mark_committed(sink_id, EPOCH, write_id=third.write_id, committed={"db.events": "2"})
    store.revisions.open_revision(fourth, expected_write_id=third.write_id, run_id="r", try_number=4)
    revision = _read_afresh(meta_url, sink_id)
    assert revision.pre_commit == fourth and revision.replaces.pre_commit == third

    store.revisions.abort_revision(sink_id, EPOCH, write_id=fourth.write_id, reason="given up")
    restored = _read_afresh(meta_url, sink_id)
    assert (restored.status, restored.write_id, restored.pre_commit) == (EpochStatus.COMMITTED, third.write_id, third)
    assert [c.pre_commit for c in store.cleanups(sink_id)] == [first, fourth]

    aborted, again = make_pre_commit(sink_id, EPOCH + 1), make_pre_commit(sink_id, EPOCH + 1, files=3)
    store.insert_aborted(aborted, reason="never persisted")
    store.replace_write(
        again, expected_status=EpochStatus.ABORTED, expected_write_id=aborted.write_id, run_id="r", try_number=1
    )
    row = _read_afresh(meta_url, sink_id, EPOCH + 1)
    assert row is not None and row.pre_commit == again


def test_only_the_committed_mark_is_not_waited_for_on_disk(
    store: SqlSinkStateStore, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark is repaired from the sink's marker when a crash of the database's host loses it; the
    write's row and the commit decision must be on disk before anything is made visible."""
    recorded: dict[str, bool] = {}
    database = store._db
    real = database.transaction

    def recording(action: str, *, write: bool, durable: bool = True) -> Any:
        if write:
            recorded[action.split(" ", 1)[0]] = durable
        return real(action, write=write, durable=durable)

    monkeypatch.setattr(database, "transaction", recording)
    pre = make_pre_commit(sink_id, EPOCH)
    store.insert_pending(pre, run_id="r", try_number=1)
    store.decide_commit(sink_id, EPOCH, write_id=pre.write_id)
    store.mark_committed(sink_id, EPOCH, write_id=pre.write_id, committed={"db.events": "7"})
    assert recorded == {"persisting": True, "deciding": True, "marking": False}


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_that_need_not_be_durable_commits_without_waiting_for_the_disk(
    store: SqlSinkStateStore, backend: str, durable: bool
) -> None:
    for _ in range(2):  # the setting stays with the pooled connection: each write sets its own
        for wanted in (durable, not durable, durable):
            with store._db.transaction("checking", write=True, durable=wanted) as session:
                if backend == "sqlite":
                    level = session.execute(sa.text("PRAGMA synchronous")).scalar()
                    assert level == (2 if wanted else 1)  # FULL, NORMAL
                else:
                    assert session.execute(sa.text("SHOW synchronous_commit")).scalar() == ("on" if wanted else "off")


def test_a_read_that_meets_a_new_write_between_its_statements_returns_one_write_whole(
    store: SqlSinkStateStore, meta_url: str, sink_id: str
) -> None:
    """PostgreSQL's statements each see the latest commits: a write replaced between reading the row
    and fetching its metadata must not leave the row of one write with the metadata of none."""
    first, second = make_pre_commit(sink_id, EPOCH), make_pre_commit(sink_id, EPOCH, files=3)
    store.insert_pending(first, run_id="r", try_number=1)
    other = SqlSinkStateStore(meta_url)
    replaced: list[bool] = []

    def replace_in_between(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not replaced and "metadata_zlib" in statement:  # the statement reading the metadata
            replaced.append(True)
            other.replace_write(
                second, expected_status=EpochStatus.PENDING, expected_write_id=first.write_id, run_id="r", try_number=2
            )

    with another_process(meta_url) as reading:  # it never parsed the write: the metadata is fetched
        sa.event.listen(reading.engine, "before_cursor_execute", replace_in_between)
        try:
            row = reading.get(sink_id, EPOCH)
        finally:
            sa.event.remove(reading.engine, "before_cursor_execute", replace_in_between)
            other.dispose()
    assert replaced
    assert row is not None and row.pre_commit.write_id == row.write_id
    assert row.pre_commit == (first if row.write_id == first.write_id else second)
