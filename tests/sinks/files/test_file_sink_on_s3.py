"""The file sink on a real S3 (SeaweedFS), its checkpoint markers there too, credentials from an
``aws`` connection: whole epochs through the coordinator as a task assembles it (``coordinator_for``).

On S3 a move is a copy and a delete and there are no folders; these tests crash between the moves
and inside one (after the copy, before the delete) and check the retry makes every row visible once.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.cleanups import classify_orphans
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import AbortRefused, CheckpointNotReady, SinkUnavailable
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.hooks.storage import resolved_storage_options
from airflow_provider_exactly_once.runtime.assembly import coordinator_for
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from airflow_provider_exactly_once.sinks.files import COMMIT_STARTED_MARKER, FileSinkCommitter
from airflow_provider_exactly_once.store import SqlSinkStateStore
from demo.servers import SeaweedFS
from tests.hooks.s3_connection import S3Place, SeaweedDown, s3_place  # noqa: F401
from tests.support.faults import FaultSwitch

from .helpers import EPOCH, StagedFile, final_files, stage_write, staged_files

SINK = "files-on-s3"
FILES = [StagedFile([i, i + 100], partition={"p": i % 2}, writer=str(i)) for i in range(4)]
EXPECTED = sorted([i for i in range(4)] + [i + 100 for i in range(4)])


class S3Setup:
    """A file sink at ``s3://plain/<prefix>/sink`` with markers under ``.../landing``, both reached
    through the test's ``aws`` connection, and the coordinator a task would build for them."""

    def __init__(self, place: S3Place, store: SqlSinkStateStore) -> None:
        self.place = place
        self.store = store
        self.faults = FaultSwitch()
        self.sink = FileSinkConfig(SINK, place.url("sink"), storage_conn_id=place.conn_id)
        self.checkpoint = MarkerFileCheckpoint(place.url("landing/{sink_id}/{epoch}"), storage_conn_id=place.conn_id)
        self.coordinator: TwoPhaseCommitCoordinator = coordinator_for(
            self.sink, self.checkpoint, store=store, fault=self.faults
        )
        #: The same sink as the coordinator's committer sees it: for staging writes and looking.
        self.committer: FileSinkCommitter = self.sink.committer(
            fault=self.faults, storage_options=resolved_storage_options(self.sink)
        )

    def mark(self, epoch: int, marker: str = "_SUCCESS") -> None:
        self.place.touch("landing", SINK, str(epoch), marker)

    def ids(self) -> list[int]:
        """Every row a reader of the directory sees, read back over S3."""
        fs = self.committer.filesystem
        root = fs._strip_protocol(self.committer.root)
        return sorted(
            i
            for path in final_files(self.committer)
            for i in pq.read_table(io.BytesIO(fs.cat_file(f"{root}/{path}"))).column("id").to_pylist()
        )


@pytest.fixture
def s3(s3_place: S3Place, tmp_path: Path) -> Iterator[S3Setup]:  # noqa: F811
    store = SqlSinkStateStore(f"sqlite:///{tmp_path}/meta.db")
    yield S3Setup(s3_place, store)
    store.dispose()


def test_the_committer_is_on_s3_with_the_connections_credentials(s3: S3Setup) -> None:
    assert s3.committer.root == s3.place.url("sink")
    assert s3.committer.filesystem.key == s3.place.fs.key  # from the connection, not the config
    assert "secret" not in s3.sink.model_dump(mode="json")["storage_options"]


