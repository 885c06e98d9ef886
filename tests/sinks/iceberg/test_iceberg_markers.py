"""The marker look-back is bounded by recent snapshots, never by the table's history."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, SupportsIndex

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    find_marker,
    marker_properties,
    recent_ancestry,
)

from .iceberg_helpers import SIMPLE_SCHEMA, create_table, now, rows, simple_write

WRITE_ID = "6f1d3c2e-8f7a-4a55-9b0e-2c1d4e5f6a7b"


class _CountingList(list[Snapshot]):
    """Counts element reads, to measure how much of the history a look-up touched."""

    reads = 0

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        _CountingList.reads += 1
        return super().__getitem__(index)

    def __iter__(self) -> Any:
        raise AssertionError("the whole snapshot list was iterated")


def _metadata(history: int, recent: int, *, marker_at: int | None, t0: int = 1_000_000) -> TableMetadata:
    """``history`` old snapshots one second apart, then ``recent`` ones an hour later, on main."""
    base = new_table_metadata(SIMPLE_SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///nowhere", {})
    snapshots = _CountingList()
    parent = None
    for i in range(history + recent):
        timestamp = t0 + i * 1000 + (3_600_000 if i >= history else 0)
        props = marker_properties("sink", 42, WRITE_ID) if i == marker_at else {}
        snapshots.append(
            Snapshot(
                snapshot_id=i + 1,
                parent_snapshot_id=parent,
                timestamp_ms=timestamp,
                manifest_list=f"file:///nowhere/snap-{i}.avro",
                summary=Summary(Operation.APPEND, **props),
            )
        )
        parent = i + 1
    refs = {"main": SnapshotRef(snapshot_id=parent, snapshot_ref_type=SnapshotRefType.BRANCH)}  # type: ignore[call-arg]
    return base.model_copy(update={"snapshots": snapshots, "refs": refs, "current_snapshot_id": parent})


def _reads(metadata: TableMetadata, not_before_ms: int) -> tuple[Any, int]:
    _CountingList.reads = 0
    found = find_marker(metadata, "sink", 42, branch="main", not_before_ms=not_before_ms)
    return found, _CountingList.reads


def test_walk_touches_only_recent_snapshots_whatever_the_history() -> None:
    bound = 1_000_000 + 3_600_000 - 1  # just before the first "recent" snapshot of every table
    for history in (100, 10_000):
        metadata = _metadata(history, 5, marker_at=history + 1)
        found, reads = _reads(metadata, bound + history * 1000)
        assert found == (history + 2, WRITE_ID)
        assert 5 <= reads <= 6, f"{reads} snapshot reads with {history} earlier snapshots"


def test_marker_older_than_the_bound_is_not_found() -> None:
    metadata = _metadata(1000, 5, marker_at=10)
    found, reads = _reads(metadata, 1_000_000 + 1000 * 1000 + 3_600_000 - 1)
    assert found is None
    assert reads <= 6
    # With a bound reaching back far enough, the same marker is found: the bound is what hid it.
    found, _ = _reads(metadata, 0)
    assert found == (11, WRITE_ID)


def test_other_sinks_and_epochs_do_not_match() -> None:
    metadata = _metadata(3, 3, marker_at=4)
    assert find_marker(metadata, "sink", 43, branch="main", not_before_ms=0) is None
    assert find_marker(metadata, "other", 42, branch="main", not_before_ms=0) is None
    assert find_marker(metadata, "sink", 42, branch="audit", not_before_ms=0) is None


def test_real_table_only_recent_ancestors_are_walked(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    old = simple_write(table, sink_id, epoch=1)
    committer.commit(CommitPlan(old), now())
    for i in range(6):
        table.refresh().append(rows(100 + i, 1))
    time.sleep(0.02)
    since = now()
    for i in range(2):
        table.refresh().append(rows(200 + i, 1))
    ours = simple_write(table, sink_id, epoch=2)
    committer_no_skew = IcebergSinkCommitter(catalog, clock_skew=timedelta(0))
    committer_no_skew.commit(CommitPlan(ours), since)

    metadata = table.refresh().metadata
    assert len(metadata.snapshots) == 10
    walked = recent_ancestry(metadata, branch="main", not_before_ms=int(since.timestamp() * 1000))
    assert len(walked) == 3
    assert walked[0].snapshot_id == metadata.current_snapshot_id
    # Epoch 1's marker is older than this bound: looking from here cannot see it...
    assert committer_no_skew.find_committed(old, since).tables == {}
    # ...while the default ten-minute clock-skew margin reaches back far enough.
    assert committer.find_committed(old, since).write_ids == {"ns.t": old.write_id}
