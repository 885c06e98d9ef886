"""Every legal transition of ``pending_sink_state`` and every compare-and-swap refusal (invariant 5)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import (
    EpochAborted,
    EpochNotFound,
    InvalidPreCommit,
    StateConflict,
)
from airflow_provider_exactly_once.core.ports import EMPTY, ORPHAN_EPOCH, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


def _persist(store: SqlSinkStateStore, sink_id: str, epoch: int = EPOCH, **kw: Any) -> EpochRecord:
    return store.insert_pending(make_pre_commit(sink_id, epoch, **kw), run_id="scheduled__1", try_number=1)


def _tick() -> None:
    """Let the database clock (millisecond precision on SQLite) move on."""
    time.sleep(0.01)


@contextmanager
def _failing(store: SqlSinkStateStore, sql_prefix: str) -> Iterator[None]:
    """Make the store's next statement starting with ``sql_prefix`` fail, as a dropped connection would."""

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(sql_prefix.upper()):
            raise RuntimeError(f"injected failure of {statement[:40]!r}")

    sa.event.listen(store.engine, "before_cursor_execute", before)
    try:
        yield
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", before)


# -- (none) -> Pending ---------------------------------------------------------------------------


def test_insert_pending_writes_the_row(store: SqlSinkStateStore, sink_id: str) -> None:
    before = store.now()
    pre_commit = make_pre_commit(sink_id, EPOCH, tables=("db.a", "db.b"))
    record = store.insert_pending(pre_commit, run_id="manual__2024", try_number=3)
    after = store.now()

    assert record.status is EpochStatus.PENDING
    assert (record.sink_id, record.epoch, record.write_id) == (sink_id, EPOCH, pre_commit.write_id)
    assert record.pre_commit == pre_commit
    assert (record.run_id, record.try_number) == ("manual__2024", 3)
    assert record.commit_decided_at is None and record.committed is None and record.error is None
    assert record.created_at.tzinfo is not None and record.created_at.utcoffset() == timedelta(0)
    assert before <= record.created_at == record.updated_at <= after
    assert store.get(sink_id, EPOCH) == record
    assert store.get(sink_id, EPOCH + 1) is None


