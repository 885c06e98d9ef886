"""The fault harness's row-against-history check (``fault_harness/history_check.py``) on a real
``SqlSinkStateStore`` on SQLite: epochs taken through the store's own transitions (a commit, a
batch commit, an abort, a tombstone, a revision given up and one committed, a decided commit left
Pending, an audited write published and one whose audit failed) pass; each change made behind the history's back with raw SQL (a history row deleted, a
status, a write id, a decision or a revision number changed, an event of an epoch without a row) is
a ``history_row`` anomaly of its epoch. The harness's own runs only ever show the check passing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.epochs import AbortCause, AuditCheck, EpochAudit, EpochEvent, EpochStatus
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.store import SqlSinkStateStore
from fault_harness.checker import Anomaly
from fault_harness.history_check import IMPLIED, check_history_rows, uncaused
from tests.support.builders import make_pre_commit

SINK = "faults-history"
#: One epoch per way through the store: committed, batch-committed, aborted, tombstone, a revision
#: given up, a revision committed, decided but not yet committed, replaced, re-opened, audited and
#: published, held by a failed audit (design.md D23).
COMMITTED, BATCHED, ABORTED, TOMBSTONE, GIVEN_UP, REVISED, DECIDED, REPLACED, REOPENED, PUBLISHED, HELD = (
    1_735_689_600_000 + n * 3_600_000 for n in range(11)
)
TABLES = {"db.events": "1"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlSinkStateStore]:
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        _drive(store)
        yield store
    finally:
        store.dispose()


def _persist(store: SqlSinkStateStore, epoch: int) -> str:
    pre = make_pre_commit(SINK, epoch)
    store.insert_pending(pre, run_id=f"scheduled__{epoch}", try_number=1, dag_id="eo_faults_history")
    return pre.write_id


def _commit(store: SqlSinkStateStore, epoch: int, write_id: str) -> None:
    store.decide_commit(SINK, epoch, write_id=write_id)
    store.mark_committed(SINK, epoch, write_id=write_id, committed=TABLES)


def _revise(store: SqlSinkStateStore, epoch: int, committed_write_id: str) -> str:
    pre = make_pre_commit(SINK, epoch)
    store.revisions.open_revision(pre, expected_write_id=committed_write_id, run_id="backfill__1", try_number=1)
    return pre.write_id


def _audit(store: SqlSinkStateStore, epoch: int, *, passed: bool) -> str:
    write_id = _persist(store, epoch)
    audit = EpochAudit(write_id=write_id, branch=f"eo-audit-{SINK}-{epoch}", snapshots={"db.events": "7"})
    store.record_audit(SINK, epoch, audit)
    store.record_audit(SINK, epoch, audit.judged([AuditCheck(name="rows", passed=passed)]))
    return write_id


def _drive(store: SqlSinkStateStore) -> None:
    _commit(store, COMMITTED, _persist(store, COMMITTED))
    store.record_warning(SINK, COMMITTED, warning="another DAG wrote this epoch")

    batched = _persist(store, BATCHED)
    assert store.decide_commits(SINK, [(BATCHED, batched)]) == [BATCHED]
    assert store.mark_committed_batch(SINK, [CommitMark(BATCHED, batched, TABLES, {})]) == [BATCHED]

    aborted = _persist(store, ABORTED)
    store.record_error(SINK, ABORTED, write_id=aborted, error="write failed")
    store.mark_aborted(SINK, ABORTED, write_id=aborted, reason="checkpoint FAILED", cause=AbortCause.CHECKPOINT_FAILED)
    for task in store.cleanups(SINK, ABORTED):
        store.complete_cleanup(task.id)

    store.insert_aborted(make_pre_commit(SINK, TOMBSTONE), reason="killed before its persist")

    first = _persist(store, GIVEN_UP)
    _commit(store, GIVEN_UP, first)
    store.revisions.abort_revision(
        SINK, GIVEN_UP, write_id=_revise(store, GIVEN_UP, first), reason="the re-run's checkpoint FAILED"
    )

    first = _persist(store, REVISED)
    _commit(store, REVISED, first)
    _commit(store, REVISED, _revise(store, REVISED, first))

    store.decide_commit(SINK, DECIDED, write_id=_persist(store, DECIDED))

    store.replace_write(
        make_pre_commit(SINK, REPLACED),
        expected_status=EpochStatus.PENDING,
        expected_write_id=_persist(store, REPLACED),
        run_id="scheduled__2",
        try_number=2,
    )

    first = _persist(store, REOPENED)
    _commit(store, REOPENED, first)
    store.reopen_committed(
        make_pre_commit(SINK, REOPENED),
        expected_write_id=first,
        run_id="scheduled__3",
        try_number=1,
        reason="table db.events re-created",
    )

    _commit(store, PUBLISHED, _audit(store, PUBLISHED, passed=True))
    _audit(store, HELD, passed=False)


def _sql(store: SqlSinkStateStore, statement: str, **params: object) -> None:
    with store.engine.begin() as conn:
        assert conn.execute(sa.text(statement), params).rowcount >= 1, statement


def _anomalies(store: SqlSinkStateStore) -> list[Anomaly]:
    anomalies, checked = check_history_rows(store, SINK)
    assert checked >= 11
    return anomalies


def test_every_state_bearing_event_has_an_implied_row() -> None:
    """The mapping covers every event but the six that change no status."""
    notes = {
        EpochEvent.WARNING,
        EpochEvent.ERROR,
        EpochEvent.TRY_FAILED,
        EpochEvent.CLEANUP_QUEUED,
        EpochEvent.CLEANED_UP,
        EpochEvent.REVISION_RECORDED,
    }
    assert set(IMPLIED) == set(EpochEvent) - notes


def test_rows_the_store_left_agree_with_their_history(store: SqlSinkStateStore) -> None:
    anomalies, checked = check_history_rows(store, SINK)
    assert anomalies == []
    assert checked == 11


# Each: the raw SQL done behind the history's back (or the row's), and the epoch whose anomaly it must be.
TAMPERED = {
    # the Committed mark's event lost: the row is Committed, its last event only decided the commit
    "committed event deleted": (
        "delete from epoch_history where sink_id = :s and epoch = :e and event = 'committed'",
        COMMITTED,
    ),
    # the persist's event lost: the history starts with a decision, on a row nothing created
    "persist event deleted": (
        "delete from epoch_history where sink_id = :s and epoch = :e and event = 'persisted'",
        BATCHED,
    ),
    "every event of an epoch deleted": ("delete from epoch_history where sink_id = :s and epoch = :e", TOMBSTONE),
    "status changed to Committed": (
        "update pending_sink_state set status = 'Committed' where sink_id = :s and epoch = :e",
        ABORTED,
    ),
    "Committed row set back to Pending": (
        "update pending_sink_state set status = 'Pending' where sink_id = :s and epoch = :e",
        REVISED,
    ),
    "decision cleared": (
        "update pending_sink_state set commit_decided_at = null where sink_id = :s and epoch = :e",
        DECIDED,
    ),
    # the replacing write's event lost: the row is Pending and undecided as the persist left it,
    # only its write id is not the persisted one
    "replacement's event deleted": (
        "delete from epoch_history where sink_id = :s and epoch = :e and event = 'replaced'",
        REPLACED,
    ),
    "re-opening's event deleted": (
        "delete from epoch_history where sink_id = :s and epoch = :e and event = 'reopened'",
        REOPENED,
    ),
    "given-up revision's event deleted": (
        "delete from epoch_history where sink_id = :s and epoch = :e and event = 'revision given up'",
        GIVEN_UP,
    ),
    # the history changed instead: no earlier event names the write the given-up revision handed back
    "given-up revision's replaced write renamed in the history": (
        "update epoch_history set write_id = 'not-the-rows-write' where sink_id = :s and epoch = :e"
        " and event in ('persisted', 'commit decided', 'committed')",
        GIVEN_UP,
    ),
    "given-up revision's number kept": (
        "update pending_sink_state set revision = 1 where sink_id = :s and epoch = :e",
        GIVEN_UP,
    ),
    "revision number changed": (
        "update pending_sink_state set revision = 7 where sink_id = :s and epoch = :e",
        REVISED,
    ),
    # a failed audit's epoch decided behind its history's back: published although its audit failed
    "failed audit's epoch decided": (
        "update pending_sink_state set commit_decided_at = created_at where sink_id = :s and epoch = :e",
        HELD,
    ),
    "row deleted, its history kept": ("delete from pending_sink_state where sink_id = :s and epoch = :e", BATCHED),
}


@pytest.mark.parametrize("change", sorted(TAMPERED))
def test_a_change_behind_the_historys_back_is_a_history_row_anomaly(store: SqlSinkStateStore, change: str) -> None:
    statement, epoch = TAMPERED[change]
    _sql(store, statement, s=SINK, e=epoch)
    anomalies = _anomalies(store)
    assert anomalies, change
    assert {(a.kind, a.epoch) for a in anomalies} == {("history_row", epoch)}, anomalies


def test_the_detail_names_the_row_and_the_event(store: SqlSinkStateStore) -> None:
    _sql(store, TAMPERED["committed event deleted"][0], s=SINK, e=COMMITTED)
    [anomaly] = _anomalies(store)
    assert "is Committed" in anomaly.detail
    assert "commit decided" in anomaly.detail
    assert "leaves it Pending" in anomaly.detail


def _event(event: str, actor: str, name: str | None, reason: str | None, run_id: str = "r1") -> dict[str, Any]:
    return {"event": event, "at": "t", "actor": actor, "actor_name": name, "reason": reason, "run_id": run_id}


def test_an_abort_without_a_cause_or_naming_no_failed_task_is_uncaused() -> None:
    """``uncaused`` reads ``eo-sink history --json``: each abort by a task names the task of its run
    that failed (its kept error, or found dead); an operator's or recovery's reason is theirs."""
    failed = _event("error", "task", "d.eo.write", "ValueError: row 7")
    caused = _event("aborted unpersisted", "task", "d.eo.abort", "write failed on try 1: ValueError: row 7")
    dead = _event("aborted", "task", "d.eo.abort", "write failed without saying why (its process ended first...)")
    by_hand = _event("aborted", "cli", "ops@host", "bad day, re-landed tomorrow")
    assert uncaused([failed, caused]) == []
    checkpoint = _event("error", "task", "d.eo.wait_for_checkpoint", "CheckpointFailed: checkpoint FAILED")
    prefixed = _event(
        "aborted", "task", "d.eo.abort", "checkpoint_failed: wait_for_checkpoint was refused on try 1: ..."
    )
    assert uncaused([checkpoint, prefixed]) == []
    assert uncaused([dead, by_hand]) == []
    old = _event("aborted", "task", "d.eo.abort", "task eo.abort of run r1: an upstream step failed")
    assert uncaused([failed, old]) == [f"the aborted event of t by task d.eo.abort gives no cause: {old['reason']!r}"]
    other_run = _event("aborted", "task", "d.eo.abort", "write failed on try 1: ValueError: row 7", run_id="r2")
    [problem] = uncaused([failed, other_run])
    assert "names no task of its run that failed" in problem
