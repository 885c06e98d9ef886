"""Epochs of an incremental input end to end, without Airflow: the range reserved in a real meta
store (``runtime.run_epochs``), the write by the epoch writer on real Spark reading it, the
coordinator persisting and committing it with the range as its checkpoint; judged by DuckDB on both
tables: the sink holds every upstream row exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from airflow_provider_exactly_once.checkpoints.sources import SnapshotRangeCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import InputRangeRefused
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.run_epochs import current_snapshot_of, reserved_range
from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import SOURCE_AFTER_KEY, SOURCE_TABLE_KEY, SOURCE_TO_KEY
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.spark.conftest import job_spec, make_table, run_in_process, sample_rows
from tests.spark.test_epoch_writer import iceberg_target
from tests.support.independent_reader import read_rows

UPSTREAM, SINK_TABLE = "ns.bronze", "ns.silver"
E1, E2, E3, E4 = (1_704_067_200_000 + n * 3_600_000 for n in range(4))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlSinkStateStore]:
    opened = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    yield opened
    opened.dispose()


class Incremental:
    def __init__(
        self, spark: Any, tmp: Path, catalog: Catalog, props: dict[str, str], store: SqlSinkStateStore
    ) -> None:
        self.spark, self.tmp, self.catalog, self.props, self.store = spark, tmp, catalog, props, store
        self.sink_id = "silver"
        self.upstream = make_table(catalog, UPSTREAM)
        make_table(catalog, SINK_TABLE)
        self.coordinator = TwoPhaseCommitCoordinator(
            store, {self.sink_id: IcebergSinkCommitter(catalog)}, SnapshotRangeCheckpointSource(store.checkpoints)
        )
        self.appended = 0

    def append(self, rows: int) -> None:
        batch = sample_rows(rows)
        ids = pa.array(range(self.appended, self.appended + rows), pa.int64())
        self.upstream.append(batch.set_column(0, pa.field("id", pa.int64(), nullable=False), ids))
        self.appended += rows

    def reserve(self, epoch: int) -> SnapshotRange:
        return reserved_range(
            self.store, self.sink_id, epoch, UPSTREAM, current_snapshot_of("default", self.props, UPSTREAM)
        )

    def write(self, epoch: int, reserved: SnapshotRange | None = None) -> PreCommit:
        reserved = reserved or self.reserve(epoch)
        spec = job_spec(
            self.tmp,
            input={"kind": "iceberg_table", "table": UPSTREAM},
            target=iceberg_target(self.props, SINK_TABLE),
            sink_id=self.sink_id,
            epoch=epoch,
            input_range=reserved.model_dump(),
            input_catalog_name="default",
            input_catalog_properties=self.props,
        )
        return run_in_process(self.spark, spec)

    def commit(self, epoch: int) -> None:
        assert self.coordinator.commit(self.sink_id, epoch).outcome is CommitOutcome.COMMITTED


def ids(table: Any) -> list[int]:
    return sorted(row[0] for row in read_rows(table, "id"))


def test_each_upstream_row_reaches_the_sink_once_through_retries_and_an_abort(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], store: SqlSinkStateStore
) -> None:
    world = Incremental(spark, tmp_path, catalog, catalog_props, store)
    world.append(100)
    world.append(50)
    first = world.write(E1)
    world.coordinator.persist(first)
    world.commit(E1)

    world.append(30)
    tried = world.write(E2)
    world.append(20)  # lands while the epoch is retried: the next epoch's
    retried = world.write(E2)
    assert retried.source_positions == tried.source_positions and retried.record_count == tried.record_count == 30
    world.coordinator.persist(tried)
    world.coordinator.persist(retried)  # the retry's write replaces the first try's
    world.commit(E2)

    world.append(10)
    aborted = world.write(E3)
    world.coordinator.persist(aborted)
    world.coordinator.abort(world.sink_id, E3, reason="dropped by an operator", force=True)
    world.append(5)
    after_abort = world.write(E4)  # reads epoch 3's range too: nothing skipped
    assert after_abort.record_count == 20 + 10 + 5
    world.coordinator.persist(after_abort)
    world.commit(E4)
    with pytest.raises(InputRangeRefused, match=f"read again by epoch {E4}"):
        world.write(E3)

    assert store.get(world.sink_id, E3).status is EpochStatus.ABORTED  # type: ignore[union-attr]
    upstream, sink = catalog.load_table(UPSTREAM), catalog.load_table(SINK_TABLE)
    assert ids(sink) == ids(upstream) == list(range(world.appended))
    consumed = {}
    for snapshot in sink.snapshots():
        summary = snapshot.summary.additional_properties  # type: ignore[union-attr]
        consumed[int(summary["exactly-once.epoch"])] = (
            summary[SOURCE_TABLE_KEY],
            summary.get(SOURCE_AFTER_KEY),
            summary[SOURCE_TO_KEY],
        )
    chain = {link.epoch: link.range for link in store.input_ranges.chain(world.sink_id).links}
    assert set(consumed) == {E1, E2, E4}
    for epoch, (table, after, to) in consumed.items():
        reserved = chain[epoch]
        assert (table, after, to) == (
            UPSTREAM,
            None if reserved.after_snapshot_id is None else str(reserved.after_snapshot_id),
            str(reserved.to_snapshot_id),
        )
    assert chain[E4].after_snapshot_id == chain[E2].to_snapshot_id
    assert SnapshotRange.of_positions(after_abort.source_positions) == chain[E4]


def test_an_aborted_epoch_written_again_as_its_successor_reserves_is_fenced_at_the_commit(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], store: SqlSinkStateStore
) -> None:
    """The race the chain cannot see: epoch 2's re-run reads its range back while it is still
    Aborted, epoch 3 reserves from the same start before epoch 2 is persisted again. Both are
    written; the first to commit wins, the other is refused by the commit's decision, never both."""
    world = Incremental(spark, tmp_path, catalog, catalog_props, store)
    world.append(10)
    world.coordinator.persist(world.write(E1))
    world.commit(E1)
    world.append(20)
    first_try = world.write(E2)
    world.coordinator.persist(first_try)
    world.coordinator.abort(world.sink_id, E2, reason="dropped by an operator", force=True)

    replayed = world.reserve(E2)  # the re-run's decision: E2 is Aborted and the newest link
    world.append(5)
    successor = world.write(E3)  # reserves from E1's end too, while E2 is still Aborted
    rerun = world.write(E2, replayed)
    world.coordinator.persist(successor)
    world.coordinator.persist(rerun)  # Aborted -> Pending: a new write re-opens the epoch
    world.commit(E3)
    with pytest.raises(InputRangeRefused, match=f"starts where epoch {E3}'s does"):
        world.coordinator.commit(world.sink_id, E2)
    assert store.get(world.sink_id, E2).status is EpochStatus.PENDING  # type: ignore[union-attr]
    world.coordinator.abort(world.sink_id, E2, reason="its range went to epoch 3", force=True)
    upstream, sink = catalog.load_table(UPSTREAM), catalog.load_table(SINK_TABLE)
    assert ids(sink) == ids(upstream) == list(range(world.appended))
