"""The incremental pipeline's verdict (``fault_harness/incremental_checker.py``) without a cluster.

Epochs go through the product's own code, as the harness's light write runs it: the range reserved
in a real meta store on SQLite (``runtime.run_epochs.reserved_range``), read by the Spark
read's pieces (``incremental_pipeline.read_range``), written as one Parquet file
(``write_range``), persisted and committed by the coordinator with the range as its checkpoint;
one epoch aborted, its range read by the next, and one empty range. That world passes. Then the
sink, the upstream, the chain or the producer's record is doctored the way a broken product (or a
lost row) would leave it, and the checker must call it: rows appended after the last range
(``missing`` and ``consumed``), a write committed twice (``duplicated``, ``snapshots``,
``revisions``, ``history``), a row with other values (``unsourced``), a chain whose range is not
the summary's (``consumed``), a wrong status, a producer's row that never landed. The harness's own
runs only ever show the checker passing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog

from airflow_provider_exactly_once.checkpoints.sources import SnapshotRangeCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.input_ranges import Link, SnapshotRange
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.run_epochs import current_snapshot_of, reserved_range
from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import marker_properties
from airflow_provider_exactly_once.store import SqlSinkStateStore
from fault_harness.checker import CheckResult
from fault_harness.harness import EVENT_SCHEMA
from fault_harness.incremental import producer_row
from fault_harness.incremental_checker import Produced, check_incremental
from fault_harness.incremental_pipeline import read_range, write_range

SINK, SINK_TABLE, UPSTREAM = "faults-incremental-unit", "faults.sink", "faults.sink_upstream"
E0, E1, E2, E3, E4 = (1_735_689_600_000 + n * 3_600_000 for n in range(5))
EPOCHS = [E0, E1, E2, E3, E4]


class World:
    """An upstream the producer appends to, a sink its epochs are committed into, the meta store."""

    def __init__(self, root: Path) -> None:
        warehouse = root / "warehouse"
        warehouse.mkdir(parents=True)
        self.props = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{warehouse}"}
        self.catalog: Catalog = load_catalog("unit", **self.props)
        self.catalog.create_namespace("faults")
        self.catalog.create_table(SINK_TABLE, EVENT_SCHEMA)
        self.catalog.create_table(UPSTREAM, EVENT_SCHEMA, properties={"commit.manifest-merge.enabled": "true"})
        self.store = SqlSinkStateStore(f"sqlite:///{root / 'meta.db'}")
        self.coordinator = TwoPhaseCommitCoordinator(
            self.store,
            {SINK: IcebergSinkCommitter(self.catalog)},
            SnapshotRangeCheckpointSource(self.store.checkpoints),
        )
        self.rng = random.Random("unit")
        self.produced = Produced(UPSTREAM)
        self.writes: dict[int, PreCommit] = {}

    def append(self, *sizes: int) -> None:
        """One upstream snapshot per size, as the producer appends."""
        for size in sizes:
            start = len(self.produced.ids)
            batch = [producer_row(self.rng, start + i) for i in range(size)]
            table = self.catalog.load_table(UPSTREAM)
            table.append(pa.Table.from_pylist(batch, schema=table.schema().as_arrow()))
            self.produced.ids.extend(str(r["event_id"]) for r in batch)
            self.produced.appends += 1
        self.produced.last_snapshot_id = self.catalog.load_table(UPSTREAM).metadata.current_snapshot_id

    def write(self, epoch: int) -> PreCommit:
        """The light write's steps: reserve (or read back) the range, read it, write it."""
        reserved = reserved_range(
            self.store, SINK, epoch, UPSTREAM, current_snapshot_of("unit", self.props, UPSTREAM), run_id=f"r{epoch}"
        )
        source = None if reserved.empty else self.catalog.load_table(UPSTREAM)
        batches, read = read_range(source, reserved, self.props, f"epoch {epoch}")
        pre = write_range(
            self.catalog.load_table(SINK_TABLE), SINK_TABLE, SINK, epoch, reserved, batches, read, "part-0.parquet"
        )
        self.writes[epoch] = pre
        return pre

    def run(self, epoch: int) -> None:
        self.coordinator.persist(self.write(epoch))
        assert self.coordinator.commit(SINK, epoch).outcome is CommitOutcome.COMMITTED

    def chain(self) -> tuple[list[Link], dict[int, str]]:
        chain = self.store.input_ranges.chain(SINK)
        return list(chain.links), {e: s.value for e, s in chain.statuses.items()}

    def result(
        self,
        links: list[Link] | None = None,
        statuses: dict[int, str] | None = None,
        produced: Produced | None = None,
    ) -> CheckResult:
        own_links, own_statuses = self.chain()
        result = check_incremental(
            self.catalog.load_table(SINK_TABLE),
            self.catalog.load_table(UPSTREAM),
            SINK,
            own_links if links is None else links,
            own_statuses if statuses is None else statuses,
            epochs=EPOCHS,
            aborted={E2},
            produced=produced or self.produced,
            orphan_grace_s=3600,
            now=time.time(),
        )
        assert result.reader == "duckdb and pyiceberg"
        return result

    def check(self, **doctored: Any) -> set[tuple[str, int | None]]:
        return {(a.kind, a.epoch) for a in self.result(**doctored).anomalies}

    def commit_by_hand(self, rows: list[dict[str, Any]], marker: dict[str, str] | None = None) -> None:
        """A snapshot a broken committer (or another writer, without ``marker``) adds to the sink."""
        table = self.catalog.load_table(SINK_TABLE)
        table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()), snapshot_properties=marker or {})


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """Five epochs: E0 and E1 read several snapshots each, E2 is written and aborted by an operator
    (its range then read by E3, with more), E4 reads an empty range (nothing appended since E3)."""
    world = World(tmp_path)
    try:
        world.append(3, 1, 2)
        world.run(E0)
        world.append(2, 2)
        world.run(E1)
        world.append(4)
        world.coordinator.persist(world.write(E2))
        world.coordinator.abort(SINK, E2, reason="dropped by an operator", force=True)
        world.append(1, 1)
        world.run(E3)
        world.run(E4)
        yield world
    finally:
        world.store.dispose()


