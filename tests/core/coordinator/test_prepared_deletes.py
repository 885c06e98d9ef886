"""A revision's manifests written at persist, deletions included (``sinks/iceberg/overwrites.py``):
its commit lists them, readers see exactly what the commit writing its own shows them, and where the
table's manifests changed in between the commit filters them itself and the prepared ones go."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import ManifestFile, write_manifest, write_manifest_list
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.transforms import IdentityTransform

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.decisions import revision_plan
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit, PreparedSnapshot
from airflow_provider_exactly_once.sinks.iceberg import overwrites
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import MANIFEST_FOLDER, listed
from tests.core.coordinator.test_reprocessing import G1, G2, commit, generation, replacing
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import Pipeline, local_path

BY_EPOCH = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="epoch"))
TABLES = ["prepared", "plain"]


def rewrite_manifests(table: Table, branch: str, groups: int = 2) -> None:
    """What a maintenance job's manifest rewrite does (pyiceberg 0.12 has none): a ``replace``
    snapshot listing the branch head's live files, existing, dealt round-robin into ``groups``
    manifests per spec, so each holds files of several writes and a write's files span several."""
    metadata = table.metadata
    head = metadata.snapshot_by_name(branch)
    assert head is not None
    snapshot_id, sequence_number = metadata.new_snapshot_id(), metadata.next_sequence_number()
    by_spec: dict[int, list[Any]] = {}
    for manifest in head.manifests(table.io):
        by_spec.setdefault(manifest.partition_spec_id, []).extend(manifest.fetch_manifest_entry(table.io))
    manifests: list[ManifestFile] = []
    for spec_id, entries in by_spec.items():
        for group in range(min(groups, len(entries))):
            path = f"{table.location()}/metadata/rewritten-{uuid.uuid4()}.avro"
            output = table.io.new_output(path)
            with write_manifest(2, metadata.specs()[spec_id], metadata.schema(), output, snapshot_id, "deflate") as w:
                for entry in entries[group::groups]:
                    w.existing(entry)
            manifests.append(w.to_manifest_file())
    manifest_list = f"{table.location()}/metadata/snap-rewritten-{uuid.uuid4()}.avro"
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(manifest_list),
        snapshot_id=snapshot_id,
        parent_snapshot_id=head.snapshot_id,
        sequence_number=sequence_number,
        avro_compression="deflate",
    ) as writer:
        writer.add_manifests(manifests)
    totals = {k: v for k, v in (head.summary.additional_properties if head.summary else {}).items() if "total" in k}
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=head.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=Summary(Operation.REPLACE, **totals),
        schema_id=metadata.current_schema_id,
    )
    tx = table.transaction()
    tx._stage(
        (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                ref_name=branch,
                type=SnapshotRefType.BRANCH,
                snapshot_id=snapshot_id,
                parent_snapshot_id=head.snapshot_id,
            ),
        ),
        (AssertRefSnapshotId(ref=branch, snapshot_id=head.snapshot_id),),
    )
    tx.commit_transaction()


def foreign_append(pipeline: Pipeline, pre: PreCommit, branch: str) -> None:
    """Another writer's fast append of ``pre``'s files, outside the sink (no marker)."""
    for write in pre.tables:
        table = pipeline.catalog.load_table(write.table)
        spec = table.spec()
        files = build_data_files(
            write.data_files, schema=table.schema(), spec=spec, spec_id=spec.spec_id, table=write.table
        )
        with table.transaction() as tx, tx.update_snapshot(branch=branch).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)


def _revision_persisted(
    pipeline: Pipeline, sink_id: str, *, files: int
) -> tuple[TwoPhaseCommitCoordinator, PreCommit, PreCommit]:
    """Epoch 1 of table ``t`` committed (6 rows in ``files`` files), then a revision (5 rows) persisted."""
    pipeline.create_table("t")
    coordinator = replacing(pipeline, sink_id)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=files), G1)
    commit(pipeline, coordinator, first)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5), G2)
    coordinator.persist(second)
    return coordinator, first, second


def _load(pipeline: Pipeline, name: str) -> Table:
    return pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")


def _prepared(pipeline: Pipeline, sink_id: str) -> PreparedSnapshot:
    row = pipeline.store.get(sink_id, 1)
    assert row is not None
    prepared = row.pre_commit.tables[0].prepared
    assert prepared is not None and prepared.snapshot_id is not None
    return prepared


