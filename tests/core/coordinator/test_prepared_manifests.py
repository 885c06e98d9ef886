"""Manifests written at persist (``sinks/iceberg/prepared_manifests.py``): the commit lists the one
the row records, readers see what a commit writing its own manifest shows them, and a manifest that
is stale or gone is never trusted, nor left behind."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, MissingDataFiles
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import BLOCK_ENTRIES, MANIFEST_FOLDER, in_blocks
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import ROW_SCHEMA, Pipeline, expected_rows, local_path

EPOCH = 7
BY_EPOCH = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="epoch"))


def _manifests_on_disk(pre: PreCommit) -> set[str]:
    """The manifests below each of the write's locations, as ``file://`` paths."""
    found = set()
    for write in pre.tables:
        folder = Path(local_path(write.location)) / MANIFEST_FOLDER
        found |= {f"file://{path}" for path in folder.rglob("*") if path.is_file()}
    return found


def _recorded(pipeline: Pipeline, sink_id: str, epoch: int = EPOCH) -> PreCommit:
    row = pipeline.store.get(sink_id, epoch)
    assert row is not None
    return row.pre_commit


def _listed(table: Table, snapshot_id: int) -> set[str]:
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    return {m.manifest_path for m in snapshot.manifests(table.io) if m.added_snapshot_id == snapshot_id}


def _commit(pipeline: Pipeline, coordinator: Any, sink_id: str, epoch: int = EPOCH) -> int:
    pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
    result = coordinator.commit(sink_id, epoch)
    assert result.record.status is EpochStatus.COMMITTED
    return int(next(iter(result.record.committed.values())))


@pytest.mark.parametrize("spec", [None, BY_EPOCH], ids=["unpartitioned", "identity"])
def test_the_commit_lists_the_manifest_persist_wrote_and_readers_see_what_they_saw_before(
    pipeline: Pipeline, sink_id: str, spec: PartitionSpec | None
) -> None:
    pipeline.create_table("prepared", spec)
    pipeline.create_table("plain", spec)
    committer = pipeline.iceberg_committer()
    # The same rows into both tables; the plain one's commit writes its manifest itself, as before.
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["prepared", "plain"], rows=12, files=3)
    staged = committer.stage(committer.prepare(pre))
    prepared = staged.tables[0].prepared
    assert prepared is not None and len(prepared.manifests) == 1
    mixed = staged.model_copy(
        update={"tables": [staged.tables[0], staged.tables[1].model_copy(update={"prepared": None})]}
    )

    committed = committer.commit(CommitPlan(mixed), pipeline.store.now())

    table = pipeline.catalog.load_table(pre.tables[0].table)
    plain = pipeline.catalog.load_table(pre.tables[1].table)
    snapshot_id, plain_id = int(committed[table.name()[0] + ".prepared"]), int(committed[plain.name()[0] + ".plain"])
    assert _listed(table, snapshot_id) == {prepared.manifests[0].path}
    (own,) = _listed(plain, plain_id)
    assert "/metadata/" in own
    summary = table.snapshot_by_id(snapshot_id).summary  # type: ignore[union-attr]
    assert summary == plain.snapshot_by_id(plain_id).summary  # type: ignore[union-attr]

    def view(t: Table, name: str, drop: tuple[str, ...]) -> str:
        rows = getattr(t.inspect, name)().drop_columns(list(drop)).to_pylist()
        text = repr(sorted(rows, key=repr))
        return text.replace("/prepared/", "/T/").replace("/plain/", "/T/")

    for name, drop in {
        "entries": ("snapshot_id",),
        "files": (),
        "partitions": ("last_updated_snapshot_id", "last_updated_at"),
        "manifests": ("path", "length", "added_snapshot_id"),
    }.items():
        assert view(table, name, drop) == view(plain, name, drop), name
    for entry in table.inspect.entries().to_pylist():
        assert entry["snapshot_id"] == snapshot_id and entry["sequence_number"] == 1
    assert sorted(read_rows(table, "id, epoch, write_id")) == sorted(read_rows(plain, "id, epoch, write_id"))
    assert len(read_rows(table)) == 12


