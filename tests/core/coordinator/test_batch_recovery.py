"""Recovery commits runs of Pending appends together (``core/coordinator.py``): a crash at every step of a
batch, then a clean recovery, leaves every epoch committed exactly once, each in its own marked
snapshot, in epoch order on the branch; an epoch that cannot join a batch commits alone where it
stands in that order.

Crashes are ``SimulatedCrash`` at named fault points, as in ``test_crash_recovery.py``; recovery then
runs on a fresh coordinator without faults, as the recovery DAG would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.precommit import PreCommit, WrittenColumn
from tests.core.coordinator.test_crash_recovery import _recovered
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline, as_tuples, expected_rows

#: Every point one batch passes, in order: the sink loads the table (prepare_batch), the commits are
#: decided, the catalog commit is staged and swapped in, and the epochs are marked Committed.
BATCH_POINTS = [
    "iceberg.loaded",
    "batch.decided",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "batch.visible",
    "batch.marked",
]


def history(pipeline: Pipeline, name: str, sink_id: str, branch: str) -> list[tuple[int, str]]:
    """``(epoch, write_id)`` of the sink's marked snapshots on the branch, oldest first."""
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    ref = table.metadata.refs.get(branch)
    chain = []
    snapshot_id = ref.snapshot_id if ref is not None else None
    while snapshot_id is not None:
        snapshot = by_id[snapshot_id]
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get("exactly-once.sink-id") == sink_id:
            chain.append((int(props["exactly-once.epoch"]), props["exactly-once.write-id"]))
        snapshot_id = snapshot.parent_snapshot_id
    return chain[::-1]


def _persisted(pipeline: Pipeline, sink_id: str, epochs: range, names: list[str]) -> list[PreCommit]:
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    writes = []
    for epoch in epochs:
        pre = pipeline.write_iceberg(sink_id, epoch, names, rows=2)
        coordinator.persist(pre)
        pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
        writes.append(pre)
    return writes


def _assert_exactly_once_in_order(
    pipeline: Pipeline, sink_id: str, writes: list[PreCommit], names: list[str], branch: str
) -> None:
    for pre in writes:
        row = pipeline.store.get(sink_id, pre.epoch)
        assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == pre.write_id
        assert set(row.committed or {}) == {f"{pipeline.namespace}.{name}" for name in names}
    for name in names:
        assert history(pipeline, name, sink_id, branch) == [(pre.epoch, pre.write_id) for pre in writes]
        table = f"{pipeline.namespace}.{name}"
        assert as_tuples(pipeline.rows(name, branch=branch)) == expected_rows(writes, table)


@pytest.mark.parametrize("point", BATCH_POINTS)
def test_crash_during_a_batch_then_recover_commits_each_epoch_exactly_once_in_order(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str, branch: str
) -> None:
    names = ["a", "b"]  # fan-out: one catalog commit per table, so a crash can fall between them
    for name in names:
        pipeline.create_table(name)
    writes = _persisted(pipeline, sink_id, range(1, 6), names)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))

    faults.crash_at(point)
    with pytest.raises(SimulatedCrash):
        coordinator.recover(sink_id)
    _recovered(pipeline, sink_id, pipeline.iceberg_committer(branch=branch), branch)

    _assert_exactly_once_in_order(pipeline, sink_id, writes, names, branch)