def _exists(path: str) -> bool:
    return Path(local_path(path)).exists()


def _every_snapshot_readable(table: Table) -> None:
    """Every manifest and data file of every retained snapshot opens (nothing a snapshot lists is gone)."""
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                assert entry.status.value == 2 or _exists(entry.data_file.file_path), entry.data_file.file_path
        assert len(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()) == len(
            read_rows(table, snapshot_id=snapshot.snapshot_id)
        )


class Views:
    """A table's history as readers see it, with what must differ between two tables (snapshot ids,
    manifest paths, the table's folder, commit times) replaced by what it stands for."""

    def __init__(self, table: Table, name: str) -> None:
        self.table, self.name = table, name
        self.ordinal = {s.snapshot_id: i for i, s in enumerate(table.snapshots())}

    def _text(self, rows: list[dict[str, Any]]) -> str:
        def clean(value: Any, key: str = "") -> Any:
            if isinstance(value, dict):
                return {k: clean(v, k) for k, v in value.items() if k not in ("path", "length", "last_updated_at")}
            if isinstance(value, list):
                return [clean(v) for v in value]
            if key.endswith("snapshot_id") and value is not None:
                return self.ordinal[value]
            return value.replace(f"/{self.name}/", "/T/") if isinstance(value, str) else value

        return repr(sorted((clean(row) for row in rows), key=repr))

    def of(self, snapshot: Snapshot) -> dict[str, Any]:
        sid, inspect = snapshot.snapshot_id, self.table.inspect
        listed = [
            (
                m.content,
                m.partition_spec_id,
                m.sequence_number,
                m.min_sequence_number,
                self.ordinal[m.added_snapshot_id],
                (m.added_files_count, m.existing_files_count, m.deleted_files_count),
                (m.added_rows_count, m.existing_rows_count, m.deleted_rows_count),
                m.partitions,
            )
            for m in snapshot.manifests(self.table.io)
        ]
        return {
            "summary": snapshot.summary,
            "manifest list": listed,
            "entries": self._text(inspect.entries(snapshot_id=sid).to_pylist()),
            "files": self._text(inspect.files(snapshot_id=sid).to_pylist()),
            "partitions": self._text(inspect.partitions(snapshot_id=sid).to_pylist()),
            "duckdb": read_rows(self.table, "id, epoch, write_id", snapshot_id=sid),
            "pyiceberg": sorted(map(repr, self.table.scan(snapshot_id=sid).to_arrow().to_pylist())),
        }


