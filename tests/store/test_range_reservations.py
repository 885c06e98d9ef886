"""The commit's fence of incremental inputs (``core.input_ranges.range_read_elsewhere``, asked through
the store's ``input_ranges.sharing_start``): an epoch whose range starts where another epoch's does
is not committed once that one is decided, and an empty range, which read nothing, never fences nor
is fenced. Through the coordinator, on SQLite and PostgreSQL: real meta store, ranges reserved by
the write operator's rules (``runtime.run_epochs``), an Iceberg sink in a SQL catalog.

The upstream is named, never read: the store and the fence see snapshot ids only, so the upstream's
current snapshot is a number the test moves as an upstream's appends would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.sources import SnapshotRangeCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import InputRangeRefused
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.run_epochs import reserved_range
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline

UPSTREAM = "bronze.events"
EPOCHS = E1, E2, E3, E4, E5, E6, E7, E8 = tuple(1_717_200_000_000 + n * 3_600_000 for n in range(8))


class IncrementalSink:
    """One sink of an incremental input: its epochs reserve, persist and commit as the write and
    commit operators do."""

    def __init__(self, pipeline: Pipeline, sink_id: str, faults: FaultSwitch) -> None:
        self.pipeline, self.sink_id, self.faults = pipeline, sink_id, faults
        self.store = pipeline.store
        pipeline.create_table("silver")
        self.coordinator = TwoPhaseCommitCoordinator(
            self.store,
            {sink_id: pipeline.iceberg_committer()},
            SnapshotRangeCheckpointSource(self.store.checkpoints),
            fault=faults,
        )
        #: The upstream's current snapshot: what a new reservation ends at.
        self.upstream_at = 100

    def reserve(self, epoch: int) -> SnapshotRange:
        return reserved_range(self.store, self.sink_id, epoch, UPSTREAM, lambda: self.upstream_at)

    def persist(self, epoch: int, reserved: SnapshotRange | None = None) -> PreCommit:
        """A write of the epoch's range (``reserved``, or its reservation now): a row per snapshot
        of it, none for an empty one; the range as its source positions."""
        reserved = reserved or self.reserve(epoch)
        rows = 0 if reserved.empty else (reserved.to_snapshot_id or 0) - (reserved.after_snapshot_id or 0)
        written = self.pipeline.write_iceberg(self.sink_id, epoch, ["silver"], rows=rows // 100)
        write = PreCommit.model_validate(
            {**written.model_dump(), "source_positions": reserved.positions(records=rows // 100)}
        )
        self.coordinator.persist(write)
        return write

    def commit(self, epoch: int) -> None:
        assert self.coordinator.commit(self.sink_id, epoch).outcome is CommitOutcome.COMMITTED

    def status(self, epoch: int) -> EpochStatus:
        row = self.store.get(self.sink_id, epoch)
        assert row is not None
        return row.status

    def epochs_in_sink(self) -> list[int]:
        return sorted({int(row["epoch"]) for row in self.pipeline.rows("silver")})


@pytest.fixture
def sink(meta_url: str, catalog_url: str, warehouse: Path, sink_id: str) -> Iterator[IncrementalSink]:
    faults = FaultSwitch()
    pipeline = Pipeline(
        meta_url=meta_url,
        catalog_url=catalog_url,
        warehouse=warehouse,
        catalog_name=f"cat_{sink_id.replace('-', '_')}",
        namespace=f"ns_{sink_id.replace('-', '_')}",
        fault=faults,
    )
    yield IncrementalSink(pipeline, sink_id, faults)
    pipeline.dispose()


def test_an_epoch_decided_but_not_yet_marked_fences_a_range_from_the_same_start(sink: IncrementalSink) -> None:
    """Planted bug "the fence counts only Committed epochs": epoch 2's commit is decided and its rows
    are in the sink, the crash before its mark leaves it Pending; epoch 3, written again from the same
    start in the race the chain cannot see, must be refused there, and still once epoch 2 is marked."""
    sink.persist(E1)
    sink.commit(E1)
    sink.upstream_at = 200
    sink.persist(E2)
    sink.coordinator.abort(sink.sink_id, E2, reason="dropped by an operator", force=True)
    replayed = sink.reserve(E2)  # the re-run's decision, while epoch 2 is Aborted and the newest link
    sink.upstream_at = 300
    successor = sink.reserve(E3)  # from epoch 1's end too
    assert successor.after_snapshot_id == replayed.after_snapshot_id == 100
    sink.persist(E2, replayed)
    sink.persist(E3, successor)

    sink.faults.crash_at("commit.visible")
    with pytest.raises(SimulatedCrash):
        sink.coordinator.commit(sink.sink_id, E2)
    decided = sink.store.get(sink.sink_id, E2)
    assert decided is not None and decided.status is EpochStatus.PENDING and decided.commit_decided_at is not None
    assert sink.epochs_in_sink() == [E1, E2]  # the window: delivered, not marked

    with pytest.raises(InputRangeRefused, match=f"starts where epoch {E2}'s does"):
        sink.coordinator.commit(sink.sink_id, E3)
    assert sink.status(E3) is EpochStatus.PENDING and sink.epochs_in_sink() == [E1, E2]

    sink.commit(E2)  # recovery marks it
    with pytest.raises(InputRangeRefused, match=f"starts where epoch {E2}'s does"):
        sink.coordinator.commit(sink.sink_id, E3)
    assert sink.epochs_in_sink() == [E1, E2]


def test_an_empty_range_from_the_same_start_as_another_is_never_fenced(sink: IncrementalSink) -> None:
    """Planted bug "the fence counts an empty range": an hour with nothing new upstream commits an
    empty range (100 to 100), and the next epoch, which reads from the same start, must commit, as
    every epoch after such an hour; an empty range read again in the race, where another epoch's
    range (empty, then non-empty) starts, read nothing and must commit too."""
    sink.persist(E1)  # the upstream up to snapshot 100
    sink.commit(E1)
    sink.persist(E2)  # nothing new upstream: 100 to 100
    sink.commit(E2)
    sink.upstream_at = 200
    sink.persist(E3)  # 100 to 200, from where epoch 2's empty range starts
    sink.commit(E3)

    # An empty range whose re-run races an empty successor from the same start.
    sink.persist(E4)  # 200 to 200
    sink.coordinator.abort(sink.sink_id, E4, reason="dropped by an operator", force=True)
    replayed = sink.reserve(E4)
    sink.persist(E5)  # 200 to 200 too
    sink.persist(E4, replayed)
    sink.commit(E5)
    sink.commit(E4)
    sink.upstream_at = 300
    sink.persist(E6)  # 200 to 300: epochs 4 and 5 start there, both committed
    sink.commit(E6)

    # An empty range whose re-run races a successor that read new rows from the same start.
    sink.persist(E7)  # 300 to 300
    sink.coordinator.abort(sink.sink_id, E7, reason="dropped by an operator", force=True)
    replayed = sink.reserve(E7)
    sink.upstream_at = 400
    successor = sink.persist(E8)
    assert SnapshotRange.of_positions(successor.source_positions) == SnapshotRange(
        table=UPSTREAM, after_snapshot_id=300, to_snapshot_id=400
    )
    sink.persist(E7, replayed)
    sink.commit(E8)
    sink.commit(E7)  # it read nothing: nothing is delivered twice

    assert [sink.status(e) for e in EPOCHS] == [EpochStatus.COMMITTED] * len(EPOCHS)
    assert sink.epochs_in_sink() == [E1, E3, E6, E8]  # the epochs whose ranges held rows
