"""Revisions of an epoch in the meta store: opened from Committed, committed or aborted, kept on
record in the epoch's history (design.md D11): its expiry keeps them, and migration 0014 moves the
``epoch_revision`` rows of earlier releases into it and back."""

from __future__ import annotations

import json
import operator
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import EpochEvent, EpochStatus
from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from airflow_provider_exactly_once.store.history import RevisionRecord
from airflow_provider_exactly_once.store.models import UtcDateTime
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000
G1 = "2024-06-01T01:00:00.000000Z/0000000000"
G2 = "2024-06-02T09:30:00.000000Z/0000000001"


def _write(sink_id: str, generation: str | None) -> PreCommit:
    return make_pre_commit(sink_id, EPOCH).model_copy(update={"generation": generation})


def _committed(store: SqlSinkStateStore, sink_id: str) -> PreCommit:
    first = _write(sink_id, G1)
    store.insert_pending(first, run_id="scheduled__1", try_number=1, dag_id="d")
    store.mark_committed(sink_id, EPOCH, write_id=first.write_id, committed={"db.events": "101"})
    return first


def test_a_revision_keeps_the_committed_write_until_it_commits(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second = _write(sink_id, G2)
    opened = store.revisions.open_revision(
        second, expected_write_id=first.write_id, run_id="scheduled__1", try_number=3, dag_id="d"
    )
    assert (opened.status, opened.write_id, opened.revision) == (EpochStatus.PENDING, second.write_id, 1)
    assert opened.replaces is not None and opened.replaces.write_id == first.write_id
    assert opened.replaces.committed == {"db.events": "101"} and opened.replaces.pre_commit == first
    assert [(r.revision, r.status) for r in store.revisions.revisions(sink_id, EPOCH)] == [
        (0, "Committed"),
        (1, "Pending"),
    ]

    done = store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "202"})
    assert (done.status, done.write_id, done.revision, done.replaces) == (
        EpochStatus.COMMITTED,
        second.write_id,
        1,
        None,
    )
    history = store.revisions.revisions(sink_id, EPOCH)
    assert [(r.revision, r.write_id, r.status) for r in history] == [
        (0, first.write_id, "Replaced"),
        (1, second.write_id, "Committed"),
    ]
    assert history[1].generation == G2 and history[1].committed == {"db.events": "202"} and history[1].try_number == 3
    [cleanup] = store.cleanups(sink_id, EPOCH)
    assert cleanup.write_id == first.write_id and cleanup.removed_by == {"db.events": "202"}


def test_an_aborted_revision_restores_the_committed_write(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second = _write(sink_id, G2)
    store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=1)
    with pytest.raises(StateConflict, match="abort_revision"):
        store.mark_aborted(sink_id, EPOCH, write_id=second.write_id, reason="not like this")
    restored = store.revisions.abort_revision(sink_id, EPOCH, write_id=second.write_id, reason="checkpoint FAILED")
    assert (restored.status, restored.write_id, restored.revision, restored.replaces) == (
        EpochStatus.COMMITTED,
        first.write_id,
        0,
        None,
    )
    assert restored.committed == {"db.events": "101"} and restored.pre_commit == first
    assert "checkpoint FAILED" in (restored.warning or "")
    assert [(r.write_id, r.status) for r in store.revisions.revisions(sink_id, EPOCH)] == [
        (first.write_id, "Committed"),
        (second.write_id, "Aborted"),
    ]
    [cleanup] = store.cleanups(sink_id, EPOCH)
    assert cleanup.write_id == second.write_id and cleanup.removed_by is None
    assert store.write_discarded(sink_id, EPOCH, second.write_id)


def test_revision_transitions_are_compare_and_swap(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second, third = _write(sink_id, G2), _write(sink_id, G2)
    store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=1)
    with pytest.raises(StateConflict, match="open a revision"):  # a racing persist saw the same Committed row
        store.revisions.open_revision(third, expected_write_id=first.write_id, run_id="r", try_number=1)
    store.decide_commit(sink_id, EPOCH, write_id=second.write_id)
    with pytest.raises(StateConflict, match="while no commit is decided"):
        store.revisions.abort_revision(sink_id, EPOCH, write_id=second.write_id, reason="late")
    # a retry inside the revision replaces its write and keeps what it replaces
    other = store.get(sink_id, EPOCH)
    assert other is not None and other.replaces is not None and other.replaces.write_id == first.write_id