def test_crash_between_the_tables_of_a_batch_leaves_one_table_with_every_epoch(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    names = ["a", "b"]
    for name in names:
        pipeline.create_table(name)
    writes = _persisted(pipeline, sink_id, range(1, 5), names)
    # Table by table (Glue, or a catalog switched to it; the SQL catalog's one transaction: test_sql_transactions.py).
    coordinator = pipeline.coordinator(sink_id, pipeline.table_by_table_committer(branch=branch))
    faults.crash_at("iceberg.after_catalog_update")
    with pytest.raises(SimulatedCrash):
        coordinator.recover(sink_id)
    # The first table holds the whole batch, the second none of it; every row is still Pending.
    assert [e for e, _ in history(pipeline, "a", sink_id, branch)] == [1, 2, 3, 4]
    assert history(pipeline, "b", sink_id, branch) == []
    assert all(r.status is EpochStatus.PENDING for r in pipeline.store.epochs_with_status(sink_id, EpochStatus.PENDING))
    assert len(pipeline.store.epochs_with_status(sink_id, EpochStatus.PENDING)) == 4

    _recovered(pipeline, sink_id, pipeline.iceberg_committer(branch=branch), branch)
    _assert_exactly_once_in_order(pipeline, sink_id, writes, names, branch)


def test_a_crash_after_the_catalog_commit_is_settled_by_the_markers_without_a_second_commit(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    pipeline.create_table("orders")
    writes = _persisted(pipeline, sink_id, range(1, 4), ["orders"])
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    faults.crash_at("batch.visible")
    with pytest.raises(SimulatedCrash):
        coordinator.recover(sink_id)
    snapshots = [s.snapshot_id for s in pipeline.catalog.load_table(f"{pipeline.namespace}.orders").snapshots()]
    assert len(snapshots) == 3

    _recovered(pipeline, sink_id, pipeline.iceberg_committer(), "main")
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    assert [s.snapshot_id for s in table.snapshots()] == snapshots  # found by their markers, not made again
    for pre, snapshot_id in zip(writes, snapshots, strict=True):
        row = pipeline.store.get(sink_id, pre.epoch)
        assert row is not None and row.committed == {f"{pipeline.namespace}.orders": str(snapshot_id)}


def test_epochs_that_cannot_join_a_batch_commit_alone_in_their_place(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    """Epoch 3 adds a column (committed alone), 6's checkpoint failed (aborted), 7's is still pending."""
    table = pipeline.create_table("orders")
    committer = pipeline.iceberg_committer(branch=branch, allow_schema_evolution=True)
    coordinator = pipeline.coordinator(sink_id, committer)
    column = WrittenColumn(name="country", type="string", field_id=table.metadata.last_column_id + 1)
    writes = []
    for epoch in range(1, 8):
        pre = pipeline.write_iceberg(sink_id, epoch, ["orders"], rows=2)
        if epoch == 3:
            pre = pre.model_copy(update={"tables": [pre.tables[0].model_copy(update={"added_columns": [column]})]})
        coordinator.persist(pre)
        if epoch != 7:
            status = CheckpointStatus.FAILED if epoch == 6 else CheckpointStatus.COMPLETED
            pipeline.checkpoint(sink_id, epoch, status)
        writes.append(pre)

    report = coordinator.recover(sink_id)

    assert report.ok, report.failed
    assert (report.committed, report.aborted, report.waiting) == ([1, 2, 3, 4, 5], [6], [7])
    committed = writes[:5]
    assert history(pipeline, "orders", sink_id, branch) == [(pre.epoch, pre.write_id) for pre in committed]
    schema = pipeline.catalog.load_table(table.name()).schema()
    assert schema.find_field("country").field_id == column.field_id
    rows = pipeline.rows("orders", branch=branch)
    assert sorted((r["id"], r["epoch"], r["write_id"]) for r in rows) == expected_rows(
        committed, f"{pipeline.namespace}.orders"
    )


def test_a_batch_that_fails_is_committed_one_epoch_at_a_time(pipeline: Pipeline, sink_id: str) -> None:
    """Epoch 3's data file is gone: the batch's file check refuses it, and the single commits then
    commit every other epoch and record epoch 3's own refusal on its row."""
    pipeline.create_table("orders")
    writes = _persisted(pipeline, sink_id, range(1, 6), ["orders"])
    Path(writes[2].tables[0].data_files[0].path.removeprefix("file://")).unlink()

    report = pipeline.coordinator(sink_id, pipeline.iceberg_committer()).recover(sink_id)

    assert report.committed == [1, 2, 4, 5]
    assert list(report.failed) == [3] and "MissingDataFiles" in report.failed[3]
    row = pipeline.store.get(sink_id, 3)
    assert row is not None and row.status is EpochStatus.PENDING and "MissingDataFiles" in (row.error or "")
    kept = [pre for pre in writes if pre.epoch != 3]
    assert history(pipeline, "orders", sink_id, "main") == [(pre.epoch, pre.write_id) for pre in kept]


def test_a_row_replaced_while_its_batch_is_prepared_ends_the_batch_before_it(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """A new write for epoch 3 replaces its Pending row after recovery listed it: the decision's CAS
    for epoch 3 fails, so epochs 1 and 2 commit together, epoch 3 commits alone with the new write
    (its own commit reads the row again), and 4 and 5 follow, in order."""
    pipeline.create_table("orders")
    writes = _persisted(pipeline, sink_id, range(1, 6), ["orders"])
    newer = pipeline.write_iceberg(sink_id, 3, ["orders"], rows=3)
    other = pipeline.coordinator(sink_id, pipeline.iceberg_committer())

    def replace() -> None:
        other.persist(newer)

    faults.then("iceberg.loaded", replace)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())

    report = coordinator.recover(sink_id)

    assert report.ok, report.failed
    assert sorted(report.committed) == [1, 2, 3, 4, 5]
    expected = [writes[0], writes[1], newer, writes[3], writes[4]]
    assert history(pipeline, "orders", sink_id, "main") == [(pre.epoch, pre.write_id) for pre in expected]
    assert as_tuples(pipeline.rows("orders")) == expected_rows(expected, f"{pipeline.namespace}.orders")
