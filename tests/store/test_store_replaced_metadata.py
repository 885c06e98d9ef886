"""The metadata of the write a revision replaces, kept apart from the epoch's row (migration 0010):
what each table holds through a revision's opening, commit and abort, what another process reads,
and the migration up and down with a revision in flight."""

from __future__ import annotations

import json
import zlib
from typing import Any

import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from tests.store.store_helpers import another_process
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000
G1 = "2024-06-01T01:00:00.000000Z/0000000000"
G2 = "2024-06-02T09:30:00.000000Z/0000000001"


def _write(sink_id: str, generation: str, files: int) -> PreCommit:
    return make_pre_commit(sink_id, EPOCH, files=files).model_copy(update={"generation": generation})


def _rows(engine: sa.Engine, query: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(query)).all())


def _opened(store: SqlSinkStateStore, sink_id: str) -> tuple[PreCommit, PreCommit]:
    first, second = _write(sink_id, G1, files=300), _write(sink_id, G2, files=2)
    store.insert_pending(first, run_id="r", try_number=1)
    store.mark_committed(sink_id, EPOCH, write_id=first.write_id, committed={"db.events": "101"})
    store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=2)
    return first, second


def test_an_open_revision_keeps_the_replaced_metadata_out_of_its_row_and_another_process_reads_it(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        first, second = _opened(store, sink_id)
        [(replaces,)] = _rows(engine, "SELECT replaces FROM pending_sink_state")
        kept = json.loads(replaces)
        assert kept["write_id"] == first.write_id and "metadata" not in kept
        assert len(replaces) < 500 < len(first.to_json())  # the row stays small: 300 files are not in it
        [(write_id, size, text, packed)] = _rows(
            engine, "SELECT write_id, metadata_bytes, metadata, metadata_zlib FROM replaced_metadata"
        )
        assert (write_id, text) == (first.write_id, None)
        assert PreCommit.from_json(zlib.decompress(bytes(packed)).decode()) == first
        assert size == len(zlib.decompress(bytes(packed)))
        assert _rows(engine, "SELECT write_id FROM epoch_metadata") == [(second.write_id,)]

        with another_process(fresh_url) as reading:
            row = reading.get(sink_id, EPOCH)
            assert row is not None and row.pre_commit == second
            assert row.replaces is not None and row.replaces.pre_commit == first
            assert row.replaces.committed == {"db.events": "101"}
    finally:
        store.dispose()


def test_the_revision_commit_queues_the_replaced_metadata_as_stored(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        first, second = _opened(store, sink_id)
        store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "202"})
        assert _rows(engine, "SELECT * FROM replaced_metadata") == []
        [(write_id, text, size, packed)] = _rows(
            engine, "SELECT write_id, metadata, metadata_bytes, metadata_zlib FROM sink_cleanup"
        )
        assert (write_id, text) == (first.write_id, None) and size == len(zlib.decompress(bytes(packed)))
        with another_process(fresh_url) as reading:
            [queued] = reading.cleanups(sink_id, EPOCH)
            assert queued.pre_commit == first and queued.removed_by == {"db.events": "202"}
    finally:
        store.dispose()


def test_an_aborted_revision_gives_the_epoch_its_metadata_back(fresh_url: str, engine: sa.Engine, sink_id: str) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        first, second = _opened(store, sink_id)
        store.revisions.abort_revision(sink_id, EPOCH, write_id=second.write_id, reason="checkpoint FAILED")
        assert _rows(engine, "SELECT * FROM replaced_metadata") == []
        assert _rows(engine, "SELECT write_id FROM epoch_metadata") == [(first.write_id,)]
        with another_process(fresh_url) as reading:
            row = reading.get(sink_id, EPOCH)
            assert row is not None and row.status is EpochStatus.COMMITTED and row.pre_commit == first
            [queued] = reading.cleanups(sink_id, EPOCH)
            assert queued.write_id == second.write_id and queued.pre_commit == second
    finally:
        store.dispose()


def test_the_migration_moves_a_revision_in_flight_and_its_downgrade_puts_it_back(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    first, second = _write(sink_id, G1, files=20), _write(sink_id, G2, files=3)
    aborted = make_pre_commit(sink_id, EPOCH + 1, files=2)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0009")
    forget_applied()
    kept = {  # the row as 0009's package wrote it: the replaced write's metadata inside ``replaces``
        "write_id": first.write_id,
        "metadata": first.model_dump(mode="json"),
        "committed": {"db.events": "101"},
        "table_uuids": None,
        "revision": 0,
        "committed_at": "2025-01-01T00:00:00+00:00",
    }
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, revision, replaces, created_at, "
                "updated_at) VALUES (:s, :e, 'Pending', :w, 1, :r, '2025-01-02 00:00:00', '2025-01-02 00:00:00')"
            ),
            {"s": sink_id, "e": EPOCH, "w": second.write_id, "r": json.dumps(kept)},
        )
        packed = zlib.compress(second.to_json().encode())
        connection.execute(
            sa.text(
                "INSERT INTO epoch_metadata (sink_id, epoch, write_id, metadata_bytes, metadata_zlib) "
                "VALUES (:s, :e, :w, :n, :z)"
            ),
            {"s": sink_id, "e": EPOCH, "w": second.write_id, "n": len(second.to_json()), "z": packed},
        )
        connection.execute(
            sa.text(
                "INSERT INTO sink_cleanup (sink_id, epoch, write_id, metadata, reason, created_at) "
                "VALUES (:s, :e, :w, :m, 'aborted before', '2025-01-01 00:00:00')"
            ),
            {"s": sink_id, "e": EPOCH + 1, "w": aborted.write_id, "m": aborted.to_json()},
        )

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    try:
        [(replaces,)] = _rows(engine, "SELECT replaces FROM pending_sink_state")
        assert "metadata" not in json.loads(replaces)
        row = store.get(sink_id, EPOCH)
        assert row is not None and row.replaces is not None and row.replaces.pre_commit == first
        assert [t.pre_commit for t in store.cleanups(sink_id, EPOCH + 1)] == [aborted]  # a text row, as before
        store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "202"})
        assert [t.pre_commit for t in store.cleanups(sink_id, EPOCH)] == [first]  # queued deflated
        third = _write(sink_id, "2024-06-03T00:00:00.000000Z/0000000002", files=4)
        store.revisions.open_revision(third, expected_write_id=second.write_id, run_id="r", try_number=3)
    finally:
        store.dispose()

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0009")
    forget_applied()
    assert "replaced_metadata" not in sa.inspect(engine).get_table_names()
    assert "metadata_zlib" not in {c["name"] for c in sa.inspect(engine).get_columns("sink_cleanup")}
    [(replaces,)] = _rows(engine, "SELECT replaces FROM pending_sink_state")
    assert PreCommit.parse(json.loads(replaces)["metadata"]) == second  # as 0009 reads a revision in flight
    queued = dict(_rows(engine, "SELECT write_id, metadata FROM sink_cleanup"))
    assert {w: PreCommit.from_json(m) for w, m in queued.items()} == {first.write_id: first, aborted.write_id: aborted}