def _revised(store: SqlSinkStateStore, sink_id: str) -> list[str]:
    """Revision 1 given up, revision 1 committed, revision 2 given up, revision 2 in flight: the
    writes, oldest first."""
    committed = _committed(store, sink_id).write_id
    writes = [committed]
    for n, settle in enumerate(("abort", "commit", "abort", None)):
        write = _write(sink_id, f"2024-06-0{n + 3}T00:00:00.000000Z/000000000{n + 2}")
        run = f"backfill__{n}"
        store.revisions.open_revision(write, expected_write_id=committed, run_id=run, try_number=1, dag_id="d")
        if settle == "abort":
            store.revisions.abort_revision(sink_id, EPOCH, write_id=write.write_id, reason=f"checkpoint FAILED {n}")
        elif settle == "commit":
            store.decide_commit(sink_id, EPOCH, write_id=write.write_id)
            store.mark_committed(sink_id, EPOCH, write_id=write.write_id, committed={"db.events": "202"})
            committed = write.write_id
        writes.append(write.write_id)
    return writes


def test_the_history_expiry_keeps_what_the_revisions_are_read_from(store: SqlSinkStateStore, sink_id: str) -> None:
    writes = _revised(store, sink_id)
    before = store.revisions.revisions(sink_id, EPOCH)
    replaced = [store.revisions.was_replaced(sink_id, EPOCH, w) for w in writes]
    assert [(r.write_id, r.status) for r in before] == [
        (writes[0], "Replaced"),
        (writes[1], "Aborted"),
        (writes[2], "Committed"),
        (writes[3], "Aborted"),
        (writes[4], "Pending"),
    ]
    assert replaced == [True, False, False, False, False]
    time.sleep(0.01)  # every event older than the retention below, by SQLite's milliseconds too
    assert store.history.expire(sink_id, timedelta(microseconds=1)) > 0
    assert store.revisions.revisions(sink_id, EPOCH) == before
    assert [store.revisions.was_replaced(sink_id, EPOCH, w) for w in writes] == replaced
    left = store.history.events(sink_id, EPOCH)
    assert [e.event for e in left] == [
        EpochEvent.REVISION_OPENED,
        EpochEvent.REVISION_GIVEN_UP,
        EpochEvent.REVISION_OPENED,
        EpochEvent.COMMITTED,
        EpochEvent.REVISION_OPENED,
        EpochEvent.REVISION_GIVEN_UP,
        EpochEvent.REVISION_OPENED,
    ]  # the persist, the first commit, the decisions and the clean-ups are gone


#: ``epoch_revision`` as migrations 0005 to 0013 held it, read as their package read it.
OLD = sa.Table(
    "epoch_revision",
    sa.MetaData(),
    sa.Column("sink_id", sa.String(128), primary_key=True),
    sa.Column("epoch", sa.BigInteger(), primary_key=True),
    sa.Column("write_id", sa.String(36), primary_key=True),
    sa.Column("revision", sa.Integer()),
    sa.Column("generation", sa.String(40)),
    sa.Column("status", sa.String(16)),
    sa.Column("run_id", sa.String(250)),
    sa.Column("try_number", sa.Integer()),
    sa.Column("dag_id", sa.String(250)),
    sa.Column("rows", sa.BigInteger()),
    sa.Column("files", sa.Integer()),
    sa.Column("committed", sa.Text()),
    sa.Column("reason", sa.Text()),
    sa.Column("created_at", UtcDateTime()),
    sa.Column("updated_at", UtcDateTime()),
)
T = datetime(2025, 3, 1, tzinfo=UTC)


def _at(hours: int) -> datetime:
    return T + timedelta(hours=hours, microseconds=123_456)


