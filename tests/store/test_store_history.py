"""Every epoch's history (``epoch_history``, migration 0012): each transition appends its event in
its own transaction, names who acted, and the retention clean-up deletes old history only; on
SQLite and PostgreSQL."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import AbortCause, Actor, ActorKind, EpochEvent, EpochStatus, acting
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from airflow_provider_exactly_once.store.history import SqlRevisions, record
from airflow_provider_exactly_once.store.sql import SqlBatchTransitions, SqlCleanupQueue
from tests.support.builders import make_pre_commit

E, E2, E3, E4 = (1_717_200_000_000 + n * 3_600_000 for n in range(4))
TASK = Actor(
    ActorKind.TASK,
    name="d.eo.commit",
    dag_id="d",
    run_id="scheduled__1",
    try_number=2,
    run_type="scheduled",
    clear_number=1,
)


def events(store: SqlSinkStateStore, sink_id: str, epoch: int) -> list[tuple[EpochEvent, str, str | None]]:
    return [(e.event, e.write_id, e.status) for e in store.history.events(sink_id, epoch)]


def test_every_transition_of_an_epoch_appends_its_event(store: SqlSinkStateStore, sink_id: str) -> None:
    first, second, third, fourth, fifth = (make_pre_commit(sink_id, E) for _ in range(5))
    store.insert_pending(first, run_id="scheduled__1", try_number=1, dag_id="d")
    store.record_warning(sink_id, E, warning="another DAG wrote this epoch")
    store.record_error(sink_id, E, write_id=first.write_id, error="commit failed: catalog down")
    store.replace_write(
        second, expected_status=EpochStatus.PENDING, expected_write_id=first.write_id, run_id="r", try_number=2
    )
    store.decide_commit(sink_id, E, write_id=second.write_id)
    store.mark_committed(sink_id, E, write_id=second.write_id, committed={"db.events": "1"})
    store.revisions.open_revision(third, expected_write_id=second.write_id, run_id="backfill__1", try_number=1)
    store.revisions.abort_revision(sink_id, E, write_id=third.write_id, reason="checkpoint FAILED")
    store.revisions.open_revision(fourth, expected_write_id=second.write_id, run_id="backfill__2", try_number=1)
    store.decide_commit(sink_id, E, write_id=fourth.write_id)
    store.mark_committed(sink_id, E, write_id=fourth.write_id, committed={"db.events": "2"})
    store.reopen_committed(
        fifth, expected_write_id=fourth.write_id, run_id="r", try_number=3, reason="table db.events re-created"
    )
    store.mark_aborted(sink_id, E, write_id=fifth.write_id, reason="given up", cause=AbortCause.CHECKPOINT_FAILED)
    queued = store.cleanups(sink_id, E)
    for task in queued:
        store.complete_cleanup(task.id)

    pending, committed, aborted = EpochStatus.PENDING.value, EpochStatus.COMMITTED.value, EpochStatus.ABORTED.value
    cleaned = [(EpochEvent.CLEANED_UP, t.write_id, None) for t in queued]
    assert events(store, sink_id, E) == [
        (EpochEvent.PERSISTED, first.write_id, pending),
        (EpochEvent.WARNING, first.write_id, pending),
        (EpochEvent.ERROR, first.write_id, pending),
        (EpochEvent.REPLACED, second.write_id, pending),
        (EpochEvent.COMMIT_DECIDED, second.write_id, pending),
        (EpochEvent.COMMITTED, second.write_id, committed),
        (EpochEvent.REVISION_OPENED, third.write_id, pending),
        (EpochEvent.REVISION_GIVEN_UP, third.write_id, committed),
        (EpochEvent.REVISION_OPENED, fourth.write_id, pending),
        (EpochEvent.COMMIT_DECIDED, fourth.write_id, pending),
        (EpochEvent.COMMITTED, fourth.write_id, committed),
        (EpochEvent.REOPENED, fifth.write_id, pending),
        (EpochEvent.ABORTED, fifth.write_id, aborted),
        *cleaned,
    ]
    # the replaced first write, the given-up revision, the write the revision replaced, the aborted fifth
    assert {w for _, w, _ in cleaned} == {first.write_id, third.write_id, second.write_id, fifth.write_id}
    history = store.history.events(sink_id, E)
    assert [h.revision for h in history if h.event is EpochEvent.COMMITTED] == [0, 1]
    # the revision records are read from these (design.md D11): each keeps the record it makes or
    # changes, and the revision's commit names the write it replaced
    assert [
        (h.event, h.revised.write_id, h.revised.status, h.replaced_write_id) for h in history if h.revised is not None
    ] == [
        (EpochEvent.REVISION_OPENED, second.write_id, committed, None),
        (EpochEvent.REVISION_GIVEN_UP, third.write_id, aborted, None),
        (EpochEvent.REVISION_OPENED, second.write_id, committed, None),
        (EpochEvent.COMMITTED, fourth.write_id, committed, second.write_id),
    ]
    assert history[-len(cleaned) - 1].reason == "checkpoint_failed: given up"
    assert history[7].reason == "checkpoint FAILED"

    unpersisted = make_pre_commit(sink_id, E2)
    store.insert_aborted(unpersisted, reason="the write task failed")
    store.enqueue_cleanup(make_pre_commit(sink_id, E2), reason="discard_late: epoch committed with write x")
    assert [e for e, _, _ in events(store, sink_id, E2)] == [EpochEvent.ABORTED_UNPERSISTED, EpochEvent.CLEANUP_QUEUED]

    batch = [make_pre_commit(sink_id, epoch) for epoch in (E3, E4)]
    for pre in batch:
        store.insert_pending(pre, run_id=None, try_number=None)
    assert store.decide_commits(sink_id, [(p.epoch, p.write_id) for p in batch]) == [E3, E4]
    marks = [CommitMark(p.epoch, p.write_id, {"db.events": "3"}, {}) for p in batch]
    assert store.mark_committed_batch(sink_id, marks) == [E3, E4]
    for pre in batch:
        assert [e for e, _, _ in events(store, sink_id, pre.epoch)] == [
            EpochEvent.PERSISTED,
            EpochEvent.COMMIT_DECIDED,
            EpochEvent.COMMITTED,
        ]


def test_a_refused_or_repeated_transition_appends_nothing(store: SqlSinkStateStore, sink_id: str) -> None:
    pre = make_pre_commit(sink_id, E)
    store.insert_pending(pre, run_id=None, try_number=None)
    store.decide_commit(sink_id, E, write_id=pre.write_id)
    store.decide_commit(sink_id, E, write_id=pre.write_id)  # the decision taken already: no second event
    with pytest.raises(Exception, match="decide to commit"):
        store.decide_commit(sink_id, E, write_id=make_pre_commit(sink_id, E).write_id)
    store.record_error(sink_id, E + 1, write_id=pre.write_id, error="no such row")
    assert [e for e, _, _ in events(store, sink_id, E)] == [EpochEvent.PERSISTED, EpochEvent.COMMIT_DECIDED]
    assert store.history.events(sink_id, E + 1) == []


def test_the_event_and_its_change_are_one_transaction(
    store: SqlSinkStateStore, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure right after the event row was written rolls back both."""
    written = record

    def then_fail(*args: Any, **kwargs: Any) -> None:
        written(*args, **kwargs)
        raise RuntimeError("crash after the history row")

    monkeypatch.setattr("airflow_provider_exactly_once.store.history.record", then_fail)
    for transition in (
        lambda: store.insert_aborted(make_pre_commit(sink_id, E), reason="the write task failed"),
        lambda: store.insert_pending(make_pre_commit(sink_id, E), run_id=None, try_number=None),
    ):
        with pytest.raises(RuntimeError, match="crash after the history row"):
            transition()
    monkeypatch.undo()
    assert store.get(sink_id, E) is None
    assert store.history.events(sink_id, E) == []


