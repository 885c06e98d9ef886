"""The upsert pipeline's writer and checker without a cluster: epochs written by the harness's light
upsert writer and committed by the product's coordinator must match the key model; epochs committed
by hand the way a broken committer would (a stale write forced through, a failed hour's changes,
a write that keeps the files it rewrote) must be called what they are. A compaction between an
epoch's write and its commit must make the commit refuse, and a second write then commit once.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import UpsertConflict
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.markers import marker_properties
from demo.world import hour_dir, mark_hour
from fault_harness.checker import CheckResult
from fault_harness.harness import KEYED_EVENT_SCHEMA
from fault_harness.landed import epoch_of
from fault_harness.upsert_actions import compact
from fault_harness.upsert_changes import hour_changes, land_changes, last_per_key, read_changes
from fault_harness.upsert_checker import Model, check_upsert
from fault_harness.upsert_writer import write_upsert
from tests.support.pipeline import Pipeline

SINK = "faults-upsert-unit"
TABLE = "faults.t"
HOURS = [dt.datetime(2025, 1, 1, n, tzinfo=dt.UTC) for n in range(4)]


class World:
    def __init__(self, root: Path) -> None:
        self.landing = root / "landing"
        (root / "warehouse").mkdir()
        self.pipeline = Pipeline(
            meta_url=f"sqlite:///{root / 'meta.db'}",
            catalog_url=f"sqlite:///{root / 'catalog.db'}",
            warehouse=root / "warehouse",
            catalog_name="unit",
            namespace="faults",
        )
        self.pipeline.catalog.create_namespace_if_not_exists("faults")
        self.pipeline.catalog.create_table(TABLE, KEYED_EVENT_SCHEMA)
        self.coordinator = self.pipeline.coordinator(SINK, self.pipeline.iceberg_committer())
        for n, hour in enumerate(HOURS):
            land_changes(self.landing, hour, hour_changes("unit", n, hour))

    def table(self) -> Table:
        return self.pipeline.catalog.load_table(TABLE)

    def write(self, n: int) -> PreCommit:
        changes = last_per_key(read_changes(hour_dir(self.landing, HOURS[n])))
        return write_upsert(self.table(), TABLE, SINK, epoch_of(HOURS[n]), str(uuid.uuid4()), changes)

    def settle(self, n: int, *, completed: bool = True) -> None:
        mark_hour(self.landing, HOURS[n], completed=completed)
        status = CheckpointStatus.COMPLETED if completed else CheckpointStatus.FAILED
        self.pipeline.checkpoint(SINK, epoch_of(HOURS[n]), status)

    def run(self, n: int, *, completed: bool = True) -> PreCommit:
        """Hour ``n`` end to end through the product: write, persist, checkpoint, commit or abort."""
        pre = self.write(n)
        self.coordinator.persist(pre)
        self.settle(n, completed=completed)
        if completed:
            self.coordinator.commit(SINK, pre.epoch)
        else:
            self.coordinator.abort(SINK, pre.epoch, reason="checkpoint FAILED")
        return pre

    def commit_by_hand(self, pre: PreCommit, *, remove: set[str] | None = None) -> None:
        """One marked overwrite snapshot adding ``pre``'s files and removing the live files ``remove``
        names (every live file when ``None``), with none of the committer's checks."""
        table = self.table()
        live = {t.file.file_path: t.file for t in table.scan().plan_files()}
        gone = set(live) if remove is None else remove & set(live)
        marker = marker_properties(SINK, pre.epoch, pre.write_id)
        with table.transaction() as tx, tx.update_snapshot(snapshot_properties=marker).overwrite() as snapshot:
            for path in sorted(gone):
                snapshot.delete_data_file(live[path])
            for descriptor in pre.tables[0].data_files:
                snapshot.append_data_file(parquet_file_to_data_file(table.io, table.metadata, descriptor.path))

    def check(self) -> CheckResult:
        result = check_upsert(self.table(), self.landing, SINK, orphan_grace_s=0, now=time.time() + 5)
        assert result.reader == "duckdb and pyiceberg"
        return result

    def kinds(self) -> set[str]:
        return {a.kind for a in self.check().anomalies}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.pipeline.dispose()


def test_epochs_written_by_the_light_writer_and_committed_by_the_product_match_the_model(world: World) -> None:
    world.run(0)
    second = world.run(1)
    world.run(2, completed=False)  # a failed hour applies nothing
    # hour 3 is landed but not settled: nothing of it may show
    changes = second.tables[0].changes
    assert changes is not None and changes.updated + changes.deleted > 0, changes
    assert second.tables[0].rewritten and second.tables[0].read_snapshot_id is not None
    assert second.tables[0].key_lower_bounds and second.tables[0].key_upper_bounds
    result = world.check()
    assert result.anomalies == [], result.anomalies
    model = Model.build(world.landing)
    assert result.rows_visible == result.rows_expected == len(model.final)
    assert result.hours == {"completed": 2, "failed": 1, "unsettled": 1}
    assert result.marked_snapshots == 2


def test_a_compaction_between_write_and_commit_is_refused_then_the_epoch_written_again_commits_once(
    world: World,
) -> None:
    world.run(0)
    first = world.write(1)
    world.coordinator.persist(first)
    keys = set(last_per_key(read_changes(hour_dir(world.landing, HOURS[1]))))
    compacted = compact(world.table, keys)
    assert compacted is not None
    snapshot_id, old, _new, _rows = compacted
    assert old in {r.path for r in first.tables[0].rewritten}
    world.settle(1)
    with pytest.raises(UpsertConflict):
        world.coordinator.commit(SINK, first.epoch)
    again = world.write(1)
    world.coordinator.persist(again)
    world.coordinator.commit(SINK, again.epoch)
    assert world.coordinator.recover(SINK).ok
    row = world.pipeline.store.get(SINK, again.epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == again.write_id
    result = world.check()
    assert result.anomalies == [], result.anomalies
    assert result.marked_snapshots == 2 and result.snapshots_checked == 3  # the compaction's snapshot too
    history = world.table().metadata.snapshots
    assert snapshot_id in {s.snapshot_id for s in history}


def test_a_stale_write_forced_through_loses_updates_and_resurrects_deletes(world: World) -> None:
    world.run(0)
    stale = world.write(2)  # written before hour 1 committed: it never saw hour 1's changes
    world.run(1)
    world.settle(2)
    world.commit_by_hand(stale)  # committed as if the table had not moved: hour 1 undone
    kinds = world.kinds()
    assert "history" in kinds and kinds & {"lost_update", "missing", "resurrected"}, kinds


def test_a_failed_hours_changes_made_visible_are_caught(world: World) -> None:
    world.run(0)
    pre = world.write(1)
    world.settle(1, completed=False)
    world.commit_by_hand(pre, remove={r.path for r in pre.tables[0].rewritten})
    kinds = world.kinds()
    assert {"snapshots", "history"} <= kinds and kinds & {"visible_failed", "missing"}, kinds


def test_a_write_that_keeps_the_files_it_rewrote_duplicates_keys(world: World) -> None:
    world.run(0)
    pre = world.write(1)
    world.settle(1)
    world.commit_by_hand(pre, remove=set())
    kinds = world.kinds()
    assert {"duplicated", "history"} <= kinds, kinds
