"""Where recovery cuts a backlog into batches (``core/coordinator.py``, ``core/coordinator.py``), judged by the
table's catalog commits (one metadata file each) and by the recovery report: a row that moved ends
the batch before it, an epoch that commits on its own lets the run before it commit first, every
epoch is reported once and only as what its row became, and a revision whose checkpoint failed is
given up.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyiceberg.serializers import FromInputFile

from airflow_provider_exactly_once.checkpoints import MarkerFileCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_batch_recovery import _persisted, history
from tests.core.coordinator.test_reprocessing import G1, G2, generation, replacing
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import Pipeline, expected_rows, write_location_exists

COMPLETED = CheckpointStatus.COMPLETED


def catalog_commits(pipeline: Pipeline, name: str, sink_id: str) -> list[list[int]]:
    """Per catalog commit of the table, oldest first: the epochs of the sink whose snapshots it added."""
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    locations = [entry.metadata_file for entry in table.metadata.metadata_log] + [table.metadata_location]
    seen: set[int] = set()
    commits = []
    for location in locations:
        metadata = FromInputFile.table_metadata(table.io.new_input(location))
        epochs = []
        for snapshot in metadata.snapshots:
            if snapshot.snapshot_id in seen:
                continue
            seen.add(snapshot.snapshot_id)
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if props.get("exactly-once.sink-id") == sink_id:
                epochs.append(int(props["exactly-once.epoch"]))
        if epochs:
            commits.append(epochs)
    return commits


def _seen_by_duckdb(pipeline: Pipeline, name: str) -> list[tuple[int, int, str]]:
    return sorted(read_rows(pipeline.catalog.load_table(f"{pipeline.namespace}.{name}"), "id, epoch, write_id"))


def test_a_row_replaced_before_the_decision_ends_the_batch_and_its_old_write_never_shows(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """While recovery prepares epochs 1 to 5, a newer write replaces epoch 3's row and its persist
    dies before it deletes the replaced write's files: the files are still there, so only the
    decision's compare-and-swap keeps that write out of the batch."""
    pipeline.create_table("orders")
    writes = _persisted(pipeline, sink_id, range(1, 6), ["orders"])
    newer = pipeline.write_iceberg(sink_id, 3, ["orders"], rows=3)
    dying = FaultSwitch()
    dying.crash_at("persist.replaced")
    other = TwoPhaseCommitCoordinator(
        pipeline.store, {sink_id: pipeline.iceberg_committer()}, pipeline.checkpoints, fault=dying
    )

    def replace_and_die() -> None:
        with contextlib.suppress(SimulatedCrash):
            other.persist(newer)
        assert write_location_exists(writes[2])  # the replaced write's files are still there

    faults.then("iceberg.loaded", replace_and_die)

    report = pipeline.coordinator(sink_id, pipeline.iceberg_committer()).recover(sink_id)

    assert dying.seen["persist.replaced"] == 1
    assert report.ok, report.failed
    assert report.committed == [1, 2, 3, 4, 5]
    assert catalog_commits(pipeline, "orders", sink_id) == [[1, 2], [3], [4, 5]]
    expected = [writes[0], writes[1], newer, writes[3], writes[4]]
    assert history(pipeline, "orders", sink_id, "main") == [(pre.epoch, pre.write_id) for pre in expected]
    assert _seen_by_duckdb(pipeline, "orders") == expected_rows(expected, f"{pipeline.namespace}.orders")
    assert writes[2].write_id not in {w for ws in pipeline.marker_snapshots("orders", sink_id).values() for w in ws}


