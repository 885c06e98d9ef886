"""File-sink crashes, races, refusals and aborts: the recovery decisions of design.md section 6."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.errors import AbortRefused, MissingDataFiles
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.ports import CommitPlan, FileCheck
from airflow_provider_exactly_once.sinks.files import COMMIT_STARTED_MARKER, FileSinkCommitter
from tests.support.faults import FaultSwitch

from .helpers import EPOCH, StagedFile, final_files, stage_write, staged_files

SINCE = datetime(2024, 1, 1, tzinfo=UTC)
FILES = [StagedFile([i * 10 + j for j in range(3)], partition={"p": i % 2}, writer=str(i % 3)) for i in range(5)]


def all_ids(committer: FileSinkCommitter) -> list[int]:
    import pyarrow.parquet as pq

    return sorted(
        i for path in final_files(committer) for i in pq.read_table(f"{committer.root}/{path}").column("id").to_pylist()
    )


EXPECTED_IDS = sorted(i * 10 + j for i in range(5) for j in range(3))


@pytest.mark.parametrize("moved", [0, 1, 3, 5])
def test_crash_after_k_of_n_moves_then_commit_again(sink_root: Path, moved: int) -> None:
    faults = FaultSwitch()
    committer = FileSinkCommitter(str(sink_root), fault=faults)
    pre = stage_write(committer, FILES)
    if moved == 0:
        faults.crash_at("files.before_move")
    else:
        faults.crash_at("files.after_move", moved)
    with pytest.raises(SimulatedCrash):
        committer.commit(CommitPlan(pre), SINCE)
    faults.disarm()
    assert len(final_files(committer)) == moved
    assert len(staged_files(committer, pre)) == 5 - moved + 1  # the rest, plus the commit-started marker

    # recovery's view: all present -> committed; none or some -> not visible yet, commit (again)
    visible = committer.find_committed(pre, SINCE).tables
    assert visible == ({committer.root: "files:5"} if moved == 5 else {})
    # the commit has begun, so abort is refused whatever was moved
    with pytest.raises(AbortRefused, match="has begun"):
        committer.delete_write(pre, SINCE)

    assert committer.commit(CommitPlan(pre), SINCE) == {committer.root: "files:5"}
    assert all_ids(committer) == EXPECTED_IDS  # every row once
    assert len(final_files(committer)) == 5
    assert staged_files(committer, pre) == []


def test_recovery_decisions_from_what_is_visible(tmp_path: Path) -> None:
    """None present -> commit or abort; some -> only finishing; all -> committed."""
    faults = FaultSwitch()
    committer = FileSinkCommitter(str(tmp_path / "sink"), fault=faults)

    none_moved = stage_write(committer, FILES, epoch=EPOCH)
    assert committer.find_committed(none_moved, SINCE).tables == {}
    assert committer.delete_write(none_moved, SINCE) == 5  # rewind: abort is allowed

    some_moved = stage_write(committer, FILES, epoch=EPOCH + 1)
    faults.crash_at("files.after_move", 2)
    with pytest.raises(SimulatedCrash):
        committer.commit(CommitPlan(some_moved), SINCE)
    faults.disarm()
    assert committer.find_committed(some_moved, SINCE).tables == {}
    with pytest.raises(AbortRefused):
        committer.delete_write(some_moved, SINCE)
    committer.commit(CommitPlan(some_moved), SINCE)  # finish the moves

    assert committer.find_committed(some_moved, SINCE).tables == {committer.root: "files:5"}  # truncate
    with pytest.raises(AbortRefused, match="final names"):
        committer.delete_write(some_moved, SINCE)  # a committed write is never deleted
    assert len(final_files(committer)) == 5


@pytest.mark.parametrize("repetition", range(20))
def test_two_committers_in_threads_move_each_file_once(tmp_path: Path, repetition: int) -> None:
    root = str(tmp_path / "sink")
    pre = stage_write(FileSinkCommitter(root), FILES)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def run() -> None:
        committer = FileSinkCommitter(root)
        barrier.wait(timeout=10)
        try:
            results.append(committer.commit(CommitPlan(pre), SINCE))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [{root: "files:5"}, {root: "files:5"}]
    committer = FileSinkCommitter(root)
    assert all_ids(committer) == EXPECTED_IDS
    assert len(final_files(committer)) == 5
    assert not (tmp_path / "sink" / "_staging" / pre.write_id).exists()


def test_missing_files_refuse_the_commit_and_move_nothing(committer: FileSinkCommitter, sink_root: Path) -> None:
    pre = stage_write(committer, FILES)
    gone = sorted(f.path for f in pre.tables[0].data_files)[1:3]
    for path in gone:
        Path(path).unlink()
    with pytest.raises(MissingDataFiles) as before_the_decision:
        committer.prepare(pre, check_files=FileCheck.EVERY_FILE)
    assert sorted(before_the_decision.value.paths) == gone
    committer.prepare(pre)  # persist's checks do not look at the files
    with pytest.raises(MissingDataFiles) as raised:
        committer.commit(CommitPlan(pre), SINCE)
    assert sorted(raised.value.paths) == gone
    assert all(path in str(raised.value) for path in gone)
    assert final_files(committer) == []
    assert len(staged_files(committer, pre)) == 3  # the others are still staged, untouched
    assert not (sink_root / "_staging" / pre.write_id / COMMIT_STARTED_MARKER).exists()


def test_abort_before_commit_deletes_only_the_staging(committer: FileSinkCommitter, sink_root: Path) -> None:
    earlier = stage_write(committer, [StagedFile([100])], epoch=EPOCH - 1)
    committer.commit(CommitPlan(earlier), SINCE)
    other = stage_write(committer, [StagedFile([200])], epoch=EPOCH + 1)
    pre = stage_write(committer, FILES)
    (sink_root / "_staging" / pre.write_id / "_SUCCESS").write_bytes(b"")

    assert committer.delete_write(pre, SINCE) == 6
    assert not (sink_root / "_staging" / pre.write_id).exists()
    assert committer.delete_write(pre, SINCE) == 0  # idempotent
    assert final_files(committer) == [f"{EPOCH - 1}-0-0.parquet"]
    assert len(staged_files(committer, other)) == 1
    with pytest.raises(MissingDataFiles):
        committer.commit(CommitPlan(pre), SINCE)  # its files are gone, nothing can be committed


def test_abort_after_a_partial_move_is_refused(committer: FileSinkCommitter, sink_root: Path) -> None:
    faults = FaultSwitch()
    crashing = FileSinkCommitter(committer.root, fault=faults)
    pre = stage_write(committer, FILES)
    faults.crash_at("files.before_move", 3)
    with pytest.raises(SimulatedCrash):
        crashing.commit(CommitPlan(pre), SINCE)
    before = (final_files(committer), staged_files(committer, pre))
    assert len(before[0]) == 2
    with pytest.raises(AbortRefused, match=r"commit into .* has begun"):
        committer.delete_write(pre, SINCE)
    assert (final_files(committer), staged_files(committer, pre)) == before  # nothing deleted


def test_moved_file_without_the_marker_still_refuses_abort(committer: FileSinkCommitter, sink_root: Path) -> None:
    """A final name whose staged copy is gone may be this write's: refuse even without the marker."""
    pre = stage_write(committer, FILES)
    move = committer.plan(pre)[0]
    Path(move.final).parent.mkdir(parents=True)
    Path(move.staged).rename(move.final)
    with pytest.raises(AbortRefused, match="1 file"):
        committer.delete_write(pre, SINCE)