def test_a_retried_persist_keeps_only_the_manifest_the_row_records(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"])

    faults.crash_at("persist.staged")  # the manifest is written, the row is not
    with pytest.raises(SimulatedCrash):
        coordinator.persist(pre)
    assert len(_manifests_on_disk(pre)) == 1 and pipeline.store.get(sink_id, EPOCH) is None
    coordinator.persist(pre)
    coordinator.persist(pre)  # a retry of the persist task once the row exists

    recorded = _recorded(pipeline, sink_id).tables[0].prepared
    assert recorded is not None and _manifests_on_disk(pre) == {recorded.manifests[0].path}
    snapshot_id = _commit(pipeline, coordinator, sink_id)
    assert _listed(pipeline.catalog.load_table(pre.tables[0].table), snapshot_id) == {recorded.manifests[0].path}


def _refused_then_recovered(pipeline: Pipeline, coordinator: Any, sink_id: str, manifest: str) -> int:
    """The commit task refuses the epoch before its decision, naming ``manifest`` (the check of a
    fresh epoch looks at the write's own manifests only); recovery, which lists every data file,
    then commits it with a manifest of its own. The snapshot's id."""
    pipeline.checkpoint(sink_id, EPOCH, CheckpointStatus.COMPLETED)
    with pytest.raises(MissingDataFiles) as refused:
        coordinator.commit(sink_id, EPOCH)
    assert refused.value.paths == [manifest]
    row = pipeline.store.get(sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
    report = coordinator.recover(sink_id)
    assert report.committed == [EPOCH], report.failed
    return _commit(pipeline, coordinator, sink_id)  # already committed: its snapshot


def test_a_manifest_gone_before_the_commit_is_refused_then_written_again_by_recovery(
    pipeline: Pipeline, sink_id: str
) -> None:
    """Issue 59: a manifest persist wrote is unreferenced as the write's data files are, so a
    removal that took it may have taken them: the commit task refuses the epoch before its
    decision. Recovery lists every data file, finds them all, and commits without trusting it."""
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=6)
    coordinator.persist(pre)
    (gone,) = _manifests_on_disk(pre)
    os.remove(local_path(gone))  # a foreign remove_orphan_files, say

    snapshot_id = _refused_then_recovered(pipeline, coordinator, sink_id, gone)

    table = pipeline.catalog.load_table(pre.tables[0].table)
    listed = _listed(table, snapshot_id)
    assert len(listed) == 1 and gone not in listed and "/metadata/" in next(iter(listed))
    assert len(read_rows(table)) == 6


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_manifest_truncated_or_replaced_before_the_commit_is_written_again_not_trusted(
    pipeline: Pipeline, sink_id: str, damage: str
) -> None:
    """Scenario (issue 54): a prepared manifest is listed only while it has the length persist
    recorded. Checked for existence alone, one cut short would be listed and break every read of
    the table, and another manifest written at its path (here another write's, longer) would show
    that write's rows in this epoch. The commit task's check refuses it before the decision (issue
    59); recovery writes its own manifest; DuckDB reads the epoch's rows."""
    pipeline.create_table("t")
    committer = pipeline.iceberg_committer()
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=6)
    coordinator.persist(pre)
    (prepared,) = _manifests_on_disk(pre)
    path = Path(local_path(prepared))
    original = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(original[: len(original) // 2])
    else:
        other = committer.stage(committer.prepare(pipeline.write_iceberg(sink_id, EPOCH + 1, ["t"], rows=4, files=2)))
        assert other.tables[0].prepared is not None
        path.write_bytes(Path(local_path(other.tables[0].prepared.manifests[0].path)).read_bytes())
    assert path.stat().st_size != len(original)

    snapshot_id = _refused_then_recovered(pipeline, coordinator, sink_id, prepared)

    table = pipeline.catalog.load_table(pre.tables[0].table)
    listed = _listed(table, snapshot_id)  # first: DuckDB's reader aborts the process on a truncated manifest
    assert len(listed) == 1 and prepared not in listed and "/metadata/" in next(iter(listed))
    assert read_rows(table, "id, epoch, write_id") == expected_rows([pre], pre.tables[0].table)


def test_a_manifest_prepared_before_a_schema_change_is_replaced_and_deleted(pipeline: Pipeline, sink_id: str) -> None:
    table = pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=6)
    coordinator.persist(pre)
    (prepared,) = _manifests_on_disk(pre)
    with table.update_schema() as update:  # another writer evolves the table before the commit
        update.add_column("note", StringType())

    snapshot_id = _commit(pipeline, coordinator, sink_id)

    assert prepared not in _listed(table.refresh(), snapshot_id)
    assert _manifests_on_disk(pre) == set()  # referenced by no snapshot: deleted after the commit
    assert len(read_rows(table)) == 6


def test_a_format_1_table_commits_as_before(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.catalog.create_namespace_if_not_exists(pipeline.namespace)
    table = pipeline.catalog.create_table(
        f"{pipeline.namespace}.v1", schema=ROW_SCHEMA, properties={"format-version": "1"}
    )
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["v1"])
    coordinator.persist(pre)

    assert _recorded(pipeline, sink_id).tables[0].prepared is None and _manifests_on_disk(pre) == set()
    _commit(pipeline, coordinator, sink_id)
    assert len(read_rows(table.refresh())) == 5


def test_recovery_commits_a_backlog_with_the_prepared_manifests(pipeline: Pipeline, sink_id: str) -> None:
    table = pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    writes = [pipeline.write_iceberg(sink_id, epoch, ["t"]) for epoch in (1, 2, 3)]
    for pre in writes:
        coordinator.persist(pre)
        pipeline.checkpoint(sink_id, pre.epoch, CheckpointStatus.COMPLETED)

    report = coordinator.recover(sink_id)

    assert sorted(report.committed) == [1, 2, 3]
    table = table.refresh()
    for pre in writes:
        row = pipeline.store.get(sink_id, pre.epoch)
        assert row is not None and row.pre_commit.tables[0].prepared is not None
        snapshot_id = int(row.committed[pre.tables[0].table])  # type: ignore[index]
        assert _listed(table, snapshot_id) == {m.path for m in row.pre_commit.tables[0].prepared.manifests}
    assert len(read_rows(table)) == 15


def test_an_aborted_write_loses_its_manifest_with_its_files(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=3, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, EPOCH, CheckpointStatus.FAILED)

    result = coordinator.abort(sink_id, EPOCH, reason="checkpoint failed")

    assert result.files_deleted == 3  # two data files and the manifest
    assert not Path(local_path(pre.tables[0].location)).exists()


def test_a_manifest_that_cannot_be_written_leaves_the_persist_to_succeed_without_one(
    pipeline: Pipeline, sink_id: str
) -> None:
    table = pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=4)
    (Path(local_path(pre.tables[0].location)) / MANIFEST_FOLDER).write_text("in the way")  # a file, not a folder

    coordinator.persist(pre)

    assert _recorded(pipeline, sink_id).tables[0].prepared is None  # only an optimisation
    _commit(pipeline, coordinator, sink_id)
    assert len(read_rows(table.refresh())) == 4