def test_an_epoch_whose_row_moved_after_the_catalog_commit_is_reported_as_its_row_says(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """Between the batch's catalog commit and its Committed mark, epoch 2's decided write is given up
    in the store (an operator's ``--files-lost`` abort whose check of the table ran just before the
    batch's commit landed): the mark takes epochs 1 and 3 only, and the report says just that."""
    pipeline.create_table("orders")
    writes = _persisted(pipeline, sink_id, range(1, 4), ["orders"])

    def give_up_epoch_2() -> None:
        pipeline.store.mark_aborted(sink_id, 2, write_id=writes[1].write_id, reason="files lost", decided=True)

    faults.then("batch.visible", give_up_epoch_2)

    report = pipeline.coordinator(sink_id, pipeline.iceberg_committer()).recover(sink_id)

    assert report.committed == [1, 3]
    statuses = {epoch: row.status for epoch in (1, 2, 3) if (row := pipeline.store.get(sink_id, epoch)) is not None}
    assert statuses == {1: EpochStatus.COMMITTED, 2: EpochStatus.ABORTED, 3: EpochStatus.COMMITTED}


def test_a_revision_between_appends_commits_alone_in_its_place_and_each_epoch_is_reported_once(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    """Pending rows 1, 2, 3 (a revision of a committed epoch), 4, 5: batch [1, 2], then 3 alone, then
    batch [4, 5]."""
    pipeline.create_table("orders")
    coordinator = replacing(pipeline, sink_id, branch=branch)
    first_3 = generation(pipeline.write_iceberg(sink_id, 3, ["orders"], rows=2), G1)
    coordinator.persist(first_3)
    pipeline.checkpoint(sink_id, 3, COMPLETED)
    coordinator.commit(sink_id, 3)
    writes: dict[int, PreCommit] = {}
    for epoch in (1, 2, 3, 4, 5):
        writes[epoch] = generation(pipeline.write_iceberg(sink_id, epoch, ["orders"], rows=2), G2 if epoch == 3 else G1)
        outcome = coordinator.persist(writes[epoch]).outcome
        assert outcome is (PersistOutcome.REVISED if epoch == 3 else PersistOutcome.PERSISTED)
        if epoch != 3:
            pipeline.checkpoint(sink_id, epoch, COMPLETED)

    report = replacing(pipeline, sink_id, branch=branch).recover(sink_id)

    assert report.ok, report.failed
    assert report.committed == [1, 2, 3, 4, 5]
    assert catalog_commits(pipeline, "orders", sink_id) == [[3], [1, 2], [3], [4, 5]]
    assert history(pipeline, "orders", sink_id, branch) == [(3, first_3.write_id)] + [
        (epoch, writes[epoch].write_id) for epoch in (1, 2, 3, 4, 5)
    ]
    rows = pipeline.rows("orders", branch=branch)
    assert sorted((r["id"], r["epoch"], r["write_id"]) for r in rows) == expected_rows(
        writes.values(), f"{pipeline.namespace}.orders"
    )


def test_recovery_gives_up_a_revision_whose_checkpoint_failed(pipeline: Pipeline, sink_id: str, tmp_path: Path) -> None:
    """The reprocessed run's upstream (a data-quality gate writing ``_FAILED``, which wins over the
    earlier ``_SUCCESS``) rejects the new data: the epoch stays committed with the write it had."""
    marks = tmp_path / "checkpoints"
    source = MarkerFileCheckpointSource(f"{marks}/{{sink_id}}/{{epoch}}")
    epoch_marks = marks / sink_id / "1"
    epoch_marks.mkdir(parents=True)
    (epoch_marks / "_SUCCESS").touch()
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer()
    coordinator = TwoPhaseCommitCoordinator(
        pipeline.store, {sink_id: committer}, source, on_reprocess={sink_id: "replace"}
    )
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=2), G1)
    coordinator.persist(first)
    coordinator.commit(sink_id, 1)
    revision = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=3), G2)
    assert coordinator.persist(revision).outcome is PersistOutcome.REVISED
    (epoch_marks / "_FAILED").touch()

    report = coordinator.recover(sink_id)

    assert report.ok, report.failed
    assert (report.aborted, report.committed) == ([1], [])
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == first.write_id
    assert row.replaces is None
    assert _seen_by_duckdb(pipeline, "orders") == expected_rows([first], f"{pipeline.namespace}.orders")
    assert not write_location_exists(revision)