def test_an_epoch_on_s3_is_visible_only_after_its_checkpoint_and_once(s3: S3Setup) -> None:
    pre = stage_write(s3.committer, FILES, sink_id=SINK)
    assert pre.tables[0].location == s3.place.url("sink", "_staging", pre.write_id)
    assert s3.coordinator.persist(pre).outcome is PersistOutcome.PERSISTED
    with pytest.raises(CheckpointNotReady):
        s3.coordinator.commit(SINK, EPOCH)
    assert final_files(s3.committer) == []

    s3.mark(EPOCH)
    assert s3.coordinator.commit(SINK, EPOCH).outcome is CommitOutcome.COMMITTED
    assert final_files(s3.committer) == [f"p={p}/{EPOCH}-{w}-0.parquet" for p, w in ((0, 0), (0, 2), (1, 1), (1, 3))]
    assert staged_files(s3.committer, pre) == []
    assert s3.ids() == EXPECTED
    row = s3.store.get(SINK, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert row.committed == {s3.committer.root: "files:4"}
    # A retried commit task changes nothing.
    assert s3.coordinator.commit(SINK, EPOCH).outcome is CommitOutcome.ALREADY_COMMITTED
    assert s3.ids() == EXPECTED


@pytest.mark.parametrize(
    ("point", "occurrence", "final_before_retry"), [("files.after_move", 2, 2), ("files.after_copy", 3, 3)]
)
def test_a_crash_in_the_middle_of_the_moves_is_finished_once_by_the_retry(
    s3: S3Setup, point: str, occurrence: int, final_before_retry: int
) -> None:
    """``files.after_copy``: the third file exists at its final name *and* is still staged."""
    pre = stage_write(s3.committer, FILES, sink_id=SINK)
    s3.coordinator.persist(pre)
    s3.mark(EPOCH)
    s3.faults.crash_at(point, occurrence)
    with pytest.raises(SimulatedCrash):
        s3.coordinator.commit(SINK, EPOCH)
    s3.faults.disarm()
    assert len(final_files(s3.committer)) == final_before_retry
    still_staged = [p.rsplit("/", 1)[-1] for p in staged_files(s3.committer, pre)]
    assert COMMIT_STARTED_MARKER in still_staged
    assert len(still_staged) == 1 + 4 - (occurrence if point == "files.after_move" else occurrence - 1)
    # Half visible: nobody may abort it now, only finish it.
    with pytest.raises(AbortRefused, match="has begun"):
        s3.committer.delete_write(pre, s3.store.get(SINK, EPOCH).created_at)  # type: ignore[union-attr]

    assert s3.coordinator.commit(SINK, EPOCH).outcome is CommitOutcome.COMMITTED  # the commit task's retry
    assert s3.ids() == EXPECTED
    assert len(final_files(s3.committer)) == 4
    assert staged_files(s3.committer, pre) == []


def test_recovery_finishes_a_crashed_commit_and_aborts_a_failed_checkpoint(s3: S3Setup) -> None:
    first = stage_write(s3.committer, FILES, sink_id=SINK, epoch=EPOCH)
    s3.coordinator.persist(first)
    s3.mark(EPOCH)
    s3.faults.crash_at("files.after_move", 1)
    with pytest.raises(SimulatedCrash):
        s3.coordinator.commit(SINK, EPOCH)
    s3.faults.disarm()

    failed = stage_write(s3.committer, FILES[:2], sink_id=SINK, epoch=EPOCH + 1)
    s3.coordinator.persist(failed)
    s3.mark(EPOCH + 1, "_FAILED")
    waiting = stage_write(s3.committer, FILES[:1], sink_id=SINK, epoch=EPOCH + 2)
    s3.coordinator.persist(waiting)

    report = s3.coordinator.recover(SINK)
    assert (report.committed, report.aborted, report.waiting) == ([EPOCH], [EPOCH + 1], [EPOCH + 2]), report
    assert report.ok
    assert s3.ids() == EXPECTED
    assert staged_files(s3.committer, failed) == []
    assert len(staged_files(s3.committer, waiting)) == 1


def test_an_s3_outage_during_a_commit_is_retryable_and_loses_nothing(s3: S3Setup, seaweed: SeaweedFS) -> None:
    pre = stage_write(s3.committer, FILES, sink_id=SINK)
    s3.coordinator.persist(pre)
    s3.mark(EPOCH)
    s3.faults.crash_at("files.after_move", 1)
    with pytest.raises(SimulatedCrash):
        s3.coordinator.commit(SINK, EPOCH)
    s3.faults.disarm()
    with SeaweedDown(seaweed):
        # Neither "missing files" (which would refuse the epoch) nor a crash of another kind:
        # the store did not answer, and the task is retried.
        with pytest.raises(SinkUnavailable) as raised:
            s3.committer.commit(_plan(s3), s3.store.get(SINK, EPOCH).created_at)  # type: ignore[union-attr]
        assert raised.value.retryable
        with pytest.raises(SinkUnavailable):
            s3.committer.find_committed(pre, s3.store.get(SINK, EPOCH).created_at)  # type: ignore[union-attr]
    assert s3.coordinator.commit(SINK, EPOCH).outcome is CommitOutcome.COMMITTED
    assert s3.ids() == EXPECTED


def _plan(s3: S3Setup) -> CommitPlan:
    row = s3.store.get(SINK, EPOCH)
    assert row is not None
    return CommitPlan(row.pre_commit)


def test_the_orphan_finder_lists_a_stale_s3_staging_folder(s3: S3Setup) -> None:
    """Recovery's orphan finder on a file sink on S3: folders are prefixes, ages are LastModified."""
    from airflow_provider_exactly_once.sinks.write_locations import FileWriteFolders

    known = stage_write(s3.committer, FILES[:1], sink_id=SINK)
    s3.coordinator.persist(known)
    orphan = stage_write(s3.committer, FILES[:2], sink_id=SINK, epoch=EPOCH + 1)
    listing = FileWriteFolders(s3.sink.committer(storage_options=resolved_storage_options(s3.sink)))
    old, young = classify_orphans(SINK, listing.folders(), s3.store.registry, grace=timedelta(0))
    assert [c.write_id for c in old] == [orphan.write_id] and young == []
    assert old[0].age.files == 2
    assert old[0].locations[0].location == s3.place.url("sink", "_staging", orphan.write_id)
    # Deleting it goes through the committer's own checks, on S3 like anywhere.
    assert s3.committer.delete_write(old[0].pre_commit(), old[0].age.oldest) == 2  # type: ignore[arg-type]
    assert staged_files(s3.committer, orphan) == []
