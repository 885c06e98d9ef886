"""The file sink under the real coordinator, meta store and marker checkpoints: whole epochs, end to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints import MarkerFileCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import CheckpointNotReady
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore
from tests.support.faults import FaultSwitch

from .helpers import EPOCH, StagedFile, final_files, stage_write, staged_files

SINK = "files-sink"
FILES = [StagedFile([i, i + 100], partition={"p": i % 2}, writer=str(i)) for i in range(4)]


class Setup:
    def __init__(self, tmp_path: Path, store: SqlSinkStateStore) -> None:
        self.faults = FaultSwitch()
        self.checkpoints_root = tmp_path / "checkpoints"
        self.committer = FileSinkCommitter(str(tmp_path / "sink"), fault=self.faults)
        self.store = store
        self.coordinator = TwoPhaseCommitCoordinator(
            store,
            {SINK: self.committer},
            MarkerFileCheckpointSource(f"{self.checkpoints_root}/{{sink_id}}/{{epoch}}"),
            fault=self.faults,
        )

    def checkpoint(self, epoch: int, marker: str = "_SUCCESS") -> None:
        folder = self.checkpoints_root / SINK / str(epoch)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / marker).touch()

    def ids(self) -> list[int]:
        import pyarrow.parquet as pq

        return sorted(
            i
            for path in final_files(self.committer)
            for i in pq.read_table(f"{self.committer.root}/{path}").column("id").to_pylist()
        )


EXPECTED = sorted([i for i in range(4)] + [i + 100 for i in range(4)])


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    yield Setup(tmp_path, store)
    store.dispose()


def test_an_epoch_becomes_visible_only_after_its_checkpoint(setup: Setup) -> None:
    pre = stage_write(setup.committer, FILES, sink_id=SINK)
    assert setup.coordinator.persist(pre).outcome is PersistOutcome.PERSISTED
    with pytest.raises(CheckpointNotReady):
        setup.coordinator.commit(SINK, EPOCH)
    assert final_files(setup.committer) == []
    setup.checkpoint(EPOCH)
    assert setup.coordinator.commit(SINK, EPOCH).outcome is CommitOutcome.COMMITTED
    assert setup.ids() == EXPECTED
    row = setup.store.get(SINK, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert row.committed == {setup.committer.root: "files:4"}


def test_a_late_write_after_the_commit_is_removed_not_refused(setup: Setup) -> None:
    """The late write's final names are the committed write's: its staging must still be deletable."""
    first = stage_write(setup.committer, FILES, sink_id=SINK)
    setup.coordinator.persist(first)
    setup.checkpoint(EPOCH)
    setup.coordinator.commit(SINK, EPOCH)
    late = stage_write(setup.committer, FILES, sink_id=SINK)
    assert setup.coordinator.persist(late).outcome is PersistOutcome.ALREADY_COMMITTED
    assert staged_files(setup.committer, late) == []
    assert setup.ids() == EXPECTED


def test_a_replaced_write_is_removed_and_its_successor_committed(setup: Setup) -> None:
    first = stage_write(setup.committer, FILES[:2], sink_id=SINK)
    second = stage_write(setup.committer, FILES, sink_id=SINK)
    setup.coordinator.persist(first)
    assert setup.coordinator.persist(second).outcome is PersistOutcome.REPLACED
    assert staged_files(setup.committer, first) == []
    setup.checkpoint(EPOCH)
    setup.coordinator.commit(SINK, EPOCH)
    assert setup.ids() == EXPECTED


def test_recovery_finishes_a_commit_that_crashed_half_way(setup: Setup) -> None:
    pre = stage_write(setup.committer, FILES, sink_id=SINK)
    setup.coordinator.persist(pre)
    setup.checkpoint(EPOCH)
    setup.faults.crash_at("files.after_move", 2)
    with pytest.raises(SimulatedCrash):
        setup.coordinator.commit(SINK, EPOCH)
    setup.faults.disarm()
    assert len(final_files(setup.committer)) == 2

    report = setup.coordinator.recover(SINK)
    assert report.committed == [EPOCH] and report.ok
    assert setup.ids() == EXPECTED
    assert staged_files(setup.committer, pre) == []


def test_recovery_aborts_a_failed_checkpoint_and_deletes_its_staging(setup: Setup) -> None:
    pre = stage_write(setup.committer, FILES, sink_id=SINK)
    setup.coordinator.persist(pre)
    setup.checkpoint(EPOCH, "_FAILED")
    report = setup.coordinator.recover(SINK)
    assert report.aborted == [EPOCH]
    assert staged_files(setup.committer, pre) == []
    assert final_files(setup.committer) == []