def _upstream_row(world: World, n: int) -> dict[str, Any]:
    row = world.catalog.load_table(UPSTREAM).scan().to_arrow().sort_by("event_id").slice(n, 1).to_pylist()[0]
    return dict(row)


def test_the_products_epochs_pass(world: World) -> None:
    result = world.result()
    assert result.anomalies == []
    assert (result.rows_visible, result.rows_expected) == (16, 16)
    assert result.hours == {"Committed": 4, "Aborted": 1}
    assert result.marked_snapshots == 3  # E4's empty range commits no snapshot
    assert result.incremental["snapshots_per_committed_range"] == [3, 2, 3, 0]  # E3 read E2's snapshot and its own two
    assert result.incremental["aborted_ranges"] == 1


def test_rows_appended_after_the_last_committed_range_are_missing(world: World) -> None:
    world.append(2)
    assert world.check() == {("missing", None), ("consumed", None)}
    detail = " ".join(a.detail for a in world.result().anomalies)
    assert "2 of the upstream's 18 rows are not in the sink" in detail
    assert "never delivered" in detail


def test_a_write_committed_twice_is_caught(world: World) -> None:
    """E1's write committed again (a second marked snapshot with its rows): the rows twice, the
    epoch with two snapshots of one write, and the history from that snapshot on wrong."""
    pre = world.writes[E1]
    reserved = SnapshotRange.of_positions(pre.source_positions)
    rows = world.catalog.load_table(SINK_TABLE).scan(snapshot_id=None).to_arrow().to_pylist()
    again = [r for r in rows if r["event_id"] in {"up-000006", "up-000007", "up-000008", "up-000009"}]
    assert len(again) == 4
    world.commit_by_hand(again, marker_properties(SINK, E1, pre.write_id, consumed=reserved))
    assert world.check() == {("duplicated", None), ("snapshots", E1), ("revisions", E1), ("history", E1)}


def test_a_sink_row_with_other_values_is_unsourced(world: World) -> None:
    row = _upstream_row(world, 0)
    world.commit_by_hand([{**row, "event_id": "never-upstream"}, {**row, "user_id": -1}])
    found = world.check()
    assert ("unsourced", None) in found
    assert "2 sink rows the upstream does not hold (1 of them with an upstream id" in " ".join(
        a.detail for a in world.result().anomalies
    )


def test_a_summary_that_is_not_the_chains_range_is_consumed(world: World) -> None:
    """The chain says E1 ended one snapshot earlier than the snapshot's summary says: the summary
    disagrees, and E3's range (after E1's true end) no longer starts where E1's ended."""
    links, statuses = world.chain()
    e1 = next(link for link in links if link.epoch == E1)
    upstream = world.catalog.load_table(UPSTREAM)
    parent = upstream.metadata.snapshot_by_id(e1.range.to_snapshot_id)
    assert parent is not None and parent.parent_snapshot_id is not None
    shorter = Link(E1, e1.position, e1.range.model_copy(update={"to_snapshot_id": parent.parent_snapshot_id}))
    doctored = [shorter if link.epoch == E1 else link for link in links]
    found = world.check(links=doctored, statuses=statuses)
    assert ("consumed", E1) in found and ("consumed", E2) in found and ("consumed", E3) in found
    assert "the meta store's chain reserved" in " ".join(
        a.detail for a in world.result(links=doctored, statuses=statuses).anomalies
    )


def test_an_epoch_the_run_should_have_committed_is_consumed(world: World) -> None:
    _links, statuses = world.chain()
    assert world.check(statuses={**statuses, E3: "Pending"}) >= {("consumed", E3)}


def test_a_producers_row_that_never_reached_the_upstream_is_missing(world: World) -> None:
    lost = Produced(UPSTREAM, ids=[*world.produced.ids, "up-999999"], appends=world.produced.appends + 1)
    assert world.check(produced=lost) == {("missing", None)}