@pytest.mark.parametrize("evolved", [False, True], ids=["unchanged", "schema-changed"])
def test_a_commit_task_of_its_own_parses_the_descriptors_only_when_the_table_changed(
    pipeline: Pipeline, sink_id: str, evolved: bool
) -> None:
    """A commit task reads the row by its write's head (``store.rows``): with the manifests
    persist wrote still standing, the files are listed by their paths and committed without a
    descriptor parsed; once the schema changed, the commit checks every file and writes its own."""
    table = pipeline.create_table("t")
    pipeline.coordinator(sink_id, pipeline.iceberg_committer()).persist(
        pre := pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=9, files=3)
    )
    if evolved:
        with table.update_schema() as update:
            update.add_column("note", StringType())
    task_store = SqlSinkStateStore(pipeline.meta_url)  # the commit task's process: it parsed nothing
    try:
        task = TwoPhaseCommitCoordinator(task_store, {sink_id: pipeline.iceberg_committer()}, pipeline.checkpoints)
        pipeline.checkpoint(sink_id, EPOCH, CheckpointStatus.COMPLETED)
        result = task.commit(sink_id, EPOCH)
        assert result.record.status is EpochStatus.COMMITTED
        files = result.record.pre_commit.tables[0].data_files
        assert files.read is evolved
        assert files == pre.tables[0].data_files
    finally:
        task_store.dispose()
    assert len(read_rows(table.refresh())) == 9


