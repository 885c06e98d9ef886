"""An upsert's manifests written at persist (issue 33 item 3): the overwrite that removes the files it
rewrote and adds its own, prepared against the table persist checked, and listed by the commit while
the branch head still lists every manifest that held those files. Readers see what an upsert that
wrote its manifests at commit shows; the table moving in between is still a conflict."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import UpsertConflict
from airflow_provider_exactly_once.core.ports import CommitPlan, FileCheck
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.overwrites import PREPARED_FILE
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import Pipeline, local_path
from tests.support.upsert_writer import ARROW, KEYED, Changes, keyed_pipeline, write_upsert

SINK = "prepared-upserts"
FIRST = {k: f"v{k}" for k in range(8)}
CHANGES: Changes = {1: "one", 2: None, 5: "five", 20: "new"}
AFTER = {0: "v0", 1: "one", 3: "v3", 4: "v4", 5: "five", 6: "v6", 7: "v7", 20: "new"}


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    pipeline = keyed_pipeline(tmp_path, FaultSwitch())
    pipeline.catalog.create_table("ns.u", schema=KEYED)
    yield pipeline
    pipeline.dispose()


@pytest.fixture
def coordinator(pipeline: Pipeline) -> TwoPhaseCommitCoordinator:
    return pipeline.coordinator(SINK, pipeline.iceberg_committer())


def _write(pipeline: Pipeline, epoch: int, changes: Changes, tables: tuple[str, ...] = ("ns.t",)) -> PreCommit:
    """One write of the changes into each table (a fan-out, under one write id)."""
    write_id = str(uuid.uuid4())
    writes = [write_upsert(pipeline.catalog, name, SINK, epoch, changes, write_id).tables[0] for name in tables]
    return PreCommit(sink_id=SINK, epoch=epoch, write_id=write_id, tables=writes)


def _apply(pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, pre: PreCommit) -> None:
    coordinator.persist(pre)
    pipeline.checkpoint(SINK, pre.epoch, CheckpointStatus.COMPLETED)
    coordinator.commit(SINK, pre.epoch)


def _rows(table: Table, snapshot_id: int | None = None) -> dict[int, str]:
    return dict(read_rows(table, "id, value", snapshot_id=snapshot_id))


def _first_epoch(pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, *tables: str) -> None:
    """Epoch 0: the first upsert, whose commit makes ``id`` the table's identifier field (a new
    schema: nothing is prepared for it)."""
    first = _write(pipeline, 0, FIRST, tables or ("ns.t",))
    _apply(pipeline, coordinator, first)
    row = pipeline.store.get(SINK, 0)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert all(write.prepared is None for write in row.pre_commit.tables)


def _clean(table: Table, rows: list[dict[str, Any]], ordinal: dict[int, int]) -> str:
    def clean(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: clean(v, k) for k, v in value.items() if k not in ("path", "length", "last_updated_at")}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if key.endswith("snapshot_id") and value is not None:
            return ordinal[value]
        if isinstance(value, str):
            return value.replace("/ns/t/", "/T/").replace("/ns/u/", "/T/").replace("/t/", "/T/").replace("/u/", "/T/")
        return value

    return repr(sorted((clean(row) for row in rows), key=repr))


def _views(table: Table) -> list[dict[str, Any]]:
    """Each snapshot as readers see it, with what differs between two tables (ids, paths) neutral."""
    ordinal = {s.snapshot_id: i for i, s in enumerate(table.snapshots())}
    views = []
    for snapshot in table.snapshots():
        sid = snapshot.snapshot_id
        listed = [
            (
                m.content,
                m.sequence_number,
                m.min_sequence_number,
                ordinal[m.added_snapshot_id],
                (m.added_files_count, m.existing_files_count, m.deleted_files_count),
                (m.added_rows_count, m.existing_rows_count, m.deleted_rows_count),
            )
            for m in snapshot.manifests(table.io)
        ]
        views.append(
            {
                "summary": snapshot.summary,
                "manifest list": listed,
                "entries": _clean(table, table.inspect.entries(snapshot_id=sid).to_pylist(), ordinal),
                "files": _clean(table, table.inspect.files(snapshot_id=sid).to_pylist(), ordinal),
                "duckdb": _rows(table, sid),
            }
        )
    return views


def test_an_upsert_through_prepared_manifests_shows_readers_what_its_own_manifests_show(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    _first_epoch(pipeline, coordinator, "ns.t", "ns.u")
    second = _write(pipeline, 1, CHANGES, ("ns.t", "ns.u"))
    committer = pipeline.iceberg_committer()
    plan = committer.prepare(second)  # as persist checks and stages it
    staged = committer.stage(plan)
    prepared = staged.table("ns.t").prepared
    assert prepared is not None and prepared.snapshot_id is not None
    assert sum(m.deleted_files for m in prepared.manifests) == len(second.table("ns.t").rewritten) > 0
    plain = staged.table("ns.u").model_copy(update={"prepared": None})  # its commit writes its own, as before
    committed = committer.commit(
        CommitPlan(staged.model_copy(update={"tables": [staged.table("ns.t"), plain]}), None), pipeline.store.now()
    )

    tables = {name: pipeline.catalog.load_table(name) for name in ("ns.t", "ns.u")}
    assert int(committed["ns.t"]) == prepared.snapshot_id
    snapshot = tables["ns.t"].snapshot_by_id(prepared.snapshot_id)
    assert snapshot is not None
    ours = {
        m.manifest_path for m in snapshot.manifests(tables["ns.t"].io) if m.added_snapshot_id == snapshot.snapshot_id
    }
    assert ours == {m.path for m in prepared.manifests}
    assert _views(tables["ns.t"]) == _views(tables["ns.u"])
    assert _rows(tables["ns.t"]) == AFTER == {r["id"]: r["value"] for r in tables["ns.t"].scan().to_arrow().to_pylist()}


def test_while_the_prepared_snapshot_stands_the_commit_looks_no_rewritten_file_up(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    _first_epoch(pipeline, coordinator)
    second = _write(pipeline, 1, CHANGES)
    coordinator.persist(second)
    row = pipeline.store.get(SINK, 1)
    assert row is not None
    committer = pipeline.iceberg_committer()
    pipeline.catalog.load_table("ns.t").append(  # a foreign append of keys the epoch does not touch
        pa.Table.from_pylist([{"id": 100, "value": "foreign"}], schema=ARROW)
    )
    [table_plan] = committer.prepare(row.pre_commit, check_files=FileCheck.EVERY_FILE).prepared.values()
    assert table_plan.to_replace == [PREPARED_FILE] * len(second.table("ns.t").rewritten)  # type: ignore[attr-defined]

    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    coordinator.commit(SINK, 1)
    assert _rows(pipeline.catalog.load_table("ns.t")) == {**AFTER, 100: "foreign"}


def test_a_compaction_between_persist_and_commit_is_a_conflict_and_the_rewrite_commits_once(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    _first_epoch(pipeline, coordinator)
    stale = _write(pipeline, 1, CHANGES)
    coordinator.persist(stale)
    row = pipeline.store.get(SINK, 1)
    assert row is not None
    prepared = row.pre_commit.table("ns.t").prepared
    assert prepared is not None
    table = pipeline.catalog.load_table("ns.t")
    table.overwrite(table.scan().to_arrow())  # another writer rewrites every file with the same rows
    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    with pytest.raises(UpsertConflict):
        coordinator.commit(SINK, 1)

    again = _write(pipeline, 1, CHANGES)  # the rewrite task's write, against the table as it is now
    coordinator.persist(again)
    coordinator.commit(SINK, 1)
    coordinator.clean_up(SINK)
    table = pipeline.catalog.load_table("ns.t")
    assert _rows(table) == AFTER
    markers = [s for s in table.snapshots() if (s.summary or {}).get("exactly-once.epoch") == "1"]
    assert len(markers) == 1
    shared = [local_path(m.path) for m in prepared.manifests if m.lists_other_writes]
    assert shared and not any(Path(p).exists() for p in shared)  # the given-up write's manifests went with it


def test_a_foreign_append_of_a_key_of_the_epoch_between_persist_and_commit_is_a_conflict(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    _first_epoch(pipeline, coordinator)
    coordinator.persist(_write(pipeline, 1, CHANGES))
    pipeline.catalog.load_table("ns.t").append(pa.Table.from_pylist([{"id": 5, "value": "theirs"}], schema=ARROW))
    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    with pytest.raises(UpsertConflict, match="may hold the epoch's keys"):
        coordinator.commit(SINK, 1)
    assert sorted(read_rows(pipeline.catalog.load_table("ns.t"), "id, value")) == sorted(
        [*FIRST.items(), (5, "theirs")]
    )
