"""``SinkOperations`` on a real meta store (SQLite and PostgreSQL), a real pyiceberg SQL catalog and real
Parquet files: the views, and every action going through the coordinator under the invariants."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    InvalidSinkConfig,
)
from airflow_provider_exactly_once.operations import InvalidRequest, SinkNotFound, SinkOperations
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from tests.operations.helpers import coordinator, register, state, write
from tests.recovery.helpers import E0, E1, E2, E3, E4, E5, GRACE, exists, leave_crash
from tests.support.airflow_world import TABLE, World
from tests.support.pipeline import write_location_exists


def _ops(world: World) -> SinkOperations:
    return SinkOperations(world.pipeline.store)


def test_sinks_and_epochs_list_counts_filters_and_pages(world: World) -> None:
    pipeline, sink_id = world.pipeline, world.sink_id
    coord = coordinator(world)
    epochs = [E0, E1, E2, E3, E4]
    writes = {e: write(world, e, rows=3 + n) for n, e in enumerate(epochs)}
    for epoch, pre in writes.items():
        coord.persist(pre, run_id=f"run-{epoch}", try_number=1, dag_id="hourly")
    for epoch in (E0, E1):
        pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
        coord.commit(sink_id, epoch)
    coord.abort(sink_id, E2, reason="test")
    # a second sink, a file sink, in the same store
    files = FileSinkConfig(f"{sink_id}-files", str(world.tmp / "files"))
    register(world, files)
    file_coord = pipeline.coordinator(files.sink_id, pipeline.file_committer(Path(files.root)))
    file_coord.persist(pipeline.write_files(files.sink_id, E4, Path(files.root)))

    ops = _ops(world)
    summaries = {s.sink_id: s for s in ops.sinks()}
    ours = summaries[sink_id]
    assert (ours.kind, ours.tables, ours.root, ours.registered) == ("iceberg", (world.table,), None, True)
    assert (ours.pending, ours.committed, ours.aborted) == (2, 2, 1)
    assert ours.oldest_pending_created_at == pipeline.store.get(sink_id, E3).created_at  # type: ignore[union-attr]
    assert ours.pending_cleanups == 0  # the abort's clean-up ran
    theirs = summaries[files.sink_id]
    assert (theirs.kind, theirs.root, theirs.pending, theirs.committed) == ("files", files.root, 1, 0)
    assert json.loads(json.dumps(ours.model_dump(mode="json")))["counts"] == {
        "pending": 2,
        "committed": 2,
        "aborted": 1,
    }
    assert ops.sink(sink_id) == ours

    listed = ops.epochs(sink_id=sink_id)
    assert [v.epoch for v in listed] == sorted(epochs, reverse=True), "newest epoch first"
    by_epoch = {v.epoch: v for v in listed}
    committed = by_epoch[E0]
    table = pipeline.catalog.load_table(world.table)
    assert committed.status == "Committed" and committed.rows == 3 and committed.files == 1
    assert committed.dag_id == "hourly" and committed.run_id == f"run-{E0}" and committed.try_number == 1
    assert committed.bytes == sum(f.file_size_in_bytes for f in writes[E0].tables[0].data_files) > 0
    assert committed.commit_decided_at is not None and committed.age_seconds >= 0
    [table_view] = committed.tables
    assert table_view.name == world.table
    assert table_view.snapshot in {str(s.snapshot_id) for s in table.snapshots()}
    assert by_epoch[E4].tables[0].snapshot is None and by_epoch[E4].rows == 7
    assert by_epoch[E2].status == "Aborted" and by_epoch[E2].error == "test"
    assert committed.interval_start is not None and committed.interval_start.timestamp() * 1000 == E0
    assert json.loads(json.dumps(committed.model_dump(mode="json")))["tables"][0]["rows"] == 3

    assert [v.epoch for v in ops.epochs(sink_id=sink_id, status=EpochStatus.PENDING)] == [E4, E3]
    assert [v.epoch for v in ops.epochs(sink_id=sink_id, status="committed")] == [E1, E0]
    pages = [ops.epochs(sink_id=sink_id, limit=2, offset=offset) for offset in (0, 2, 4, 6)]
    assert [[v.epoch for v in page] for page in pages] == [[E4, E3], [E2, E1], [E0], []]
    # across sinks: both sinks' E4, and nothing of the file sink's is Committed
    across = [(v.sink_id, v.epoch) for v in ops.epochs(status="Pending") if v.sink_id in (sink_id, files.sink_id)]
    assert across == [(files.sink_id, E4), (sink_id, E4), (sink_id, E3)], "by epoch, then sink id, descending"
    assert ops.epochs(sink_id=files.sink_id, status="Committed") == []
    assert ops.epoch_count(sink_id=sink_id) == 5 and ops.epoch_count(sink_id=sink_id, status="Pending") == 2
    assert ops.epoch_count(sink_id=files.sink_id, status=EpochStatus.COMMITTED) == 0

    with pytest.raises(InvalidRequest, match="limit"):
        ops.epochs(limit=0)
    with pytest.raises(InvalidRequest, match="offset"):
        ops.epochs(offset=-1)
    with pytest.raises(InvalidRequest, match="'Done'"):
        ops.epochs(status="Done")


def test_show_and_unknown_things_are_named(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre, dag_id="hourly")
    ops = _ops(world)
    view = ops.epoch(world.sink_id, E1)
    assert (view.status, view.write_id, view.dag_id, view.pending_cleanups) == ("Pending", pre.write_id, "hourly", 0)
    checkpoint = ops.checkpoint(world.sink_id, E1)
    assert (checkpoint.status, checkpoint.detail, checkpoint.source) == ("PENDING", None, "metastore")

    with pytest.raises(EpochNotFound, match=rf"sink '{world.sink_id}' epoch {E2} was never persisted"):
        ops.epoch(world.sink_id, E2)
    for action in (
        lambda: ops.abort(world.sink_id, E2, reason="x"),
        lambda: ops.commit(world.sink_id, E2),
        lambda: ops.cleanup(world.sink_id, E2),
    ):
        with pytest.raises(EpochNotFound, match=rf"sink '{world.sink_id}' epoch {E2}"):
            action()
    with pytest.raises(SinkNotFound, match="sink 'no-such-sink' is not in the sink registry"):
        ops.commit("no-such-sink", E1)
    with pytest.raises(SinkNotFound, match="sink 'no-such-sink' is unknown"):
        ops.sink("no-such-sink")
    with pytest.raises(SinkNotFound, match="no-such-sink"):
        ops.recover("no-such-sink")
    with pytest.raises(InvalidRequest, match=f"sink '{world.sink_id}' epoch {E1}: an abort needs a reason"):
        ops.abort(world.sink_id, E1, reason="  ")


def test_abort_of_a_pending_epoch_deletes_its_files_and_dry_run_changes_nothing(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre)
    ops = _ops(world)
    before = state(world, world.sink_id, [E1], [pre])

    plan = ops.abort(world.sink_id, E1, reason="bad input", dry_run=True)
    assert (plan.outcome, plan.dry_run, plan.files_deleted) == ("would abort", True, 0)
    assert pre.write_id in plan.detail and "checkpoint PENDING" in plan.detail
    assert state(world, world.sink_id, [E1], [pre]) == before, "a dry run changes nothing"

    result = ops.abort(world.sink_id, E1, reason="bad input")
    assert (result.outcome, result.dry_run, result.ok) == ("aborted", False, True)
    assert result.files_deleted == 2  # its data file and the manifest persist wrote
    row = world.pipeline.store.get(world.sink_id, E1)
    assert row is not None and row.status is EpochStatus.ABORTED and row.error == "bad input"
    assert not write_location_exists(pre), "invariant 4: the aborted write's files are gone"
    assert world.markers() == {}, "nothing of the epoch became visible"
    again = ops.abort(world.sink_id, E1, reason="again")
    assert again.outcome == "already aborted" and again.files_deleted == 0
    # the aborted epoch can no longer be committed: the refusal comes through with its message
    with pytest.raises(EpochAborted, match=f"epoch {E1} is Aborted"):
        ops.commit(world.sink_id, E1, dry_run=True)
    with pytest.raises(EpochAborted, match=f"epoch {E1} is Aborted"):
        ops.commit(world.sink_id, E1)


def test_abort_is_refused_once_the_checkpoint_completed_unless_forced(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre)
    world.mark(E1, CheckpointStatus.COMPLETED)
    ops = _ops(world)
    before = state(world, world.sink_id, [E1], [pre])
    for dry_run in (True, False):
        with pytest.raises(AbortRefused, match=f"sink '{world.sink_id}' epoch {E1}: checkpoint COMPLETED"):
            ops.abort(world.sink_id, E1, reason="oops", dry_run=dry_run)
    assert state(world, world.sink_id, [E1], [pre]) == before

    assert ops.abort(world.sink_id, E1, reason="drop", force=True, dry_run=True).outcome == "would abort"
    assert state(world, world.sink_id, [E1], [pre]) == before
    forced = ops.abort(world.sink_id, E1, reason="drop on purpose", force=True)
    assert forced.outcome == "aborted" and not write_location_exists(pre)


def test_abort_is_refused_once_a_commit_was_decided(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre)
    world.pipeline.store.decide_commit(world.sink_id, E1, write_id=pre.write_id)  # a commit crashed after deciding
    ops = _ops(world)
    for force in (False, True):
        with pytest.raises(AbortRefused, match="was decided"):
            ops.abort(world.sink_id, E1, reason="x", force=force, dry_run=True)
        with pytest.raises(AbortRefused, match="was decided"):
            ops.abort(world.sink_id, E1, reason="x", force=force)
    assert exists(pre)
    assert ops.commit(world.sink_id, E1, dry_run=True).outcome == "would commit"
    assert ops.commit(world.sink_id, E1).outcome == "committed"


def test_commit_retry_of_a_pending_epoch_makes_one_snapshot(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre)
    ops = _ops(world)
    with pytest.raises(CheckpointNotReady, match=f"sink '{world.sink_id}' epoch {E1}: checkpoint still PENDING"):
        ops.commit(world.sink_id, E1, dry_run=True)
    with pytest.raises(CheckpointNotReady):
        ops.commit(world.sink_id, E1)
    world.mark(E1, CheckpointStatus.COMPLETED)
    before = state(world, world.sink_id, [E1], [pre])
    plan = ops.commit(world.sink_id, E1, dry_run=True)
    assert plan.outcome == "would commit" and "checkpoint COMPLETED" in plan.detail and pre.write_id in plan.detail
    assert state(world, world.sink_id, [E1], [pre]) == before

    result = ops.commit(world.sink_id, E1)
    assert result.outcome == "committed" and result.report["write_id"] == pre.write_id
    assert world.markers() == {E1: [pre.write_id]}, "one snapshot carrying the marker"
    assert len(world.rows()) == 5
    assert ops.commit(world.sink_id, E1).outcome == "already committed"
    assert ops.commit(world.sink_id, E1, dry_run=True).outcome == "already committed"
    assert world.markers() == {E1: [pre.write_id]}
    assert ops.abort(world.sink_id, E1, reason="late").outcome == "already committed"
    assert len(world.rows()) == 5


def test_commit_of_a_failed_checkpoint_is_refused(world: World) -> None:
    coord = coordinator(world)
    coord.persist(write(world, E1))
    world.mark(E1, CheckpointStatus.FAILED)
    with pytest.raises(CheckpointFailed, match=f"epoch {E1}: checkpoint FAILED"):
        _ops(world).commit(world.sink_id, E1, dry_run=True)
    with pytest.raises(CheckpointFailed):
        _ops(world).commit(world.sink_id, E1)
    assert _ops(world).checkpoint(world.sink_id, E1).status == "FAILED"


def test_cleanup_of_an_aborted_epoch_whose_files_a_crash_left(world: World) -> None:
    coord = coordinator(world)
    pre = write(world, E1)
    coord.persist(pre)
    # the abort's clean-up never ran: the process died between the Aborted mark and the delete
    world.pipeline.store.mark_aborted(world.sink_id, E1, write_id=pre.write_id, reason="crash")
    ops = _ops(world)
    assert ops.epoch(world.sink_id, E1).pending_cleanups == 1
    assert ops.sink(world.sink_id).pending_cleanups == 1
    before = state(world, world.sink_id, [E1], [pre])
    plan = ops.cleanup(world.sink_id, E1, dry_run=True)
    assert plan.outcome == "would clean up" and pre.write_id in plan.detail
    assert [c["write_id"] for c in plan.report["cleanups"]] == [pre.write_id]
    assert state(world, world.sink_id, [E1], [pre]) == before and exists(pre)

    result = ops.cleanup(world.sink_id, E1)
    assert (result.outcome, result.ok, result.files_deleted) == ("cleaned up", True, 2)  # file and manifest
    assert not exists(pre)
    assert ops.epoch(world.sink_id, E1).pending_cleanups == 0
    assert ops.cleanup(world.sink_id, E1).outcome == "nothing to clean up"


def test_cleanup_never_touches_the_live_write(world: World) -> None:
    coord = coordinator(world)
    first, second = write(world, E1), write(world, E1)
    coord.persist(first)
    coord.persist(second)  # replaces the first, whose files its clean-up removed
    ops = _ops(world)
    assert ops.cleanup(world.sink_id, E1).outcome == "nothing to clean up"
    assert exists(second) and not exists(first)
    assert ops.epoch(world.sink_id, E1).write_id == second.write_id


def test_recover_dry_run_then_recover(world: World) -> None:
    left = leave_crash(world, world.iceberg_sink())
    writes = [left.committed, left.pending_completed, left.pending_failed, left.aborted_with_files, left.old_orphan]
    ops = _ops(world)
    before = state(world, world.sink_id, [E0, E1, E2, E3], [*writes, left.young_orphan])

    plan = ops.recover(world.sink_id, dry_run=True)
    assert plan.outcome == "would recover"
    assert (plan.report["commit"], plan.report["abort"], plan.report["waiting"]) == ([E1], [E2], [])
    assert [c["epoch"] for c in plan.report["cleanups"]] == [E3]
    assert [o["write_id"] for o in plan.report["orphans"]] == [left.old_orphan.write_id]
    assert plan.report["orphans_kept"] == [left.young_orphan.write_id]
    assert state(world, world.sink_id, [E0, E1, E2, E3], [*writes, left.young_orphan]) == before

    result = ops.recover(world.sink_id)
    assert result.ok and result.outcome == "recovered"
    assert (result.report["committed"], result.report["aborted"]) == ([E1], [E2])
    assert result.report["orphans_removed"] == [left.old_orphan.write_id]
    store = world.pipeline.store
    assert [store.get(world.sink_id, e).status for e in (E0, E1, E2, E3)] == [  # type: ignore[union-attr]
        EpochStatus.COMMITTED,
        EpochStatus.COMMITTED,
        EpochStatus.ABORTED,
        EpochStatus.ABORTED,
    ]
    assert world.markers() == {E0: [left.committed.write_id], E1: [left.pending_completed.write_id]}
    assert not exists(left.pending_failed) and not exists(left.aborted_with_files) and not exists(left.old_orphan)
    assert exists(left.young_orphan)
    assert ops.recover(world.sink_id, dry_run=True).outcome == "nothing to do"


def test_gc_removes_old_orphans_only_and_touches_no_epoch(world: World) -> None:
    left = leave_crash(world, world.iceberg_sink())
    ops = _ops(world)
    all_writes = [left.pending_completed, left.aborted_with_files, left.old_orphan, left.young_orphan]
    before = state(world, world.sink_id, [E1, E2, E3, E4, E5], all_writes)

    plan = ops.gc(world.sink_id, grace=GRACE, dry_run=True)
    assert plan.outcome == "would remove orphans"
    assert [o["write_id"] for o in plan.report["orphans"]] == [left.old_orphan.write_id]
    assert plan.report["orphans"][0]["files"] == 1
    assert state(world, world.sink_id, [E1, E2, E3, E4, E5], all_writes) == before

    result = ops.gc(world.sink_id, grace=GRACE)
    assert (result.outcome, result.ok, result.files_deleted) == ("removed orphans", True, 1)
    assert result.report["orphans_removed"] == [left.old_orphan.write_id]
    assert result.report["orphans_kept"] == [left.young_orphan.write_id]
    assert not exists(left.old_orphan) and exists(left.young_orphan)
    after = state(world, world.sink_id, [E1, E2, E3, E4, E5], all_writes)
    assert after.rows == before.rows, "gc changes no epoch"
    assert exists(left.pending_completed) and exists(left.aborted_with_files)
    assert ops.gc(world.sink_id, grace=GRACE).outcome == "nothing to do"
    with pytest.raises(InvalidRequest, match="grace"):
        ops.gc(world.sink_id, grace=timedelta(hours=-1))


def test_a_checkpoint_source_that_cannot_answer_is_shown_with_the_reason(world: World) -> None:
    """The view says why the status is unknown instead of failing; the actions still refuse loudly."""
    sink = world.iceberg_sink()
    broken = {
        "kind": "markers",
        "path_template": "nosuchproto://bucket/{sink_id}/{epoch}",
        "success_marker": "_SUCCESS",
        "failed_marker": "_FAILED",
        "storage_options": {},
    }
    world.pipeline.store.registry.register_sink(sink.sink_id, sink.model_dump(mode="json"), broken)
    coordinator(world).persist(write(world, E1))
    view = _ops(world).checkpoint(world.sink_id, E1)
    assert (view.status, view.source) == (None, "markers")
    assert view.detail is not None and "nosuchproto" in view.detail
    with pytest.raises(InvalidSinkConfig, match="nosuchproto"):
        _ops(world).commit(world.sink_id, E1, dry_run=True)


def test_rows_of_every_table_count(world: World) -> None:
    """Fan-out: an epoch's totals are the sum over its tables, each table shown on its own."""
    pipeline = world.pipeline
    pipeline.create_table("second")
    sink_id = world.sink_id
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    sink = IcebergSinkConfig(
        sink_id, (world.table, f"{pipeline.namespace}.second"), iceberg_conn_id=world.iceberg_conn_id
    )
    register(world, sink)
    pre = pipeline.write_iceberg(sink_id, E1, [TABLE, "second"], rows=4)
    coordinator(world).persist(pre)
    view = _ops(world).epoch(sink_id, E1)
    assert [(t.name, t.rows) for t in view.tables] == [(world.table, 4), (f"{pipeline.namespace}.second", 4)]
    assert view.rows == 8 and view.files == 2