@pytest.mark.parametrize("layout", ["unpartitioned", "identity", "rewritten across specs"])
def test_a_revision_through_prepared_manifests_shows_readers_what_its_own_manifests_show(
    pipeline: Pipeline, sink_id: str, branch: str, layout: str
) -> None:
    for name in TABLES:
        pipeline.create_table(name, BY_EPOCH if layout == "identity" else None)
    coordinator = replacing(pipeline, sink_id, branch=branch)
    first = generation(pipeline.write_iceberg(sink_id, 1, TABLES, rows=9, files=3), G1)
    commit(pipeline, coordinator, first)
    commit(pipeline, coordinator, pipeline.write_iceberg(sink_id, 3, TABLES, rows=4, files=2))
    if layout == "rewritten across specs":
        for name in TABLES:  # epoch 2 and the revision are written for spec 1; epochs 1 and 3 stay in spec 0
            with _load(pipeline, name).update_spec() as update:
                update.add_identity("epoch")
    commit(pipeline, coordinator, pipeline.write_iceberg(sink_id, 2, TABLES, rows=3))
    if layout == "rewritten across specs":
        for name in TABLES:  # epoch 1's files now share manifests with epoch 3's, across two of them
            rewrite_manifests(_load(pipeline, name), branch)
    second = generation(pipeline.write_iceberg(sink_id, 1, TABLES, rows=6, files=2), G2)
    committer = pipeline.iceberg_committer(branch=branch)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None

    plan = revision_plan(committer.prepare(second), row)  # as persist stages a revision
    staged = committer.stage(plan)
    prepared = staged.tables[0].prepared
    assert prepared is not None and prepared.snapshot_id is not None
    assert len(prepared.replaced) == (2 if layout == "rewritten across specs" else 1)
    plain = staged.tables[1].model_copy(update={"prepared": None})  # its commit writes its own, as before
    committed = committer.commit(
        CommitPlan(staged.model_copy(update={"tables": [staged.tables[0], plain]}), plan.replaces),
        pipeline.store.now(),
    )

    tables = {name: _load(pipeline, name) for name in TABLES}
    revision = int(committed[f"{pipeline.namespace}.prepared"])
    assert revision == prepared.snapshot_id
    snapshot = tables["prepared"].snapshot_by_id(revision)
    assert snapshot is not None
    ours = {m.manifest_path for m in snapshot.manifests(tables["prepared"].io) if m.added_snapshot_id == revision}
    assert ours == {m.path for m in prepared.manifests}
    views = {name: Views(table, name) for name, table in tables.items()}
    history = {name: table.snapshots() for name, table in tables.items()}
    assert len(history["prepared"]) == len(history["plain"])
    for ours_snapshot, theirs in zip(history["prepared"], history["plain"], strict=True):
        mine, before = views["prepared"].of(ours_snapshot), views["plain"].of(theirs)
        for view in mine:
            assert mine[view] == before[view], (view, ours_snapshot.snapshot_id)
    assert views["prepared"]._text(tables["prepared"].inspect.manifests().to_pylist()) == views["plain"]._text(
        tables["plain"].inspect.manifests().to_pylist()
    )
    deleted = [e for e in tables["prepared"].inspect.entries(snapshot_id=revision).to_pylist() if e["status"] == 2]
    assert len(deleted) == 3 and {e["snapshot_id"] for e in deleted} == {revision}
    shown = {w for _, _, w in read_rows(tables["prepared"], "id, epoch, write_id", snapshot_id=revision)}
    assert second.write_id in shown and first.write_id not in shown


def test_manifests_merged_between_persist_and_commit_are_filtered_by_the_commit_and_the_prepared_go(
    pipeline: Pipeline, sink_id: str
) -> None:
    pipeline.create_table("t")
    coordinator = replacing(pipeline, sink_id)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=2), G1)
    commit(pipeline, coordinator, first)
    other = pipeline.write_iceberg(sink_id, 2, ["t"], rows=4, files=2)
    commit(pipeline, coordinator, other)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5), G2)
    coordinator.persist(second)
    prepared = _prepared(pipeline, sink_id)
    assert all(_exists(m.path) for m in prepared.manifests)
    rewrite_manifests(_load(pipeline, "t"), "main")  # maintenance merges the manifests under the revision

    coordinator.commit(sink_id, 1)

    table = _load(pipeline, "t")
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == second.write_id
    assert row.committed is not None
    revision = int(next(iter(row.committed.values())))
    assert revision != prepared.snapshot_id
    snapshot = table.snapshot_by_id(revision)
    assert snapshot is not None
    listed = {m.manifest_path for m in snapshot.manifests(table.io)}
    assert not listed & {m.path for m in prepared.manifests}
    assert not any(_exists(m.path) for m in prepared.manifests)  # referenced by no snapshot: deleted
    shown = sorted(w for _, _, w in read_rows(table, "id, epoch, write_id"))
    assert shown == sorted([second.write_id] * 5 + [other.write_id] * 4)
    _every_snapshot_readable(table)


def test_a_foreign_append_between_persist_and_commit_keeps_the_prepared_manifests(
    pipeline: Pipeline, sink_id: str
) -> None:
    coordinator, _, second = _revision_persisted(pipeline, sink_id, files=2)
    prepared = _prepared(pipeline, sink_id)
    foreign = pipeline.write_iceberg("foreign", 9, ["t"], rows=2)
    foreign_append(pipeline, foreign, "main")  # the replaced write's manifest is still listed

    coordinator.commit(sink_id, 1)

    table = _load(pipeline, "t")
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.committed is not None
    assert int(next(iter(row.committed.values()))) == prepared.snapshot_id
    shown = sorted(w for _, _, w in read_rows(table, "id, epoch, write_id"))
    assert shown == sorted([second.write_id] * 5 + [foreign.write_id] * 2)