def test_the_event_names_who_acted_and_a_persist_its_own_run(store: SqlSinkStateStore, sink_id: str) -> None:
    pre = make_pre_commit(sink_id, E)
    with acting(TASK):
        store.insert_pending(pre, run_id="manual__1", try_number=1, dag_id="d")
        store.decide_commit(sink_id, E, write_id=pre.write_id)
    with acting(Actor(ActorKind.CLI, name="alice@ops-host")):
        store.mark_aborted(sink_id, E, write_id=pre.write_id, reason="by hand", decided=True)
    store.record_warning(sink_id, E, warning="outside any door")
    with acting(Actor(ActorKind.TASK, name="d" * 250 + "." + "t" * 250)):  # Airflow's widest ids
        store.record_warning(sink_id, E, warning="a long task name")
    persisted, decided, aborted, warned, long_named = store.history.events(sink_id, E)
    assert long_named.actor.name == "d" * 250
    assert (persisted.actor.run_id, persisted.actor.try_number, persisted.actor.name) == ("manual__1", 1, "d.eo.commit")
    assert decided.actor == TASK
    assert (aborted.actor.kind, aborted.actor.name, aborted.actor.run_id) == (ActorKind.CLI, "alice@ops-host", None)
    assert warned.actor.kind is ActorKind.UNKNOWN
    assert persisted.at <= decided.at <= aborted.at and persisted.at.tzinfo is not None


def test_the_retention_deletes_old_history_of_the_sink_only(
    fresh_store: SqlSinkStateStore, engine: sa.Engine, sink_id: str
) -> None:
    store = fresh_store
    for sink in (sink_id, f"{sink_id}-other"):
        pre = make_pre_commit(sink, E)
        store.insert_pending(pre, run_id=None, try_number=None)
        store.decide_commit(sink, E, write_id=pre.write_id)
    with engine.begin() as connection:  # the persists happened long ago
        connection.execute(
            sa.text("UPDATE epoch_history SET at = :old WHERE event = 'persisted'"),
            {"old": datetime(2020, 1, 1, tzinfo=UTC)},
        )
    assert store.history.expire(sink_id, timedelta(days=90)) == 1
    assert [e for e, _, _ in events(store, sink_id, E)] == [EpochEvent.COMMIT_DECIDED]
    assert len(store.history.events(f"{sink_id}-other", E)) == 2
    assert store.get(sink_id, E) is not None  # the epoch itself is never the history's to delete
    with pytest.raises(ValueError, match="positive"):
        store.history.expire(sink_id, timedelta(0))


