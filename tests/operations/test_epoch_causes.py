"""What an epoch that went wrong tells its operator (issue 55), through ``SinkOperations`` on a real meta
store (SQLite and PostgreSQL), a real Iceberg SQL catalog and real Parquet files:

- each failed task's event reads as ``core.epochs.failed_step`` says it, with the task's log in
  Airflow once a door links it (``urls.task_log``), and the epoch's shown error is that failure,
  for a row and for an epoch without one; another DAG's failures stay hidden, links included;
- an incremental epoch whose write never persisted is an epoch (``RESERVED``): listed among the
  rows on every page, shown with its reservation, its run and its failure; its checkpoint says
  "range reserved"; once aborted, which later epoch read its range again.

The failures are recorded as the epoch group's failure callback records them
(``store.history.record_failure`` under the failed task as actor), the ranges reserved by the write
operator's own rules (``runtime.run_epochs``).
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, acting, run_failure
from airflow_provider_exactly_once.core.errors import EpochNotFound
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.operations.views import HIDDEN_TEXT, RANGE_READ_AGAIN, RESERVED, UNPERSISTED
from tests.operations.helpers import (
    SILVER_DAG,
    coordinator,
    fail,
    incremental,
    persist_range,
    reserve,
    task_actor,
    write,
)
from tests.recovery.helpers import E0, E1, E2, E3, E4
from tests.support.airflow_world import World

AIRFLOW = "https://airflow.example.com"
CAST_OVERFLOW = 'SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D of the type "DOUBLE" cannot be cast'


def _run(epoch: int) -> str:
    return f"scheduled__{epoch}+00:00"


def test_a_failed_write_is_the_aborted_epochs_cause_with_its_log(world: World) -> None:
    """A write that failed before its persist (no row), and the abort its run then made: the epoch,
    its history and its cause say which task failed, on which try, with what, and link its log."""
    sink_id, run_id = world.sink_id, _run(E1)
    fail(world, E1, "exactly_once_silver.write", run_id, CAST_OVERFLOW, try_number=1, final=False)
    fail(world, E1, "exactly_once_silver.write", run_id, CAST_OVERFLOW, try_number=2)
    ops = SinkOperations(world.pipeline.store)

    unpersisted = ops.epoch(sink_id, E1)  # before the abort: the failure is all there is
    assert (unpersisted.status, unpersisted.dag_id, unpersisted.run_id) == (UNPERSISTED, SILVER_DAG, run_id)
    assert unpersisted.error == f"write failed on try 2: {CAST_OVERFLOW}"
    assert ops.dag_of(sink_id, E1) == SILVER_DAG

    events = world.pipeline.store.history.events(sink_id, E1)
    reason = run_failure(events, run_id)
    assert reason == f"write failed on try 2: {CAST_OVERFLOW}"
    with acting(task_actor("exactly_once_silver.abort", run_id)):
        coordinator(world).abort(sink_id, E1, reason=reason, dag_id=SILVER_DAG)

    view = ops.epoch(sink_id, E1)
    assert (view.status, view.error) == ("Aborted", reason)
    assert view.cause is not None
    assert (view.cause.task_id, view.cause.try_number, view.cause.run_id) == ("exactly_once_silver.write", 2, run_id)
    assert view.cause.log_url is None  # no door linked it yet
    linked = view.linked(AIRFLOW).model_dump(mode="json")["cause"]
    assert linked["log_url"] == (
        f"{AIRFLOW}/dags/{SILVER_DAG}/runs/{quote(run_id)}/tasks/exactly_once_silver.write?try_number=2"
    )
    assert linked["step"] == reason

    history = [e.linked(AIRFLOW) for e in ops.history(sink_id, E1)]
    steps = [(e.event, e.step, e.task_id) for e in history if e.step]
    assert steps == [
        ("try failed", f"write failed on try 1, retried: {CAST_OVERFLOW}", "exactly_once_silver.write"),
        ("error", f"write failed on try 2: {CAST_OVERFLOW}", "exactly_once_silver.write"),
    ]
    assert [e.model_dump(mode="json")["log_url"] for e in history if e.step] == [
        f"{AIRFLOW}/dags/{SILVER_DAG}/runs/{quote(run_id)}/tasks/exactly_once_silver.write?try_number={n}"
        for n in (1, 2)
    ]
    assert all(e.log_url is None for e in history if not e.step)  # only a failed task has a log to show


def test_a_pending_epochs_error_is_its_failed_commit_and_its_refusals_read_as_such(world: World) -> None:
    sink_id, run_id = world.sink_id, _run(E2)
    coordinator(world).persist(write(world, E2), run_id=run_id, try_number=1, dag_id=SILVER_DAG)
    fail(world, E2, "commit", run_id, "SinkUnavailable: the catalog did not answer", final=False)
    ops = SinkOperations(world.pipeline.store)
    view = ops.epoch(sink_id, E2)
    assert view.error == "SinkUnavailable: the catalog did not answer"  # the row's error, as kept
    assert view.cause is not None and view.cause.step == (
        "commit failed on try 1, retried: SinkUnavailable: the catalog did not answer"
    )
    fail(world, E2, "write", run_id, "EarlierEpochUndecided: epoch 7 is not settled", try_number=2)
    view = ops.epoch(sink_id, E2)
    assert (
        view.cause is not None
        and view.cause.step == "write must wait on try 2: EarlierEpochUndecided: epoch 7 is not settled"
    )
    # an error no task recorded (a coordinator's own) has no task to link
    world.pipeline.store.record_error(sink_id, E2, write_id=view.write_id, error="CommitConflictExhausted: 8 tries")
    assert ops.epoch(sink_id, E2).cause is None


def test_another_dags_failure_and_its_log_stay_hidden(world: World) -> None:
    """A user granted only the epoch's DAG sees another DAG's failed task as that DAG's: no run, no
    task, no text, and no link to its log, whoever links the views."""
    sink_id = world.sink_id
    coordinator(world).persist(write(world, E3), run_id=_run(E3), try_number=1, dag_id=SILVER_DAG)
    with acting(task_actor("write", "manual__other", 3, dag_id="other_dag")):
        world.pipeline.store.history.record_failure(sink_id, E3, "ValueError: row 7 of other_dag")
    ops = SinkOperations(world.pipeline.store)
    everything = ops.epoch(sink_id, E3).linked(AIRFLOW)
    assert everything.cause is not None and everything.cause.log_url and "other_dag" in everything.cause.log_url

    view = ops.epoch(sink_id, E3, dag_ids={SILVER_DAG}).linked(AIRFLOW)
    assert view.cause is None and view.error == HIDDEN_TEXT
    [event] = [e.linked(AIRFLOW) for e in ops.history(sink_id, E3, dag_ids={SILVER_DAG}) if e.step]
    assert (event.step, event.task_id, event.run_id, event.log_url) == (HIDDEN_TEXT, None, None, None)
    assert "other_dag" not in str(event.model_dump(mode="json")) and "manual__other" not in str(
        view.model_dump(mode="json")
    )


def test_a_reserved_epoch_is_listed_shown_and_settled(world: World) -> None:
    """An incremental epoch whose range is reserved and whose write never persisted: listed first
    (it is the newest), counted, filtered by ``Reserved``, shown with its range, run and failure;
    aborted, it says which later epoch read its range, in its view and its history."""
    incremental(world)
    sink_id, store = world.sink_id, world.pipeline.store
    first = reserve(world, E1, 100, _run(E1))
    persist_range(world, E1, first, _run(E1))
    store.checkpoints.set_checkpoint(sink_id, E1, CheckpointStatus.COMPLETED)
    coordinator(world).commit(sink_id, E1)
    killed = reserve(world, E2, 200, _run(E2))
    ops = SinkOperations(store)

    [listed, committed] = ops.epochs(sink_id=sink_id)
    assert (listed.epoch, listed.status, committed.epoch) == (E2, RESERVED, E1)
    assert (listed.run_id, listed.dag_id) == (_run(E2), SILVER_DAG)  # the DAG of the epoch before it
    assert listed.consumed == killed.describe() and not listed.written
    assert [v.epoch for v in ops.epochs(sink_id=sink_id, status="reserved")] == [E2]
    assert [v.epoch for v in ops.epochs(sink_id=sink_id, status="Committed")] == [E1]
    assert ops.epoch_count(sink_id=sink_id) == 2 and ops.epoch_count(sink_id=sink_id, status=RESERVED) == 1
    assert ops.sink(sink_id).reserved == 1 and ops.sink(sink_id).model_dump(mode="json")["reserved"] == 1

    fail(world, E2, "write", _run(E2), CAST_OVERFLOW, try_number=3)
    shown = ops.epoch(sink_id, E2)
    assert shown.status == RESERVED and shown.reservation is not None
    reservation = shown.model_dump(mode="json")["reservation"]
    assert (reservation["range"], reservation["position"], reservation["run_id"]) == (killed.describe(), 1, _run(E2))
    assert (reservation["after_snapshot_id"], reservation["to_snapshot_id"]) == (100, 200)
    assert shown.error == f"write failed on try 3: {CAST_OVERFLOW}" and shown.try_number == 3
    assert ops.checkpoint(sink_id, E2).model_dump(mode="json")["meaning"] == "range reserved"
    assert [e.event for e in ops.history(sink_id, E2)] == ["error"]

    result = ops.abort(sink_id, E2, reason="its run was killed")
    assert result.outcome == "recorded Aborted: the run produced no write"
    again = reserve(world, E3, 300, _run(E3))
    assert (again.after_snapshot_id, again.to_snapshot_id) == (100, 300)  # E2's range, read again
    persist_range(world, E3, again, _run(E3))
    store.checkpoints.set_checkpoint(sink_id, E3, CheckpointStatus.COMPLETED)
    coordinator(world).commit(sink_id, E3)

    aborted = ops.epoch(sink_id, E2)
    assert aborted.status == "Aborted" and aborted.consumed == killed.describe()  # from its reservation
    assert aborted.reservation is not None and aborted.reservation.read_again_by == ((E3, "Committed"),)
    assert aborted.reservation.read_again == f"read again by epoch {E3} (Committed)"
    assert ops.checkpoint(sink_id, E2).meaning == "range reserved"  # not a completed input of an aborted epoch
    history = ops.history(sink_id, E2)
    assert [e.event for e in history][-1] == RANGE_READ_AGAIN
    assert f"epoch {E3}" in (history[-1].reason or "") and history[-1].run_id == _run(E3)
    assert ops.epoch(sink_id, E3).reservation is not None and not ops.epoch(sink_id, E3).reservation.read_again_by  # type: ignore[union-attr]
    assert ops.sink(sink_id).reserved == 0


def test_an_epoch_with_nothing_recorded_is_still_not_found(world: World) -> None:
    ops = SinkOperations(world.pipeline.store)
    for read in (ops.epoch, ops.history, ops.dag_of):
        with pytest.raises(EpochNotFound, match=f"epoch {E4} was never persisted"):
            read(world.sink_id, E4)


def test_reserved_epochs_take_their_place_on_every_page(world: World) -> None:
    """Reservations without rows placed among the rows by epoch, newest first: every page of a
    listing is the same slice of the whole, whatever the page size (one sink and, on a store of its
    own, all sinks)."""
    store, sink_id = world.pipeline.store, world.sink_id
    for epoch in (E0, E1, E3):
        coordinator(world).persist(write(world, epoch), run_id=_run(epoch), try_number=1, dag_id=SILVER_DAG)
    # Reservations planted as a store of mixed history may hold them (the chain's rules are the
    # write operator's; the listing must place any reservation without a row).
    store.input_ranges.reserve(sink_id, E2, 0, SnapshotRange(table="bronze.x", to_snapshot_id=1), _run(E2))
    other = f"{sink_id}-b"
    store.input_ranges.reserve(other, E1, 0, SnapshotRange(table="bronze.x", to_snapshot_id=1), _run(E1))
    store.input_ranges.reserve(other, E4, 1, SnapshotRange(table="bronze.x", to_snapshot_id=1), _run(E4))
    ops = SinkOperations(store)

    whole = [(v.epoch, v.status) for v in ops.epochs(sink_id=sink_id, limit=10)]
    assert whole == [(E3, "Pending"), (E2, RESERVED), (E1, "Pending"), (E0, "Pending")]
    for size in (1, 2, 3):
        pages = [ops.epochs(sink_id=sink_id, limit=size, offset=o) for o in range(0, 5, size)]
        assert [(v.epoch, v.status) for page in pages for v in page] == whole
    assert ops.epoch_count(sink_id=sink_id) == 4
    if not world.pipeline.meta_url.startswith("sqlite"):
        return  # the session's PostgreSQL database holds other tests' sinks
    everything = [(v.sink_id, v.epoch) for v in ops.epochs(limit=20)]
    assert everything == [
        (other, E4),
        (sink_id, E3),
        (sink_id, E2),
        (sink_id, E1),
        (sink_id, E0),
    ]  # the other sink's newest link only is unsettled (its E1 is followed by E4)
    for size in (1, 2, 4):
        pages = [ops.epochs(limit=size, offset=o) for o in range(0, 6, size)]
        assert [(v.sink_id, v.epoch) for page in pages for v in page] == everything
    assert ops.epoch_count() == 5
    assert {s.sink_id: s.reserved for s in ops.sinks()} == {sink_id: 1, other: 1}