def test_the_commit_reads_no_replaced_entry_while_the_prepared_snapshot_stands(
    pipeline: Pipeline, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline.create_table("t")
    coordinator = replacing(pipeline, sink_id)
    commit(pipeline, coordinator, generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=3), G1))
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5), G2)
    coordinator.persist(second)

    def refuse(*args: object) -> None:
        raise AssertionError("the replaced write's entries were read again")

    monkeypatch.setattr(overwrites, "files_to_replace", refuse)
    result = coordinator.commit(sink_id, 1)

    assert result.record.committed is not None
    assert int(next(iter(result.record.committed.values()))) == _prepared(pipeline, sink_id).snapshot_id
    assert sorted(w for _, _, w in read_rows(_load(pipeline, "t"), "id, epoch, write_id")) == [second.write_id] * 5


def test_a_prepared_manifest_gone_after_the_check_makes_the_commit_look_the_files_up(
    pipeline: Pipeline, sink_id: str
) -> None:
    _, _, second = _revision_persisted(pipeline, sink_id, files=3)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None
    committer = pipeline.iceberg_committer()
    plan = committer.prepare(row.pre_commit, replaces=row.replaces)  # the check right before the decision
    (table_plan,) = plan.prepared.values()
    assert table_plan.to_replace == [overwrites.PREPARED_FILE] * 3  # type: ignore[attr-defined]
    gone = _prepared(pipeline, sink_id).manifests[0].path
    Path(local_path(gone)).unlink()  # a foreign orphan clean-up, between the check and the commit

    committed = committer.commit(plan, row.created_at)

    table = _load(pipeline, "t")
    snapshot = table.snapshot_by_id(int(next(iter(committed.values()))))
    assert snapshot is not None and snapshot.snapshot_id != _prepared(pipeline, sink_id).snapshot_id
    assert gone not in {m.manifest_path for m in snapshot.manifests(table.io)}
    assert sorted(w for _, _, w in read_rows(table, "id, epoch, write_id")) == [second.write_id] * 5
    assert table.snapshot_by_id(snapshot.snapshot_id).summary["deleted-data-files"] == "3"  # type: ignore[union-attr]
    _every_snapshot_readable(table)


@pytest.mark.parametrize("crash", ["persist.staged", "iceberg.before_catalog_update", "iceberg.after_catalog_update"])
def test_a_crash_then_recovery_commits_one_snapshot_and_expiry_leaves_every_listed_file(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, crash: str
) -> None:
    pipeline.create_table("t", BY_EPOCH)
    coordinator = replacing(pipeline, sink_id)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=3), G1)
    commit(pipeline, coordinator, first)
    commit(pipeline, coordinator, pipeline.write_iceberg(sink_id, 2, ["t"], rows=4, files=2))
    rewrite_manifests(_load(pipeline, "t"), "main")  # the replaced files share manifests with epoch 2's
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5, files=2), G2)
    faults.crash_at(crash)
    with pytest.raises(SimulatedCrash, match=crash):
        coordinator.persist(second)
        coordinator.commit(sink_id, 1)
    faults.disarm()

    recovering = replacing(pipeline, sink_id)
    if crash == "persist.staged":  # no row records the revision: its persist task is retried
        recovering.persist(second)
    report = recovering.recover(sink_id)

    assert report.ok, report.failed
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == second.write_id
    assert row.committed is not None
    assert int(next(iter(row.committed.values()))) == _prepared(pipeline, sink_id).snapshot_id
    markers = pipeline.marker_snapshots("t", sink_id)
    assert sorted(markers[1]) == sorted([first.write_id, second.write_id]) and markers[2]  # one snapshot each
    folder = Path(local_path(second.tables[0].location)) / MANIFEST_FOLDER
    recorded = {m.path for m in _prepared(pipeline, sink_id).manifests}
    assert {f"file://{p}" for p in folder.rglob("*.avro")} <= recorded  # no other attempt's left behind

    table = _load(pipeline, "t")
    current = table.metadata.current_snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    ).commit()
    assert recovering.clean_up(sink_id).files_deleted >= 3  # the replaced write's data files and manifest
    table = table.refresh()
    _every_snapshot_readable(table)
    shown = sorted(w for _, e, w in read_rows(table, "id, epoch, write_id") if e == 1)
    assert shown == [second.write_id] * 5