def test_a_replaced_write_is_cleaned_up_after_its_successor_committed(committer: FileSinkCommitter) -> None:
    """Two writes of one epoch share final names; the replaced one's staging must still be deletable."""
    replaced = stage_write(committer, FILES)
    live = stage_write(committer, FILES)
    assert committer.commit(CommitPlan(live), SINCE) == {committer.root: "files:5"}
    assert committer.delete_write(replaced, SINCE) == 5
    assert staged_files(committer, replaced) == []
    assert all_ids(committer) == EXPECTED_IDS  # the live write's files are untouched


def test_crash_after_the_last_move_leaves_a_committed_epoch(committer: FileSinkCommitter) -> None:
    faults = FaultSwitch()
    crashing = FileSinkCommitter(committer.root, fault=faults)
    pre = stage_write(committer, FILES)
    faults.crash_at("files.after_move", 5)
    with pytest.raises(SimulatedCrash):
        crashing.commit(CommitPlan(pre), SINCE)
    assert committer.find_committed(pre, SINCE).tables == {committer.root: "files:5"}
    assert committer.commit(CommitPlan(pre), SINCE) == {committer.root: "files:5"}  # only tidies the staging folder
    assert staged_files(committer, pre) == []
    assert all_ids(committer) == EXPECTED_IDS


def test_memory_filesystem_crash_and_finish(memory_root: str) -> None:
    faults = FaultSwitch()
    committer = FileSinkCommitter(memory_root, fault=faults)
    pre = stage_write(committer, FILES)
    faults.crash_at("files.after_move", 2)
    with pytest.raises(SimulatedCrash):
        committer.commit(CommitPlan(pre), SINCE)
    faults.disarm()
    with pytest.raises(AbortRefused):
        committer.delete_write(pre, SINCE)
    assert committer.commit(CommitPlan(pre), SINCE) == {committer.root: "files:5"}
    assert len(final_files(committer)) == 5
    assert staged_files(committer, pre) == []
