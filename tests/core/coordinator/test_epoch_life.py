"""The life of an epoch through the coordinator, on real stores and sinks (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    InvalidPreCommit,
)
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from tests.support.pipeline import Pipeline, as_tuples, expected_rows, write_location_exists

COMPLETED, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.FAILED


def test_one_table_happy_path(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 1000, ["orders"], rows=7, files=3)

    assert coordinator.persist(pre, run_id="scheduled__1", try_number=1).outcome is PersistOutcome.PERSISTED
    row = pipeline.store.get(sink_id, 1000)
    assert row is not None and row.status is EpochStatus.PENDING and row.run_id == "scheduled__1"
    with pytest.raises(CheckpointNotReady):
        coordinator.commit(sink_id, 1000)
    assert pipeline.rows("orders", branch=branch) == []  # invariant 2: nothing visible before the checkpoint

    pipeline.checkpoint(sink_id, 1000, COMPLETED)
    result = coordinator.commit(sink_id, 1000)
    assert result.outcome is CommitOutcome.COMMITTED
    assert result.record.status is EpochStatus.COMMITTED
    name = f"{pipeline.namespace}.orders"
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([pre], name)
    assert pipeline.marker_snapshots("orders", sink_id) == {1000: [pre.write_id]}
    snapshot_id = result.record.committed[name]  # type: ignore[index]
    assert int(snapshot_id) == pipeline.catalog.load_table(name).metadata.refs[branch].snapshot_id

    again = coordinator.commit(sink_id, 1000)
    assert again.outcome is CommitOutcome.ALREADY_COMMITTED
    assert pipeline.marker_snapshots("orders", sink_id) == {1000: [pre.write_id]}
    assert coordinator.persist(pre).outcome is PersistOutcome.ALREADY_COMMITTED


def test_fan_out_over_three_tables(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    names = ["a", "b", "c"]
    for name in names:
        pipeline.create_table(name)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 7, names, rows=4)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 7, COMPLETED)
    record = coordinator.commit(sink_id, 7).record
    assert record.committed is not None and set(record.committed) == {f"{pipeline.namespace}.{n}" for n in names}
    for name in names:
        assert as_tuples(pipeline.rows(name, branch=branch)) == expected_rows([pre], f"{pipeline.namespace}.{name}")
        assert pipeline.marker_snapshots(name, sink_id) == {7: [pre.write_id]}


def test_empty_epoch_is_persisted_and_committed_without_a_snapshot(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 3, ["orders"], rows=0)
    assert pre.is_empty
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 3, COMPLETED)
    record = coordinator.commit(sink_id, 3).record
    assert record.status is EpochStatus.COMMITTED  # invariant 7: counted, not skipped
    assert record.committed == {f"{pipeline.namespace}.orders": EMPTY}
    assert pipeline.catalog.load_table(f"{pipeline.namespace}.orders").metadata.snapshots == []


def test_file_sink_happy_path(pipeline: Pipeline, sink_id: str, tmp_path: Path) -> None:
    root = tmp_path / "sink"
    root.mkdir()
    coordinator = pipeline.coordinator(sink_id, pipeline.file_committer(root))
    pre = pipeline.write_files(sink_id, 11, root, rows=9, files=3)
    expected = expected_rows([pre], str(root))  # read from staging, before the commit moves them
    coordinator.persist(pre)
    assert ds.dataset(str(root), format="parquet").count_rows() == 0  # staging is invisible to readers
    pipeline.checkpoint(sink_id, 11, COMPLETED)
    assert coordinator.commit(sink_id, 11).outcome is CommitOutcome.COMMITTED
    visible = ds.dataset(str(root), format="parquet").to_table().to_pylist()
    assert as_tuples(visible) == expected
    assert coordinator.commit(sink_id, 11).outcome is CommitOutcome.ALREADY_COMMITTED
    assert ds.dataset(str(root), format="parquet").count_rows() == 9


def test_failed_checkpoint_aborts_and_deletes_the_write(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 5, ["orders"], rows=3)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 5, FAILED)
    with pytest.raises(CheckpointFailed):
        coordinator.commit(sink_id, 5)
    result = coordinator.abort(sink_id, 5, reason="checkpoint failed")
    assert result.outcome is AbortOutcome.ABORTED and result.files_deleted >= 1
    assert not write_location_exists(pre)
    assert pipeline.store.get(sink_id, 5).status is EpochStatus.ABORTED  # type: ignore[union-attr]
    assert coordinator.abort(sink_id, 5, reason="again").outcome is AbortOutcome.ALREADY_ABORTED
    with pytest.raises(EpochAborted):
        coordinator.commit(sink_id, 5)
    assert pipeline.rows("orders", branch=branch) == []


def test_abort_is_refused_once_the_checkpoint_completed_or_the_commit_was_decided(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 9, ["orders"])
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 9, COMPLETED)
    with pytest.raises(AbortRefused, match="checkpoint COMPLETED"):
        coordinator.abort(sink_id, 9, reason="sensor timed out")
    pipeline.store.decide_commit(sink_id, 9, write_id=pre.write_id)
    with pytest.raises(AbortRefused, match="decided"):
        coordinator.abort(sink_id, 9, reason="operator", force=True)
    assert write_location_exists(pre)
    assert coordinator.commit(sink_id, 9).outcome is CommitOutcome.COMMITTED


def test_abort_of_a_write_that_was_never_persisted_removes_its_files(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 2, ["orders"])
    assert coordinator.abort(sink_id, 2, reason="write failed", write=pre).outcome is AbortOutcome.NOT_PERSISTED
    assert not write_location_exists(pre)
    tombstone = pipeline.store.get(sink_id, 2)
    assert tombstone is not None and tombstone.status is EpochStatus.ABORTED
    with pytest.raises(EpochAborted, match=r"discarded|aborted"):
        coordinator.persist(pre)  # a late persist of the deleted write cannot resurrect it
    assert coordinator.abort(sink_id, 2, reason="again").outcome is AbortOutcome.ALREADY_ABORTED
    rerun = pipeline.write_iceberg(sink_id, 2, ["orders"])
    assert coordinator.persist(rerun).outcome is PersistOutcome.REPLACED
    with pytest.raises(EpochNotFound):
        coordinator.commit(sink_id, 12345)


def test_an_epoch_aborted_before_any_write_is_recorded_with_its_reason(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = coordinator.abort(sink_id, 3, reason="settled sensor: checkpoint FAILED", dag_id="orders_daily")
    assert first.outcome is AbortOutcome.NO_WRITE and first.files_deleted == 0
    row = pipeline.store.get(sink_id, 3)
    assert row is not None and row.status is EpochStatus.ABORTED and not row.pre_commit.written
    assert row.error == "settled sensor: checkpoint FAILED" and row.dag_id == "orders_daily"
    assert pipeline.store.cleanups(sink_id, 3) == []  # nothing to delete, nothing left queued
    assert coordinator.abort(sink_id, 3, reason="retried").outcome is AbortOutcome.ALREADY_ABORTED
    with pytest.raises(InvalidPreCommit, match="at least one table"):
        coordinator.persist(row.pre_commit)  # the record is never mistaken for a write
    rerun = pipeline.write_iceberg(sink_id, 3, ["orders"])  # the day is run again once its input is fixed
    assert coordinator.persist(rerun).outcome is PersistOutcome.REPLACED
    pipeline.checkpoint(sink_id, 3, COMPLETED)
    assert coordinator.commit(sink_id, 3).outcome is CommitOutcome.COMMITTED
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([rerun], f"{pipeline.namespace}.orders")


def test_a_second_write_for_a_pending_epoch_replaces_the_first(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = pipeline.write_iceberg(sink_id, 4, ["orders"], rows=3)
    second = pipeline.write_iceberg(sink_id, 4, ["orders"], rows=6)
    coordinator.persist(first)
    created = pipeline.store.get(sink_id, 4).created_at  # type: ignore[union-attr]
    assert coordinator.persist(second).outcome is PersistOutcome.REPLACED
    assert not write_location_exists(first)  # handed to clean-up, and cleaned
    row = pipeline.store.get(sink_id, 4)
    assert row is not None and row.write_id == second.write_id and row.created_at == created
    pipeline.checkpoint(sink_id, 4, COMPLETED)
    coordinator.commit(sink_id, 4)
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([second], f"{pipeline.namespace}.orders")


def test_a_second_write_for_a_committed_epoch_changes_nothing(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = pipeline.write_iceberg(sink_id, 4, ["orders"], rows=3)
    coordinator.persist(first)
    pipeline.checkpoint(sink_id, 4, COMPLETED)
    coordinator.commit(sink_id, 4)
    late = pipeline.write_iceberg(sink_id, 4, ["orders"], rows=6)
    result = coordinator.persist(late)
    assert result.outcome is PersistOutcome.ALREADY_COMMITTED and result.write_id == first.write_id
    assert not write_location_exists(late)
    again = coordinator.persist(late)  # a retried persist task of the late write: same answer, no failure
    assert again.outcome is PersistOutcome.ALREADY_COMMITTED and again.write_id == first.write_id
    assert write_location_exists(first)
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([first], f"{pipeline.namespace}.orders")
    assert pipeline.marker_snapshots("orders", sink_id) == {4: [first.write_id]}


def test_a_rerun_of_an_aborted_epoch_persists_a_new_write(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = pipeline.write_iceberg(sink_id, 6, ["orders"])
    coordinator.persist(first)
    coordinator.abort(sink_id, 6, reason="sensor timed out")
    with pytest.raises(EpochAborted, match="run the write again"):
        coordinator.persist(first)
    rerun = pipeline.write_iceberg(sink_id, 6, ["orders"])
    assert coordinator.persist(rerun).outcome is PersistOutcome.REPLACED
    pipeline.checkpoint(sink_id, 6, COMPLETED)
    coordinator.commit(sink_id, 6)
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([rerun], f"{pipeline.namespace}.orders")


def test_a_backfill_committed_out_of_order_holds_every_epoch_once(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    order = [50, 10, 40, 20, 30]
    writes = {epoch: pipeline.write_iceberg(sink_id, epoch, ["orders"], rows=2) for epoch in order}
    for epoch in order:
        coordinator.persist(writes[epoch])
        pipeline.checkpoint(sink_id, epoch, COMPLETED)
    for epoch in reversed(order):
        coordinator.commit(sink_id, epoch)
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows(
        writes.values(), f"{pipeline.namespace}.orders"
    )
    assert {e: len(w) for e, w in pipeline.marker_snapshots("orders", sink_id).items()} == dict.fromkeys(order, 1)


def test_another_writer_appending_during_the_commit_makes_it_retry_and_land_once(
    pipeline: Pipeline, sink_id: str, faults: object, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 8, ["orders"], rows=4)
    other = pipeline.write_iceberg("other-writer", 99, ["orders"], rows=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 8, COMPLETED)

    def other_writer_commits() -> None:
        # Another sink's commit to the same branch (pyiceberg's own append cannot create a branch).
        IcebergSinkCommitter(pipeline.catalog, branch=branch).commit(CommitPlan(other), pipeline.store.now())

    faults.then("iceberg.before_catalog_update", other_writer_commits)  # type: ignore[attr-defined]
    coordinator.commit(sink_id, 8)
    assert faults.seen["iceberg.loaded"] >= 2  # type: ignore[attr-defined]
    assert pipeline.marker_snapshots("orders", sink_id) == {8: [pre.write_id]}
    rows = pipeline.rows("orders", branch=branch)
    assert len(rows) == 6
    assert [r for r in as_tuples(rows) if r[2] == pre.write_id] == expected_rows([pre], f"{pipeline.namespace}.orders")


def test_the_plan_prepared_before_the_decision_is_used_only_while_fresh(
    pipeline: Pipeline, sink_id: str, faults: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_exactly_once.sinks.iceberg import committer as committer_module

    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    for epoch, stale in ((1, False), (2, True)):
        coordinator.persist(pipeline.write_iceberg(sink_id, epoch, ["orders"]))
        pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
        monkeypatch.setattr(committer_module, "PREPARED_FRESH_S", -1.0 if stale else 5.0)
        before = faults.seen["iceberg.loaded"]  # type: ignore[attr-defined]
        coordinator.commit(sink_id, epoch)
        loads = faults.seen["iceberg.loaded"] - before  # type: ignore[attr-defined]
        assert loads == (2 if stale else 1), (epoch, loads)  # prepare's load, plus the commit's if stale


def test_a_commit_decided_earlier_loads_the_table_afresh(pipeline: Pipeline, sink_id: str, faults: object) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    pipeline.store.decide_commit(sink_id, 1, write_id=pre.write_id)  # then the deciding attempt died
    before = faults.seen["iceberg.loaded"]  # type: ignore[attr-defined]
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    assert faults.seen["iceberg.loaded"] - before == 1  # type: ignore[attr-defined]  # no prepare: the commit's own load
    assert pipeline.marker_snapshots("orders", sink_id) == {1: [pre.write_id]}