def test_an_aborted_revision_deletes_every_manifest_its_persist_wrote(pipeline: Pipeline, sink_id: str) -> None:
    """Those in the table's metadata folder too, which deleting its write location misses; the
    committed write's manifests and files stay, and every snapshot still reads."""
    coordinator, first, second = _revision_persisted(pipeline, sink_id, files=3)
    prepared = [m.path for m in _prepared(pipeline, sink_id).manifests]
    shared = [m.path for m in _prepared(pipeline, sink_id).manifests if m.replaces or m.deleted_files]
    assert shared and all(_exists(path) for path in prepared)

    aborted = coordinator.abort(sink_id, 1, reason="wait_for_checkpoint timed out", write=second)

    assert aborted.files_deleted == 1 + len(prepared)  # its data file and every manifest
    assert not any(_exists(path) for path in prepared)
    table = _load(pipeline, "t")
    _every_snapshot_readable(table)
    assert sorted(w for _, _, w in read_rows(table, "id, epoch, write_id")) == [first.write_id] * 6


def test_a_persist_attempt_that_another_recorded_deletes_its_own_manifests_and_keeps_the_recorded(
    pipeline: Pipeline, sink_id: str
) -> None:
    """Two attempts of one revision's persist (a retry racing a zombie) each stage its manifests; the
    one whose row was not recorded deletes its own, those in the metadata folder too."""
    pipeline.create_table("t")
    coordinator = replacing(pipeline, sink_id)
    commit(pipeline, coordinator, generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=3), G1))
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5), G2)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None
    committer = pipeline.iceberg_committer()
    plan = revision_plan(committer.prepare(second), row)
    recorded, lost = committer.stage(plan), committer.stage(plan)
    paths = lambda pre: [m.path for m in pre.tables[0].prepared.manifests]  # type: ignore[union-attr]  # noqa: E731

    committer.tidy(lost, recorded)

    assert all(_exists(path) for path in paths(recorded))
    assert not any(_exists(path) for path in paths(lost))


def test_a_revision_is_staged_once_and_its_manifests_hold_each_entry_once(pipeline: Pipeline, sink_id: str) -> None:
    """A reprocessed epoch's persist on a sink that replaces stages the write once, as a revision (not
    first as an append whose manifest the revision's then supersede), and what it wrote are exactly the
    manifests its row records: each replaced file's deleted entry once, each new file's added entry
    once, nothing else (issue 59, item 3)."""
    pipeline.create_table("t")
    coordinator = replacing(pipeline, sink_id)
    commit(
        pipeline, coordinator, pipeline.write_iceberg(sink_id, 2, ["t"], rows=4, files=2)
    )  # another epoch's manifest
    first = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=6, files=3), G1)
    commit(pipeline, coordinator, first)
    table = _load(pipeline, "t")
    metadata = Path(local_path(table.location())) / "metadata"
    before = set(metadata.glob("*.avro"))
    second = generation(pipeline.write_iceberg(sink_id, 1, ["t"], rows=5, files=2), G2)
    staged = pipeline.fault.seen["persist.staged"]

    coordinator.persist(second)

    assert pipeline.fault.seen["persist.staged"] == staged + 1
    prepared = _prepared(pipeline, sink_id)
    assert prepared.snapshot_id is not None
    below = Path(local_path(second.tables[0].location)) / MANIFEST_FOLDER
    written = {str(p) for p in set(metadata.glob("*.avro")) - before} | {str(p) for p in below.rglob("*.avro")}
    assert written == {local_path(m.path) for m in prepared.manifests}
    by_status: dict[str, list[str]] = {"ADDED": [], "EXISTING": [], "DELETED": []}
    for manifest in prepared.manifests:
        for entry in listed(manifest, prepared.snapshot_id).fetch_manifest_entry(table.io, discard_deleted=False):
            by_status[entry.status.name].append(entry.data_file.file_path)
    assert sorted(by_status["DELETED"]) == sorted(d.path for d in first.tables[0].data_files)
    assert sorted(by_status["ADDED"]) == sorted(d.path for d in second.tables[0].data_files)
    assert by_status["EXISTING"] == []  # the replaced write's manifest held nothing else: dropped, not copied
