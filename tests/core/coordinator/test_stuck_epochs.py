"""Epochs that must never get stuck or silently lose data: one epoch's unexpected error during
recovery, a table dropped and re-created under the sink, a sink id reused by another pipeline, the
persist guards that keep a late or discarded write from taking an epoch back, and a decided write
whose data files were lost.

Every case runs on SQLite and PostgreSQL; those that commit run on ``main`` and on a named branch,
and the table is judged by DuckDB's iceberg reader as well as by the store.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import AbortRefused, EpochAborted, MissingDataFiles, SinkReused
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.operations import SinkOperations
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_branch
from tests.support.pipeline import Pipeline, as_tuples, expected_rows, local_path, write_location_exists

COMPLETED, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.FAILED


def _seen_by_duckdb(pipeline: Pipeline, name: str, branch: str) -> list[tuple[int, int, str]]:
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    return sorted(read_branch(table, branch, "id, epoch, write_id"))


def _committed(pipeline: Pipeline, sink_id: str, branch: str, epoch: int, rows: int = 3) -> PreCommit:
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, epoch, ["t"], rows=rows)
    coordinator.persist(pre, dag_id="pipeline_a")
    pipeline.checkpoint(sink_id, epoch, COMPLETED)
    assert coordinator.commit(sink_id, epoch).outcome is CommitOutcome.COMMITTED
    return pre


# -- one epoch's unexpected error does not stop its sink's recovery ---------------------------------


class _UpstreamWithABadEpoch:
    """A user's own checkpoint source (design.md section 7) whose check of one epoch has a bug."""

    def __init__(self, inner: object, bad_epoch: int) -> None:
        self._inner = inner
        self._bad_epoch = bad_epoch

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        if epoch == self._bad_epoch:
            raise KeyError(f"no partition for epoch {epoch}")
        return self._inner.status(sink_id, epoch)  # type: ignore[attr-defined, no-any-return]

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        return self.status(sink_id, epoch)


def test_an_unexpected_error_of_one_epoch_is_recorded_and_the_others_recover(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("t")
    plain = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    writes = {epoch: pipeline.write_iceberg(sink_id, epoch, ["t"], rows=2) for epoch in (1, 2, 3)}
    for epoch, pre in writes.items():
        plain.persist(pre)
        pipeline.checkpoint(sink_id, epoch, COMPLETED)

    buggy = TwoPhaseCommitCoordinator(
        pipeline.store,
        {sink_id: pipeline.iceberg_committer(branch=branch)},
        _UpstreamWithABadEpoch(pipeline.checkpoints, bad_epoch=2),  # type: ignore[arg-type]
    )
    report = buggy.recover(sink_id)

    assert report.committed == [1, 3]
    assert list(report.failed) == [2] and "KeyError" in report.failed[2]
    bad = pipeline.store.get(sink_id, 2)
    assert bad is not None and bad.status is EpochStatus.PENDING
    assert bad.error is not None and "KeyError" in bad.error and "no partition for epoch 2" in bad.error
    assert _seen_by_duckdb(pipeline, "t", branch) == expected_rows([writes[1], writes[3]], f"{pipeline.namespace}.t")

    assert plain.recover(sink_id).committed == [2]  # once the source is fixed, the epoch finishes
    assert _seen_by_duckdb(pipeline, "t", branch) == expected_rows(writes.values(), f"{pipeline.namespace}.t")


def test_recovery_aborts_an_epoch_whose_checkpoint_failed_and_deletes_its_files(
    pipeline: Pipeline, sink_id: str
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 4, ["t"])
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 4, FAILED)

    report = coordinator.recover(sink_id)

    assert report.aborted == [4] and report.committed == [] and report.ok
    assert report.files_deleted == len(pre.tables[0].data_files) + 1  # and the manifest persist wrote
    row = pipeline.store.get(sink_id, 4)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not write_location_exists(pre)
    assert pipeline.rows("t") == []