def test_the_revisions_of_a_reprocessed_epoch_are_shown_and_a_pending_one_can_be_aborted(world: World) -> None:
    pipeline, sink_id = world.pipeline, world.sink_id
    coord = pipeline.coordinator(sink_id, pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"})
    gens = ["2024-06-01T01:00:00.000000Z/0000000000", "2024-06-02T01:00:00.000000Z/0000000001"]
    first, second, third = (
        write(world, E1).model_copy(update={"generation": g})
        for g in (gens[0], gens[1], "2024-06-03T01:00:00.000000Z/0000000002")
    )
    pipeline.checkpoint(sink_id, E1, CheckpointStatus.COMPLETED)
    for pre in (first, second):
        coord.persist(pre, run_id="scheduled__1", try_number=1, dag_id="hourly")
        coord.commit(sink_id, E1)
    coord.persist(third, run_id="scheduled__1", try_number=1, dag_id="hourly")

    ops = _ops(world)
    view = ops.epoch(sink_id, E1)
    assert (view.status, view.write_id, view.revision, view.replacing_write_id) == (
        "Pending",
        third.write_id,
        2,
        second.write_id,
    )
    assert [(r.revision, r.write_id, r.status) for r in view.revisions] == [
        (0, first.write_id, "Replaced"),
        (1, second.write_id, "Committed"),
        (2, third.write_id, "Pending"),
    ]
    assert view.model_dump(mode="json")["revisions"][1]["committed"] == dict(
        pipeline.store.get(sink_id, E1).replaces.committed
    )  # type: ignore[union-attr]

    plan = ops.abort(sink_id, E1, reason="not this correction", dry_run=True)
    assert plan.outcome == "would abort" and "revision 2 given up" in plan.detail
    done = ops.abort(sink_id, E1, reason="not this correction")
    assert done.outcome == "revision aborted: the write it would have replaced stays visible"
    after = ops.epoch(sink_id, E1)
    assert (after.status, after.write_id, after.revision) == ("Committed", second.write_id, 1)
    assert [r.status for r in after.revisions] == ["Replaced", "Committed", "Aborted"]
    assert not write_location_exists(third)
    assert {r["write_id"] for r in pipeline.rows(TABLE)} == {second.write_id}