def _w(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def _row(
    sink_id: str, epoch: int, write: str, revision: int, status: str, created: int, updated: int, **more: Any
) -> dict[str, Any]:
    """A row as 0013's package wrote it: a committed write's snapshots, no reason but an abort's."""
    snapshots = None if status == "Aborted" else json.dumps({"db.events": str(100 + revision)})
    return {
        **dict(sink_id=sink_id, epoch=epoch, write_id=write, revision=revision, status=status, reason=None),
        **dict(generation=G1, run_id="scheduled__1", try_number=2, dag_id="d", rows=21, files=2, committed=snapshots),
        **dict(created_at=_at(created), updated_at=_at(updated)),
        **more,
    }


def _old_rows(sink_id: str) -> list[dict[str, Any]]:
    """What 0013's package left: a revision committed twice and a third given up; a revision given
    up twice; a replacement made and replaced in one instant, of a write with no generation or
    run; and another sink's epoch of the same number."""
    e1, e2, e3 = EPOCH, EPOCH + 3_600_000, EPOCH + 7_200_000
    return [
        _row(sink_id, e1, _w("w1-0"), 0, "Replaced", 1, 2),  # recorded as revision 1 opened, replaced at its commit
        _row(sink_id, e1, _w("w1-1"), 1, "Replaced", 2, 4),  # committed, recorded again as revision 2 opened
        _row(sink_id, e1, _w("w1-2"), 2, "Committed", 4, 5),  # committed, recorded again as revision 3 opened
        _row(sink_id, e1, _w("w1-3"), 3, "Aborted", 6, 6, reason="checkpoint FAILED: 'ß' \u2026", try_number=None),
        _row(sink_id, e2, _w("w2-0"), 0, "Committed", 1, 3),  # recorded as each revision opened
        _row(sink_id, e2, _w("w2-b"), 1, "Aborted", 4, 4, reason="the second"),
        _row(sink_id, e2, _w("w2-a"), 1, "Aborted", 2, 2, reason="the first"),
        _row(sink_id, e3, _w("w3-0"), 0, "Replaced", 7, 7, generation=None, run_id=None, try_number=None, dag_id=None),
        _row(sink_id, e3, _w("w3-1"), 1, "Committed", 7, 7, committed=json.dumps({"db.a": "empty", "db.b": "5"})),
        _row(f"{sink_id}-other", e1, _w("w1-0"), 0, "Committed", 1, 1, rows=0, files=0),
    ]


def _old_revisions(connection: sa.Connection, sink_id: str, epoch: int) -> list[RevisionRecord]:
    """``revisions()`` as 0013's package read ``epoch_revision``."""
    found = connection.execute(
        sa.select(OLD).where(OLD.c.sink_id == sink_id, OLD.c.epoch == epoch).order_by(OLD.c.revision, OLD.c.created_at)
    ).mappings()
    return [
        RevisionRecord(**{**r, "committed": None if r["committed"] is None else json.loads(r["committed"])})
        for r in found
    ]


def test_the_migration_moves_the_revision_rows_of_0013_into_the_history_and_back(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0013")
    forget_applied()
    rows = _old_rows(sink_id)
    keys = sorted({(r["sink_id"], r["epoch"]) for r in rows})
    writes = sorted({r["write_id"] for r in rows} | {_w("never recorded")})
    with engine.begin() as connection:
        connection.execute(sa.insert(OLD), rows)
        before = {key: _old_revisions(connection, *key) for key in keys}
    replaced = {(r["sink_id"], r["epoch"], r["write_id"]) for r in rows if r["status"] == "Replaced"}
    assert len(replaced) == 3 and sum(len(r) for r in before.values()) == len(rows)

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    try:
        assert "epoch_revision" not in sa.inspect(engine).get_table_names()
        assert {key: store.revisions.revisions(*key) for key in keys} == before
        for key in keys:
            for write in writes:
                assert store.revisions.was_replaced(*key, write) is ((*key, write) in replaced), (key, write)
        carried = store.history.events(sink_id, EPOCH)
        assert {(e.event, e.actor.kind.value, e.status) for e in carried} == {
            (EpochEvent.REVISION_RECORDED, "unknown", None)
        }
        assert [e.at for e in carried] == sorted(e.at for e in carried)
    finally:
        store.dispose()

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0013")
        columns = {c["name"] for c in sa.inspect(connection).get_columns("epoch_history")}
        assert not columns & {"revision_record", "replaced_write_id"}
        assert connection.execute(sa.text("SELECT count(*) FROM epoch_history")).scalar() == 0
        back = connection.execute(sa.select(OLD)).mappings().all()
    forget_applied()
    key = operator.itemgetter("sink_id", "epoch", "write_id")
    assert sorted((dict(r) for r in back), key=key) == sorted(rows, key=key)  # as they were, to the microsecond


def test_the_downgrade_rebuilds_the_revision_rows_of_the_history_and_the_upgrade_reads_them_again(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        writes = _revised(store, sink_id)
        before = store.revisions.revisions(sink_id, EPOCH)
    finally:
        store.dispose()
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0013")
        assert _old_revisions(connection, sink_id, EPOCH) == before[:-1]  # the one in flight is its row's
    forget_applied()
    store = SqlSinkStateStore(fresh_url)
    try:
        assert store.revisions.revisions(sink_id, EPOCH) == before
        assert [store.revisions.was_replaced(sink_id, EPOCH, w) for w in writes] == [True, False, False, False, False]
    finally:
        store.dispose()