def test_a_prepared_snapshot_arriving_with_the_write_is_dropped_not_trusted(pipeline: Pipeline, sink_id: str) -> None:
    """Only persist prepares a snapshot, after every file passed its checks; one a writer hands over
    (copied from another write's row, say) must not spare a file those checks."""
    pipeline.create_table("t")
    committer = pipeline.iceberg_committer()
    staged = committer.stage(committer.prepare(pipeline.write_iceberg(sink_id, EPOCH, ["t"], rows=6)))
    (write,) = staged.tables
    mislabelled = DataFiles([f.model_copy(update={"format": "orc"}) for f in write.data_files])
    forged = staged.model_copy(update={"tables": [write.model_copy(update={"data_files": mislabelled})]})

    with pytest.raises(InvalidPreCommit, match="declared 'orc'"):
        pipeline.coordinator(sink_id, committer).persist(forged)
    assert pipeline.store.get(sink_id, EPOCH) is None


def _plain(value: Any) -> Any:
    """A manifest entry as nested lists and dicts (pyiceberg's repr shows its lazy dicts by address)."""
    if isinstance(value, Record):
        return [_plain(value[i]) for i in range(len(value))]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_a_manifest_written_in_blocks_holds_what_pyicebergs_writer_writes(tmp_path: Path) -> None:
    """``in_blocks`` (many entries to an Avro block, a faster encoder) against pyiceberg's own writer
    (one entry a block): the same entries read back, the same manifest list entry, in fewer bytes."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "epoch", LongType(), required=False),
        NestedField(3, "payload", StringType(), required=False),
        NestedField(4, "score", DoubleType(), required=False),
    )
    spec = PartitionSpec(  # a long, a string and a double (written by pyiceberg's own writer) partition value
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="epoch"),
        PartitionField(source_id=3, field_id=1001, transform=IdentityTransform(), name="payload"),
        PartitionField(source_id=4, field_id=1002, transform=IdentityTransform(), name="score"),
    )
    entries = []
    for n in range(BLOCK_ENTRIES * 2 + 345):
        values = (n - 1200) * 7919**2, -(2**63) + n, 2**62 + n  # negative, the smallest long, large
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=f"file:///data/é-{n}.parquet",
            file_format=FileFormat.PARQUET,
            partition=Record(values[n % 3] if n % 5 else None, f"ü{n}" if n % 7 else None, n / 3 if n % 2 else None),
            record_count=n + 1,
            file_size_in_bytes=2**33 + n,
            column_sizes={1: n, 2: 127, 3: 128},
            value_counts={1: n + 1, 2: n + 1},
            null_value_counts={3: n % 2},
            nan_value_counts={},
            lower_bounds={1: n.to_bytes(8, "little"), 3: b"a" * (n % 40)},
            upper_bounds={1: (n + 9).to_bytes(8, "little")},
            split_offsets=[4, 2**40 + n],
            sort_order_id=None if n % 2 else 0,
        )
        data_file.spec_id = spec.spec_id
        status = (ManifestEntryStatus.ADDED, ManifestEntryStatus.EXISTING, ManifestEntryStatus.DELETED)[n % 3]
        sequence = None if status is ManifestEntryStatus.ADDED else n
        entries.append(
            ManifestEntry.from_args(
                status=status,
                snapshot_id=None if sequence is None else (2**62 - n if n % 4 else n),
                sequence_number=sequence,
                file_sequence_number=sequence,
                data_file=data_file,
            )
        )
    io = PyArrowFileIO()
    manifests = []
    for name, wrap in (("pyiceberg", lambda w: w), ("blocks", in_blocks)):
        writer = write_manifest(2, spec, schema, io.new_output(f"{tmp_path}/{name}.avro"), 12345, "deflate")
        with wrap(writer) as writer:
            for entry in entries:
                writer.add_entry(entry)
        manifests.append(writer.to_manifest_file())
    theirs, ours = manifests
    assert ours.manifest_length < theirs.manifest_length / 2
    assert {**vars(ours), "manifest_path": None, "manifest_length": None} == {
        **vars(theirs),
        "manifest_path": None,
        "manifest_length": None,
    }
    read = [[_plain(e) for e in m.fetch_manifest_entry(io, discard_deleted=False)] for m in manifests]
    assert len(read[1]) == len(entries) and read[0] == read[1]