# -- a table dropped and re-created under the same sink ---------------------------------------------


def _recreate(pipeline: Pipeline, name: str) -> None:
    pipeline.catalog.drop_table(f"{pipeline.namespace}.{name}")
    pipeline.create_table(name)


def test_an_epoch_committed_to_a_dropped_table_is_committed_again_to_the_new_one(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("t")
    old = _committed(pipeline, sink_id, branch, epoch=10)
    first = pipeline.store.get(sink_id, 10)
    assert first is not None and first.table_uuids is not None
    _recreate(pipeline, "t")

    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    new = pipeline.write_iceberg(sink_id, 10, ["t"], rows=4)
    result = coordinator.persist(new, dag_id="pipeline_a")

    assert result.outcome is PersistOutcome.REOPENED and result.write_id == new.write_id
    assert result.warning is not None and "re-created" in result.warning
    row = pipeline.store.get(sink_id, 10)
    assert row is not None and row.status is EpochStatus.PENDING and row.write_id == new.write_id
    assert row.warning == result.warning
    assert _seen_by_duckdb(pipeline, "t", branch) == []  # invariant 2 holds for the new table too

    committed = coordinator.commit(sink_id, 10)

    assert committed.outcome is CommitOutcome.COMMITTED
    assert committed.record.table_uuids != first.table_uuids
    name = f"{pipeline.namespace}.t"
    assert _seen_by_duckdb(pipeline, "t", branch) == expected_rows([new], name)
    assert as_tuples(pipeline.rows("t", branch=branch)) == expected_rows([new], name)
    assert pipeline.marker_snapshots("t", sink_id) == {10: [new.write_id]}
    assert coordinator.persist(old).outcome is PersistOutcome.ALREADY_COMMITTED  # a zombie of the old write


def test_rows_committed_before_identities_were_recorded_stay_committed(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("t")
    _committed(pipeline, sink_id, "main", epoch=11)
    with pipeline.store.engine.begin() as conn:  # a row written by a release without migration 0004
        conn.exec_driver_sql("UPDATE pending_sink_state SET table_uuids = NULL")
    _recreate(pipeline, "t")

    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    late = pipeline.write_iceberg(sink_id, 11, ["t"])
    assert coordinator.persist(late).outcome is PersistOutcome.ALREADY_COMMITTED
    assert not write_location_exists(late)


# -- a sink id reused by another pipeline -----------------------------------------------------------


def test_a_write_for_other_tables_than_the_committed_epoch_is_refused_loudly(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("t")
    pipeline.create_table("other")
    old = _committed(pipeline, sink_id, "main", epoch=12)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    foreign = pipeline.write_iceberg(sink_id, 12, ["other"])

    with pytest.raises(SinkReused, match=r"give the new pipeline or table its own sink_id") as refused:
        coordinator.persist(foreign, dag_id="pipeline_b")

    assert f"{pipeline.namespace}.t" in str(refused.value) and f"{pipeline.namespace}.other" in str(refused.value)
    row = pipeline.store.get(sink_id, 12)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == old.write_id
    assert not write_location_exists(foreign)
    assert pipeline.rows("other") == []


def test_a_write_from_another_dag_for_a_committed_epoch_is_discarded_with_a_warning(
    pipeline: Pipeline, sink_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline.create_table("t")
    old = _committed(pipeline, sink_id, "main", epoch=13)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    other = pipeline.write_iceberg(sink_id, 13, ["t"])

    with caplog.at_level("WARNING"):
        result = coordinator.persist(other, dag_id="pipeline_b")

    assert result.outcome is PersistOutcome.ALREADY_COMMITTED and result.write_id == old.write_id
    assert result.warning is not None and "'pipeline_a'" in result.warning and "'pipeline_b'" in result.warning
    assert any("pipeline_b" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    row = pipeline.store.get(sink_id, 13)
    assert row is not None and row.warning == result.warning and row.status is EpochStatus.COMMITTED
    shown = SinkOperations(pipeline.store).epoch(sink_id, 13)  # what eo-sink show and the UI epoch page show
    assert shown.warning == result.warning
    assert [t.table_uuid for t in shown.tables] == [
        str(pipeline.catalog.load_table(f"{pipeline.namespace}.t").metadata.table_uuid)
    ]
    assert not write_location_exists(other)
    assert as_tuples(pipeline.rows("t")) == expected_rows([old], f"{pipeline.namespace}.t")


# -- persist's guards: a late write while a commit is decided, a discarded write ------------------


def test_a_late_write_while_the_commit_is_decided_is_removed_and_the_decided_write_lands(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = pipeline.write_iceberg(sink_id, 20, ["t"])
    coordinator.persist(first)
    pipeline.checkpoint(sink_id, 20, COMPLETED)
    faults.crash_at("commit.decided")
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 20)
    faults.disarm()

    late = pipeline.write_iceberg(sink_id, 20, ["t"])
    result = coordinator.persist(late)

    assert result.outcome is PersistOutcome.COMMIT_DECIDED and result.write_id == first.write_id
    assert not write_location_exists(late)
    assert pipeline.store.cleanups(sink_id) == []
    assert coordinator.commit(sink_id, 20).record.write_id == first.write_id
    assert _seen_by_duckdb(pipeline, "t", branch) == expected_rows([first], f"{pipeline.namespace}.t")


def test_a_replaced_write_persisted_again_is_refused_and_the_epoch_keeps_its_write(
    pipeline: Pipeline, sink_id: str
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    first = pipeline.write_iceberg(sink_id, 21, ["t"])
    second = pipeline.write_iceberg(sink_id, 21, ["t"])
    coordinator.persist(first)
    assert coordinator.persist(second).outcome is PersistOutcome.REPLACED

    with pytest.raises(EpochAborted, match="discarded"):
        coordinator.persist(first)  # a retried persist task of the first write, late

    row = pipeline.store.get(sink_id, 21)
    assert row is not None and row.status is EpochStatus.PENDING and row.write_id == second.write_id
    assert write_location_exists(second) and not write_location_exists(first)
    pipeline.checkpoint(sink_id, 21, COMPLETED)
    coordinator.commit(sink_id, 21)
    assert as_tuples(pipeline.rows("t")) == expected_rows([second], f"{pipeline.namespace}.t")


def test_a_write_aborted_while_not_the_epochs_cannot_be_persisted_later(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    live = pipeline.write_iceberg(sink_id, 22, ["t"])
    stray = pipeline.write_iceberg(sink_id, 22, ["t"])
    coordinator.persist(live)
    aborted = coordinator.abort(sink_id, 22, reason="its run failed", write=stray)
    assert aborted.outcome is AbortOutcome.OTHER_WRITE_REMOVED

    with pytest.raises(EpochAborted, match="discarded"):
        coordinator.persist(stray)

    row = pipeline.store.get(sink_id, 22)
    assert row is not None and row.status is EpochStatus.PENDING and row.write_id == live.write_id
    assert write_location_exists(live) and not write_location_exists(stray)


# -- a decided write whose data files were lost ----------------------------------------------------


def _decided(pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str, epoch: int, *, at: str) -> PreCommit:
    """A write persisted, its checkpoint COMPLETED, and its commit crashed at ``at`` (after the decision)."""
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, epoch, ["t"], rows=4)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, epoch, COMPLETED)
    faults.crash_at(at)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, epoch)
    faults.disarm()
    return pre


def _lose_a_file(pre: PreCommit) -> str:
    lost = pre.tables[0].data_files[0].path
    os.remove(local_path(lost))
    return lost


def test_a_decided_write_whose_files_were_lost_is_given_up_and_the_epoch_written_again(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = _decided(pipeline, sink_id, faults, branch, 30, at="commit.decided")
    lost = _lose_a_file(pre)

    with pytest.raises(MissingDataFiles, match="--files-lost") as missing:
        coordinator.commit(sink_id, 30)
    assert missing.value.paths == [lost]
    with pytest.raises(AbortRefused, match="files_lost=True"):
        coordinator.abort(sink_id, 30, reason="lifecycle rule")

    result = coordinator.abort(sink_id, 30, reason="lifecycle rule", files_lost=True)

    assert result.outcome is AbortOutcome.ABORTED
    assert result.files_deleted == len(pre.tables[0].data_files) - 1 + 1  # the manifest persist wrote
    row = pipeline.store.get(sink_id, 30)
    assert row is not None and row.status is EpochStatus.ABORTED and row.error == "lifecycle rule"
    assert not write_location_exists(pre) and pipeline.store.cleanups(sink_id) == []
    assert _seen_by_duckdb(pipeline, "t", branch) == []

    again = pipeline.write_iceberg(sink_id, 30, ["t"], rows=4)  # the epoch's run, cleared and run again
    assert coordinator.persist(again).outcome is PersistOutcome.REPLACED
    assert coordinator.commit(sink_id, 30).outcome is CommitOutcome.COMMITTED
    assert _seen_by_duckdb(pipeline, "t", branch) == expected_rows([again], f"{pipeline.namespace}.t")


def test_files_lost_is_refused_while_every_file_is_there(pipeline: Pipeline, sink_id: str, faults: FaultSwitch) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = _decided(pipeline, sink_id, faults, "main", 31, at="commit.decided")

    with pytest.raises(AbortRefused, match="nothing is lost; commit it"):
        coordinator.abort(sink_id, 31, reason="mistaken", files_lost=True)

    row = pipeline.store.get(sink_id, 31)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None
    assert write_location_exists(pre)
    assert coordinator.commit(sink_id, 31).outcome is CommitOutcome.COMMITTED


def test_files_lost_is_refused_once_a_table_shows_the_epoch(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, branch: str
) -> None:
    pipeline.create_table("t")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = _decided(pipeline, sink_id, faults, branch, 32, at="commit.visible")  # visible, not yet recorded
    _lose_a_file(pre)

    with pytest.raises(AbortRefused, match="already show the epoch"):
        coordinator.abort(sink_id, 32, reason="lifecycle rule", files_lost=True)

    row = pipeline.store.get(sink_id, 32)
    assert row is not None and row.status is EpochStatus.PENDING
    # The table shows the write (a file of it is lost there too): the commit is recorded, not repeated.
    assert coordinator.commit(sink_id, 32).outcome is CommitOutcome.COMMITTED
    assert pipeline.store.get(sink_id, 32).write_id == pre.write_id  # type: ignore[union-attr]


def test_a_file_sink_write_with_a_lost_staged_file_is_given_up_but_not_once_moves_began(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, tmp_path: Path
) -> None:
    coordinator = pipeline.coordinator(sink_id, pipeline.file_committer(tmp_path / "sink"))
    lost_one = pipeline.write_files(sink_id, 33, tmp_path / "sink")
    moved_one = pipeline.write_files(sink_id, 34, tmp_path / "sink")
    for epoch, pre in ((33, lost_one), (34, moved_one)):
        coordinator.persist(pre)
        pipeline.checkpoint(sink_id, epoch, COMPLETED)
    faults.crash_at("commit.decided")
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 33)
    faults.crash_at("files.after_move")
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 34)
    faults.disarm()
    _lose_a_file(lost_one)
    os.remove(local_path(moved_one.tables[0].data_files[-1].path))

    assert coordinator.abort(sink_id, 33, reason="disk replaced", files_lost=True).outcome is AbortOutcome.ABORTED
    assert not write_location_exists(lost_one) and write_location_exists(moved_one)
    with pytest.raises(AbortRefused, match="partly visible"):
        coordinator.abort(sink_id, 34, reason="disk replaced", files_lost=True)
    row = pipeline.store.get(sink_id, 34)
    assert row is not None and row.status is EpochStatus.PENDING