def test_the_downgrade_drops_the_history_and_the_upgrade_brings_it_back(fresh_url: str, engine: sa.Engine) -> None:
    SqlSinkStateStore(fresh_url).dispose()
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0011")
    assert "epoch_history" not in sa.inspect(engine).get_table_names()
    forget_applied()
    store = SqlSinkStateStore(fresh_url)
    try:
        store.insert_pending(make_pre_commit("orders", E), run_id=None, try_number=None)
        assert [e.event for e in store.history.events("orders", E)] == [EpochEvent.PERSISTED]
    finally:
        store.dispose()


@pytest.mark.parametrize("owner", [SqlSinkStateStore, SqlBatchTransitions, SqlRevisions, SqlCleanupQueue])
def test_every_transition_records_its_event(owner: type) -> None:
    """A method that opens a writing transaction on epochs without ``record`` (or ``recorded``) in it is a
    transition with no history: this fails for it (a new transition must append its event)."""
    writing = {
        name: inspect.getsource(method)
        for name, method in vars(owner).items()
        if inspect.isfunction(method) and "write=True" in inspect.getsource(method)
    }
    assert writing, f"{owner.__name__} has no transition: the check would look at nothing"
    recording = ("record", "_noted(")  # ``record``, ``recorded``, and sql.py's notes
    assert [name for name, source in writing.items() if not any(r in source for r in recording)] == []


def test_a_failed_task_keeps_its_error_on_the_epoch_with_or_without_a_row(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    """Design.md D22: a try that failed before the write was persisted leaves its event alone; once
    the epoch has a row, the row's error too; a try whose error the coordinator noted already
    records nothing more; a Committed row keeps its error column empty."""
    write = TASK.__class__(ActorKind.TASK, name="d.eo.write", dag_id="d", run_id="scheduled__1", try_number=1)
    with acting(write):
        assert store.history.record_failure(sink_id, E, "ValueError: row 7", final=False)
    [retried] = store.history.events(sink_id, E)
    assert (retried.event, retried.status, retried.actor.name, retried.reason) == (
        EpochEvent.TRY_FAILED,
        None,
        "d.eo.write",
        "ValueError: row 7",
    )
    pre = make_pre_commit(sink_id, E)
    store.insert_pending(pre, run_id="scheduled__1", try_number=1, dag_id="d")
    with acting(TASK):
        store.record_error(sink_id, E, write_id=pre.write_id, error="CommitConflictExhausted: 8 tries")
        assert not store.history.record_failure(sink_id, E, "CommitConflictExhausted: 8 tries")  # noted already
    with acting(TASK.__class__(**{**TASK.__dict__, "try_number": 3})):
        assert store.history.record_failure(sink_id, E, "SinkUnavailable: catalog down")
    row = store.get(sink_id, E)
    assert row is not None and row.error == "SinkUnavailable: catalog down"
    assert events(store, sink_id, E)[-2:] == [
        (EpochEvent.ERROR, pre.write_id, EpochStatus.PENDING.value),
        (EpochEvent.ERROR, pre.write_id, EpochStatus.PENDING.value),
    ]
    store.decide_commit(sink_id, E, write_id=pre.write_id)
    store.mark_committed(sink_id, E, write_id=pre.write_id, committed={"db.events": "1"})
    with acting(TASK):
        assert store.history.record_failure(sink_id, E, "OSError: lineage endpoint down")
    row = store.get(sink_id, E)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.error is None
    assert events(store, sink_id, E)[-1] == (EpochEvent.ERROR, pre.write_id, EpochStatus.COMMITTED.value)


def test_the_first_write_after_an_abort_without_a_write_replaces_no_write(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    """An epoch aborted before its run wrote anything holds a placeholder write id; the write that
    re-opens it replaced no write, and its history says so rather than naming the placeholder."""
    nothing = PreCommit.nothing_written(sink_id, E)
    store.insert_aborted(nothing, reason="write failed on try 1: ValueError: row 7", dag_id="d")
    first = make_pre_commit(sink_id, E)
    store.replace_write(
        first, expected_status=EpochStatus.ABORTED, expected_write_id=nothing.write_id, run_id="r", try_number=1
    )
    replaced = store.history.events(sink_id, E)[-1]
    assert (replaced.event, replaced.reason) == (
        EpochEvent.REPLACED,
        "the first write of an epoch aborted before any write",
    )
    assert nothing.write_id not in (replaced.reason or "")