def test_insert_twice_is_a_conflict_naming_the_existing_write(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _persist(store, sink_id)
    second = make_pre_commit(sink_id, EPOCH)
    with pytest.raises(StateConflict) as raised:
        store.insert_pending(second, run_id=None, try_number=None)
    message = str(raised.value)
    assert sink_id in message and str(EPOCH) in message
    assert second.write_id in message and first.write_id in message and "Pending" in message
    assert store.get(sink_id, EPOCH) == first


def test_bad_input_is_refused_before_touching_the_database(store: SqlSinkStateStore, sink_id: str) -> None:
    with pytest.raises(InvalidPreCommit, match="negative"):
        store.get(sink_id, -1)
    with pytest.raises(InvalidPreCommit, match="not a UUID"):
        store.decide_commit(sink_id, EPOCH, write_id="w1")
    with pytest.raises(InvalidPreCommit, match="try_number"):
        store.insert_pending(make_pre_commit(sink_id, EPOCH), run_id="r", try_number=-1)
    with pytest.raises(InvalidPreCommit, match="run_id"):
        store.insert_pending(make_pre_commit(sink_id, EPOCH), run_id="x" * 251, try_number=1)
    with pytest.raises(InvalidPreCommit, match="epoch status 'Done'"):
        store.epochs_with_status(sink_id, "Done")  # type: ignore[arg-type]
    with pytest.raises(InvalidPreCommit, match="tables"):
        store.insert_pending(
            {"sink_id": sink_id, "epoch": EPOCH, "write_id": str(uuid.uuid4()), "tables": []},  # type: ignore[arg-type]
            run_id=None,
            try_number=None,
        )
    assert store.get(sink_id, EPOCH) is None


# -- Pending -> Committed ------------------------------------------------------------------------


def test_decide_then_commit(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id, tables=("db.a", "db.b"))
    store.record_error(sink_id, EPOCH, write_id=pending.write_id, error="catalog timed out")
    _tick()
    decided = store.decide_commit(sink_id, EPOCH, write_id=pending.write_id)
    assert decided.status is EpochStatus.PENDING
    assert decided.commit_decided_at is not None and decided.commit_decided_at >= pending.created_at
    _tick()
    again = store.decide_commit(sink_id, EPOCH, write_id=pending.write_id)
    assert again.commit_decided_at == decided.commit_decided_at, "deciding twice must keep the first decision"

    committed = store.mark_committed(
        sink_id, EPOCH, write_id=pending.write_id, committed={"db.a": "4711", "db.b": EMPTY}
    )
    assert committed.status is EpochStatus.COMMITTED
    assert committed.committed == {"db.a": "4711", "db.b": EMPTY}
    assert committed.error is None, "committing clears the last error"
    assert committed.created_at == pending.created_at and committed.updated_at > pending.updated_at
    assert store.get(sink_id, EPOCH) == committed


def test_commit_without_decision_is_allowed(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    record = store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.events": "1"})
    assert record.status is EpochStatus.COMMITTED and record.commit_decided_at is None


def test_commit_of_another_write_is_refused(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    zombie = str(uuid.uuid4())
    with pytest.raises(StateConflict) as raised:
        store.mark_committed(sink_id, EPOCH, write_id=zombie, committed={"db.events": "1"})
    assert zombie in str(raised.value) and pending.write_id in str(raised.value)
    assert store.get(sink_id, EPOCH) == pending


def test_commit_twice_is_refused(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    done = store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.events": "1"})
    with pytest.raises(StateConflict, match="holds status Committed"):
        store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.events": "2"})
    assert store.get(sink_id, EPOCH) == done


def test_commit_must_name_every_table_and_rolls_back_otherwise(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id, tables=("db.a", "db.b"))
    with pytest.raises(InvalidPreCommit, match=r"\['db.a'\].*\['db.a', 'db.b'\]"):
        store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.a": "1"})
    with pytest.raises(InvalidPreCommit, match="strings"):
        store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.a": 1, "db.b": "2"})  # type: ignore[dict-item]
    assert store.get(sink_id, EPOCH) == pending, "a refused commit leaves the row Pending"


def test_decide_commit_refusals(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    with pytest.raises(StateConflict, match=pending.write_id):
        store.decide_commit(sink_id, EPOCH, write_id=str(uuid.uuid4()))
    store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="checkpoint FAILED")
    with pytest.raises(StateConflict, match="holds status Aborted"):
        store.decide_commit(sink_id, EPOCH, write_id=pending.write_id)


def test_transitions_of_a_missing_row_say_so(store: SqlSinkStateStore, sink_id: str) -> None:
    write_id = str(uuid.uuid4())
    for attempt in (
        lambda: store.decide_commit(sink_id, EPOCH, write_id=write_id),
        lambda: store.mark_committed(sink_id, EPOCH, write_id=write_id, committed={"t": "1"}),
        lambda: store.mark_aborted(sink_id, EPOCH, write_id=write_id, reason="r"),
    ):
        with pytest.raises(StateConflict, match="there is no row") as raised:
            attempt()
        assert isinstance(raised.value, EpochNotFound)
    assert store.get(sink_id, EPOCH) is None
    assert store.cleanups(sink_id) == []


# -- Pending -> Aborted --------------------------------------------------------------------------


def test_abort_queues_the_cleanup_in_the_same_transaction(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    aborted = store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="checkpoint FAILED")
    assert aborted.status is EpochStatus.ABORTED and aborted.write_id == pending.write_id
    assert aborted.error == "checkpoint FAILED"
    [task] = store.cleanups(sink_id)
    assert (task.sink_id, task.epoch, task.write_id) == (sink_id, EPOCH, pending.write_id)
    assert task.pre_commit == pending.pre_commit and task.reason == "checkpoint FAILED"
    assert aborted.updated_at <= task.created_at <= store.now()


def test_abort_leaves_nothing_half_written_when_the_cleanup_insert_fails(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    pending = _persist(store, sink_id)
    with _failing(store, "INSERT INTO sink_cleanup"), pytest.raises(RuntimeError, match="injected"):
        store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="r")
    assert store.get(sink_id, EPOCH) == pending
    assert store.cleanups(sink_id) == []


def test_a_decided_commit_blocks_abort(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    decided = store.decide_commit(sink_id, EPOCH, write_id=pending.write_id)
    with pytest.raises(StateConflict, match="commit decided at"):
        store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="timed out")
    assert store.get(sink_id, EPOCH) == decided
    assert store.cleanups(sink_id) == []


def test_abort_of_another_write_is_refused(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    with pytest.raises(StateConflict, match=pending.write_id):
        store.mark_aborted(sink_id, EPOCH, write_id=str(uuid.uuid4()), reason="r")
    assert store.get(sink_id, EPOCH) == pending and store.cleanups(sink_id) == []


def test_a_late_zombie_commit_after_an_abort_fails_loudly(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    aborted = store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="checkpoint FAILED")
    with pytest.raises(StateConflict) as raised:
        store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.events": "9"})
    message = str(raised.value)
    assert f"sink {sink_id!r} epoch {EPOCH}" in message
    assert "expected to mark Pending write" in message and "holds status Aborted" in message
    assert store.get(sink_id, EPOCH) == aborted


def test_abort_twice_is_refused(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="r")
    with pytest.raises(StateConflict, match="holds status Aborted"):
        store.mark_aborted(sink_id, EPOCH, write_id=pending.write_id, reason="r")
    assert len(store.cleanups(sink_id)) == 1


# -- replace_write -------------------------------------------------------------------------------


def test_replace_a_pending_write(store: SqlSinkStateStore, sink_id: str) -> None:
    old = _persist(store, sink_id)
    store.record_error(sink_id, EPOCH, write_id=old.write_id, error="spark died")
    _tick()
    newer = make_pre_commit(sink_id, EPOCH, files=5)
    record = store.replace_write(
        newer, expected_status=EpochStatus.PENDING, expected_write_id=old.write_id, run_id="r2", try_number=2
    )
    assert record.status is EpochStatus.PENDING and record.write_id == newer.write_id
    assert record.pre_commit == newer and (record.run_id, record.try_number) == ("r2", 2)
    assert record.error is None
    assert record.created_at == old.created_at, "created_at bounds the marker walk: it must not move"
    assert record.updated_at > old.updated_at
    [task] = store.cleanups(sink_id, EPOCH)
    assert task.write_id == old.write_id and task.pre_commit == old.pre_commit
    assert newer.write_id in task.reason


def test_replace_leaves_nothing_half_written_when_the_cleanup_insert_fails(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    old = _persist(store, sink_id)
    newer = make_pre_commit(sink_id, EPOCH)
    with _failing(store, "INSERT INTO sink_cleanup"), pytest.raises(RuntimeError, match="injected"):
        store.replace_write(
            newer,
            expected_status=EpochStatus.PENDING,
            expected_write_id=old.write_id,
            run_id=None,
            try_number=None,
        )
    assert store.get(sink_id, EPOCH) == old
    assert store.cleanups(sink_id) == []


def test_a_decided_commit_blocks_replace(store: SqlSinkStateStore, sink_id: str) -> None:
    old = _persist(store, sink_id)
    decided = store.decide_commit(sink_id, EPOCH, write_id=old.write_id)
    with pytest.raises(StateConflict, match=r"while no commit is decided.*commit decided at"):
        store.replace_write(
            make_pre_commit(sink_id, EPOCH),
            expected_status=EpochStatus.PENDING,
            expected_write_id=old.write_id,
            run_id=None,
            try_number=None,
        )
    assert store.get(sink_id, EPOCH) == decided and store.cleanups(sink_id) == []


@pytest.mark.parametrize("wrong", ["write", "status"])
def test_replace_with_wrong_expectations_is_refused(store: SqlSinkStateStore, sink_id: str, wrong: str) -> None:
    old = _persist(store, sink_id)
    with pytest.raises(StateConflict, match=f"holds status Pending write {old.write_id}"):
        store.replace_write(
            make_pre_commit(sink_id, EPOCH),
            expected_status=EpochStatus.ABORTED if wrong == "status" else EpochStatus.PENDING,
            expected_write_id=str(uuid.uuid4()) if wrong == "write" else old.write_id,
            run_id=None,
            try_number=None,
        )
    assert store.get(sink_id, EPOCH) == old and store.cleanups(sink_id) == []


def test_replace_refuses_a_committed_epoch_and_a_reused_write_id(store: SqlSinkStateStore, sink_id: str) -> None:
    old = _persist(store, sink_id)
    with pytest.raises(StateConflict, match="needs a new write id"):
        store.replace_write(
            old.pre_commit,
            expected_status=EpochStatus.PENDING,
            expected_write_id=old.write_id,
            run_id=None,
            try_number=None,
        )
    done = store.mark_committed(sink_id, EPOCH, write_id=old.write_id, committed={"db.events": "1"})
    with pytest.raises(StateConflict, match="Committed epoch is final"):
        store.replace_write(
            make_pre_commit(sink_id, EPOCH),
            expected_status=EpochStatus.COMMITTED,
            expected_write_id=old.write_id,
            run_id=None,
            try_number=None,
        )
    with pytest.raises(StateConflict, match="holds status Committed"):
        store.replace_write(
            make_pre_commit(sink_id, EPOCH),
            expected_status=EpochStatus.PENDING,
            expected_write_id=old.write_id,
            run_id=None,
            try_number=None,
        )
    assert store.get(sink_id, EPOCH) == done and store.cleanups(sink_id) == []


def test_rerun_of_an_aborted_epoch(store: SqlSinkStateStore, sink_id: str) -> None:
    old = _persist(store, sink_id)
    aborted = store.mark_aborted(sink_id, EPOCH, write_id=old.write_id, reason="checkpoint FAILED")
    _tick()
    newer = make_pre_commit(sink_id, EPOCH)
    record = store.replace_write(
        newer, expected_status=EpochStatus.ABORTED, expected_write_id=old.write_id, run_id="r3", try_number=1
    )
    assert record.status is EpochStatus.PENDING and record.write_id == newer.write_id
    assert record.error is None and record.committed is None and record.commit_decided_at is None
    assert record.created_at == old.created_at and record.updated_at > aborted.updated_at
    [task] = store.cleanups(sink_id)
    assert task.write_id == old.write_id, "the aborted write was queued once, at abort, and not again"
    # The new write goes through the whole cycle.
    store.decide_commit(sink_id, EPOCH, write_id=newer.write_id)
    assert store.mark_committed(sink_id, EPOCH, write_id=newer.write_id, committed={"db.events": "5"}).committed


# -- record_error --------------------------------------------------------------------------------


def test_record_error_only_touches_the_row_of_that_write(store: SqlSinkStateStore, sink_id: str) -> None:
    pending = _persist(store, sink_id)
    store.record_error(sink_id, EPOCH, write_id=str(uuid.uuid4()), error="from a zombie")
    store.record_error(sink_id, EPOCH + 1, write_id=pending.write_id, error="no such row")
    assert store.get(sink_id, EPOCH) == pending
    store.record_error(sink_id, EPOCH, write_id=pending.write_id, error="catalog unreachable")
    row = store.get(sink_id, EPOCH)
    assert row is not None and row.error == "catalog unreachable" and row.status is EpochStatus.PENDING
    done = store.mark_committed(sink_id, EPOCH, write_id=pending.write_id, committed={"db.events": "1"})
    store.record_error(sink_id, EPOCH, write_id=pending.write_id, error="late error")
    assert store.get(sink_id, EPOCH) == done


# -- queries -------------------------------------------------------------------------------------


def test_epochs_with_status_returns_only_that_status(store: SqlSinkStateStore, sink_id: str) -> None:
    records = [_persist(store, sink_id, epoch) for epoch in (EPOCH + 3, EPOCH + 1, EPOCH + 2, EPOCH + 4)]
    store.mark_committed(sink_id, EPOCH + 1, write_id=records[1].write_id, committed={"db.events": "1"})
    store.mark_aborted(sink_id, EPOCH + 2, write_id=records[2].write_id, reason="r")
    other = f"{sink_id}-other"
    _persist(store, other, EPOCH)

    assert [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.PENDING)] == [EPOCH + 3, EPOCH + 4]
    assert [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.COMMITTED)] == [EPOCH + 1]
    assert [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.ABORTED)] == [EPOCH + 2]
    assert {sink_id, other} <= set(store.sink_ids())


def test_the_recovery_index_exists(store: SqlSinkStateStore) -> None:
    indexes = sa.inspect(store.engine).get_indexes("pending_sink_state")
    assert ["sink_id", "status"] in [index["column_names"] for index in indexes]
    cleanup_indexes = sa.inspect(store.engine).get_indexes("sink_cleanup")
    assert ["sink_id", "done_at"] in [index["column_names"] for index in cleanup_indexes]


def test_cleanup_queue(store: SqlSinkStateStore, sink_id: str) -> None:
    late = make_pre_commit(sink_id, EPOCH)
    first = store.enqueue_cleanup(late, reason="epoch already committed")
    second = store.enqueue_cleanup(make_pre_commit(sink_id, EPOCH + 1), reason="replaced")
    assert first.pre_commit == late and first.reason == "epoch already committed"
    assert first.created_at.tzinfo is not None
    assert [t.id for t in store.cleanups(sink_id)] == [first.id, second.id], "oldest first"
    assert [t.id for t in store.cleanups(sink_id, EPOCH + 1)] == [second.id]
    assert sink_id in store.sink_ids()

    store.complete_cleanup(first.id)
    store.complete_cleanup(first.id)  # idempotent
    assert [t.id for t in store.cleanups(sink_id)] == [second.id]
    with pytest.raises(StateConflict, match="no clean-up 987654321"):
        store.complete_cleanup(987654321)


# -- size and time -------------------------------------------------------------------------------


def test_ten_thousand_file_descriptors_round_trip(store: SqlSinkStateStore, sink_id: str) -> None:
    big = make_pre_commit(sink_id, EPOCH, files=10_000)
    assert len(big.to_json()) > 1_000_000
    store.insert_pending(big, run_id=None, try_number=None)
    row = store.get(sink_id, EPOCH)
    assert row is not None and row.pre_commit == big
    store.mark_aborted(sink_id, EPOCH, write_id=big.write_id, reason="r")
    assert store.cleanups(sink_id)[0].pre_commit == big


def test_times_come_from_the_database_clock(store: SqlSinkStateStore, sink_id: str, backend: str) -> None:
    now = store.now()
    assert now.tzinfo is UTC
    record = _persist(store, sink_id)
    assert now <= record.created_at <= store.now()
    if backend == "sqlite":
        # strftime('%f') stores milliseconds; a Python-side datetime would have been stored with six digits.
        with store.engine.connect() as conn:
            raw = conn.execute(
                sa.text("SELECT created_at, updated_at FROM pending_sink_state WHERE sink_id = :s"),
                {"s": sink_id},
            ).one()
        for value in raw:
            assert isinstance(value, str) and len(value.rsplit(".", 1)[1]) == 3, value
    else:
        with store.engine.connect() as conn:
            db_type = conn.execute(
                sa.text(
                    "SELECT data_type FROM information_schema.columns "
                    "WHERE table_name = 'pending_sink_state' AND column_name = 'created_at'"
                )
            ).scalar_one()
        assert db_type == "timestamp with time zone"


# -- races ---------------------------------------------------------------------------------------


def test_concurrent_inserts_one_wins(store: SqlSinkStateStore, sink_id: str) -> None:
    writes = [make_pre_commit(sink_id, EPOCH) for _ in range(6)]
    barrier = threading.Barrier(len(writes))

    def attempt(pre_commit: PreCommit) -> str | None:
        barrier.wait(timeout=30)
        try:
            return store.insert_pending(pre_commit, run_id=None, try_number=None).write_id
        except StateConflict:
            return None

    with ThreadPoolExecutor(len(writes)) as pool:
        winners = [w for w in pool.map(attempt, writes) if w is not None]
    row = store.get(sink_id, EPOCH)
    assert row is not None and winners == [row.write_id]


def test_decide_and_abort_race_one_wins(store: SqlSinkStateStore, sink_id: str) -> None:
    for epoch in range(EPOCH, EPOCH + 6):
        pending = _persist(store, sink_id, epoch)
        barrier = threading.Barrier(2)

        def decide(epoch: int = epoch, write_id: str = pending.write_id, barrier: Any = barrier) -> str:
            barrier.wait(timeout=30)
            try:
                store.decide_commit(sink_id, epoch, write_id=write_id)
                return "decided"
            except StateConflict:
                return "refused"

        def abort(epoch: int = epoch, write_id: str = pending.write_id, barrier: Any = barrier) -> str:
            barrier.wait(timeout=30)
            try:
                store.mark_aborted(sink_id, epoch, write_id=write_id, reason="timeout")
                return "aborted"
            except StateConflict:
                return "refused"

        with ThreadPoolExecutor(2) as pool:
            outcome = sorted(f.result() for f in [pool.submit(decide), pool.submit(abort)])
        row = store.get(sink_id, epoch)
        assert row is not None
        if outcome == ["decided", "refused"]:
            assert row.status is EpochStatus.PENDING and row.commit_decided_at is not None
            assert store.cleanups(sink_id, epoch) == []
        else:
            assert outcome == ["aborted", "refused"]
            assert row.status is EpochStatus.ABORTED and row.commit_decided_at is None
            assert len(store.cleanups(sink_id, epoch)) == 1


def test_insert_aborted_is_a_tombstone_with_its_cleanup_queued(store: SqlSinkStateStore, sink_id: str) -> None:
    pre = make_pre_commit(sink_id, EPOCH)
    assert not store.write_discarded(sink_id, EPOCH, pre.write_id)
    record = store.insert_aborted(pre, reason="write task failed")
    assert record.status is EpochStatus.ABORTED and record.write_id == pre.write_id
    assert record.error == "write task failed"
    assert [c.write_id for c in store.cleanups(sink_id, EPOCH)] == [pre.write_id]
    assert store.write_discarded(sink_id, EPOCH, pre.write_id)
    store.complete_cleanup(store.cleanups(sink_id, EPOCH)[0].id)
    assert store.write_discarded(sink_id, EPOCH, pre.write_id)  # done clean-ups still count
    rerun = make_pre_commit(sink_id, EPOCH)
    reopened = store.replace_write(
        rerun, expected_status=EpochStatus.ABORTED, expected_write_id=pre.write_id, run_id="r", try_number=2
    )
    assert reopened.status is EpochStatus.PENDING and reopened.write_id == rerun.write_id


def test_insert_pending_refuses_a_discarded_write_in_its_own_transaction(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    """Persist's first insert asks the clean-up queue itself, so persist needs no read of its own for it."""
    pre = make_pre_commit(sink_id, EPOCH)
    store.enqueue_cleanup(pre, reason="late write")
    with pytest.raises(EpochAborted, match=f"write {pre.write_id} was discarded"):
        store.insert_pending(pre, run_id="r", try_number=1)
    assert store.get(sink_id, EPOCH) is None
    orphan = make_pre_commit(sink_id, EPOCH + 1)
    store.registry.enqueue_orphan_cleanup(
        orphan.model_copy(update={"epoch": ORPHAN_EPOCH}), reason="orphaned", written_since=datetime.now(UTC)
    )
    with pytest.raises(EpochAborted):
        store.insert_pending(orphan, run_id="r", try_number=1)
    assert store.get(sink_id, EPOCH + 1) is None
    other = store.insert_pending(make_pre_commit(sink_id, EPOCH), run_id="r", try_number=2)
    assert other.status is EpochStatus.PENDING


def test_insert_aborted_loses_to_an_existing_row_and_writes_nothing(store: SqlSinkStateStore, sink_id: str) -> None:
    persisted = _persist(store, sink_id)
    late = make_pre_commit(sink_id, EPOCH)
    with pytest.raises(StateConflict, match=f"row already exists.*{persisted.write_id}"):
        store.insert_aborted(late, reason="x")
    assert store.get(sink_id, EPOCH).status is EpochStatus.PENDING  # type: ignore[union-attr]
    assert not store.write_discarded(sink_id, EPOCH, late.write_id)
    assert store.cleanups(sink_id, EPOCH) == []
