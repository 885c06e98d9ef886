"""A crash after every step of commit and abort, then ``recover``: each epoch ends committed exactly
once, or aborted with its files gone.

A crash is ``SimulatedCrash`` raised at a named fault point: a ``BaseException``, so nothing on the
way up tidies anything, as with a killed process. Recovery then runs on a fresh coordinator with no
faults, exactly as the recovery DAG would.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline, as_tuples, expected_rows, write_location_exists

COMMIT_POINTS = [
    "commit.decided",
    "iceberg.loaded",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
    "commit.marked",
]
ABORT_POINTS = ["abort.marked", "cleanup.deleted", "abort.cleaned"]


def _recovered(pipeline: Pipeline, sink_id: str, committer: object, branch: str = "main") -> None:
    """Recovery as the recovery DAG runs it: a new coordinator, no faults, the same sink config."""
    fresh = Pipeline(
        meta_url=pipeline.meta_url,
        catalog_url=pipeline.catalog_url,
        warehouse=pipeline.warehouse,
        catalog_name=pipeline.catalog_name,
        namespace=pipeline.namespace,
    )
    try:
        report = fresh.coordinator(sink_id, committer_like(fresh, committer, branch)).recover(sink_id)
        assert report.ok, report.failed
    finally:
        fresh.dispose()


def committer_like(pipeline: Pipeline, committer: object, branch: str = "main") -> object:
    from airflow_provider_exactly_once.sinks.files import FileSinkCommitter

    if isinstance(committer, FileSinkCommitter):
        return pipeline.file_committer(Path(committer.root))  # type: ignore[attr-defined]
    return pipeline.iceberg_committer(branch=branch)


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_crash_during_commit_then_recover_commits_exactly_once(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str, branch: str
) -> None:
    names = ["a", "b"]  # fan-out, so a crash can fall between the two tables' commits
    for name in names:
        pipeline.create_table(name)
    committer = pipeline.iceberg_committer(branch=branch)
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 12, names, rows=4)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 12, CheckpointStatus.COMPLETED)

    faults.crash_at(point)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 12)
    _recovered(pipeline, sink_id, committer, branch)

    assert pipeline.store.get(sink_id, 12).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    for name in names:
        assert pipeline.marker_snapshots(name, sink_id) == {12: [pre.write_id]}
        assert as_tuples(pipeline.rows(name, branch=branch)) == expected_rows([pre], f"{pipeline.namespace}.{name}")


def test_crash_between_the_two_tables_of_a_fan_out(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    """Committed table by table (Glue, or a catalog switched to it): a crash between two tables; the
    recovery that follows commits the last in one transaction (the SQL catalog's, design.md D18)."""
    names = ["a", "b", "c"]
    for name in names:
        pipeline.create_table(name)
    committer = pipeline.table_by_table_committer(branch=branch)
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 13, names, rows=3)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 13, CheckpointStatus.COMPLETED)
    faults.crash_at("iceberg.after_catalog_update", occurrence=2)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 13)
    visible_before = [n for n in names if pipeline.marker_snapshots(n, sink_id)]
    assert len(visible_before) == 2
    _recovered(pipeline, sink_id, committer, branch)
    for name in names:
        assert pipeline.marker_snapshots(name, sink_id) == {13: [pre.write_id]}
        assert as_tuples(pipeline.rows(name, branch=branch)) == expected_rows([pre], f"{pipeline.namespace}.{name}")


@pytest.mark.parametrize("point", ABORT_POINTS)
def test_crash_during_abort_then_recover_leaves_it_aborted_with_files_gone(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str, branch: str
) -> None:
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer(branch=branch)
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 14, ["orders"], rows=4)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 14, CheckpointStatus.FAILED)

    faults.crash_at(point)
    with pytest.raises(SimulatedCrash):
        coordinator.abort(sink_id, 14, reason="checkpoint failed")
    _recovered(pipeline, sink_id, committer, branch)

    assert pipeline.store.get(sink_id, 14).status is EpochStatus.ABORTED  # type: ignore[union-attr]
    assert not write_location_exists(pre)
    assert pipeline.store.cleanups(sink_id) == []
    assert pipeline.rows("orders", branch=branch) == []


def test_crash_after_persist_then_recover_waits_then_commits(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer(branch=branch)
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 15, ["orders"])
    faults.crash_at("persist.inserted")
    with pytest.raises(SimulatedCrash):
        coordinator.persist(pre)
    report = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch)).recover(sink_id)
    assert report.waiting == [15]  # checkpoint still PENDING: nothing visible, nothing lost
    assert pipeline.rows("orders", branch=branch) == []
    pipeline.checkpoint(sink_id, 15, CheckpointStatus.COMPLETED)
    _recovered(pipeline, sink_id, committer, branch)
    assert pipeline.marker_snapshots("orders", sink_id) == {15: [pre.write_id]}
    assert as_tuples(pipeline.rows("orders", branch=branch)) == expected_rows([pre], f"{pipeline.namespace}.orders")


@pytest.mark.parametrize("point", ["commit.decided", "files.before_move", "files.after_move", "commit.visible"])
def test_file_sink_crash_during_commit_then_recover(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str, tmp_path: Path
) -> None:
    root = tmp_path / "sink"
    root.mkdir()
    committer = pipeline.file_committer(root)
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_files(sink_id, 16, root, rows=6, files=3)
    expected = expected_rows([pre], str(root))
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 16, CheckpointStatus.COMPLETED)
    faults.crash_at(point, occurrence=2 if point.startswith("files.") else 1)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 16)
    _recovered(pipeline, sink_id, committer)
    assert pipeline.store.get(sink_id, 16).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    visible = ds.dataset(str(root), format="parquet").to_table().to_pylist()
    assert as_tuples(visible) == expected
