"""The recovery DAG in real runs (``dag.test()``) after a crash, on an Iceberg sink and a file sink
sharing one meta store: every half-done epoch ends committed once or aborted with its files gone,
orphaned write locations past the grace period are removed and younger ones kept."""

from __future__ import annotations

import datetime as dt
import runpy
import shutil
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.recovery import SinkLocked, recover_sink
from airflow_provider_exactly_once.recovery.dag import recovery_dag
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig
from tests.recovery.helpers import (
    E0,
    E1,
    E2,
    E3,
    GRACE,
    Leftovers,
    exists,
    leave_crash,
    mapped_tis,
    mapped_xcom,
)
from tests.support.airflow_world import TABLE, World, run
from tests.support.pipeline import local_path

#: The DAG file a deployment copies into its DAGs folder.
RECOVERY_DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "exactly_once_recovery.py"


def _sinks(world: World) -> tuple[IcebergSinkConfig, FileSinkConfig]:
    iceberg = world.iceberg_sink()
    files = FileSinkConfig(f"{world.sink_id}-files", str(world.tmp / "files"))
    return iceberg, files


def _assert_recovered(world: World, left: Leftovers, report: dict[str, object]) -> None:
    store = world.pipeline.store
    sink_id = left.sink.sink_id
    status = {e: store.get(sink_id, e).status for e in (E0, E1, E2, E3)}  # type: ignore[union-attr]
    assert status == {
        E0: EpochStatus.COMMITTED,
        E1: EpochStatus.COMMITTED,
        E2: EpochStatus.ABORTED,
        E3: EpochStatus.ABORTED,
    }
    assert report["committed"] == [E1] and report["aborted"] == [E2] and report["waiting"] == []
    assert report["failed"] == {} and report["ok"] is True
    assert report["orphans_removed"] == [left.old_orphan.write_id]
    assert report["orphans_kept"] == [left.young_orphan.write_id]
    assert not exists(left.pending_failed) and not exists(left.aborted_with_files) and not exists(left.old_orphan)
    assert exists(left.young_orphan), "a write younger than the grace period may still be in flight"
    assert store.cleanups(sink_id) == []


def test_recovery_dag_finishes_a_crash_on_two_sinks(world: World, unique: str) -> None:
    iceberg, files = _sinks(world)
    ice_left, file_left = leave_crash(world, iceberg), leave_crash(world, files)

    dag = recovery_dag(f"eo_recovery_{unique}", schedule=None, meta_conn_id=world.meta_conn_id, orphan_grace=GRACE)
    dr = run(dag, None)
    assert str(dr.state) == "success"
    tis = mapped_tis(dag.dag_id, dr.run_id, "recover_sink")
    assert {sink: state for sink, (state, _) in tis.items()} == {
        iceberg.sink_id: "success",
        files.sink_id: "success",
    }, "one mapped task per registered sink, shown by sink id"

    ice_report = mapped_xcom(dag.dag_id, dr.run_id, "recover_sink", tis[iceberg.sink_id][1])
    file_report = mapped_xcom(dag.dag_id, dr.run_id, "recover_sink", tis[files.sink_id][1])
    _assert_recovered(world, ice_left, ice_report)
    _assert_recovered(world, file_left, file_report)

    # Iceberg: each committed epoch exactly once, with its own write's rows; committed writes' files stay.
    assert world.markers() == {E0: [ice_left.committed.write_id], E1: [ice_left.pending_completed.write_id]}
    assert {w for _, _, w in world.rows()} == {ice_left.committed.write_id, ice_left.pending_completed.write_id}
    assert exists(ice_left.committed) and exists(ice_left.pending_completed)
    # Files: the committed epochs' final names, nothing else outside the staging area.
    finals = sorted(p.name for p in Path(files.root).glob("*.parquet"))
    assert finals == sorted(f"{e}-{n}-0.parquet" for e in (E0, E1) for n in ("0", "1"))
    staging = sorted(p.name for p in (Path(files.root) / "_staging").iterdir())
    assert staging == [file_left.young_orphan.write_id]

    # A second run finds nothing to do and changes nothing.
    again = run(dag, None)
    assert str(again.state) == "success"
    tis = mapped_tis(dag.dag_id, again.run_id, "recover_sink")
    for sink_id, (_, index) in tis.items():
        report = mapped_xcom(dag.dag_id, again.run_id, "recover_sink", index)
        assert (report["committed"], report["aborted"], report["orphans_removed"], report["files_deleted"]) == (
            [],
            [],
            [],
            0,
        ), sink_id
    assert world.markers() == {E0: [ice_left.committed.write_id], E1: [ice_left.pending_completed.write_id]}


def test_a_sink_that_cannot_be_recovered_fails_its_own_task(world: World, unique: str) -> None:
    iceberg, files = _sinks(world)
    pipeline = world.pipeline
    # The file sink's Pending epoch lost its staged files: it can never be committed.
    broken = pipeline.write_files(files.sink_id, E1, Path(files.root))
    pipeline.coordinator(files.sink_id, pipeline.file_committer(Path(files.root))).persist(broken)
    shutil.rmtree(local_path(broken.tables[0].location))
    pipeline.checkpoint(files.sink_id, E1, CheckpointStatus.COMPLETED)
    # The Iceberg sink's is fine.
    good = pipeline.write_iceberg(iceberg.sink_id, E1, [TABLE])
    pipeline.coordinator(iceberg.sink_id, pipeline.iceberg_committer()).persist(good)
    pipeline.checkpoint(iceberg.sink_id, E1, CheckpointStatus.COMPLETED)
    for sink in (iceberg, files):
        pipeline.store.registry.register_sink(
            sink.sink_id, sink.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
        )

    dag = recovery_dag(f"eo_recovery_{unique}", schedule=None, meta_conn_id=world.meta_conn_id, orphan_grace=GRACE)
    dr = run(dag, None)
    assert str(dr.state) == "failed"
    tis = mapped_tis(dag.dag_id, dr.run_id, "recover_sink")
    assert {sink: state for sink, (state, _) in tis.items()} == {iceberg.sink_id: "success", files.sink_id: "failed"}
    assert world.markers() == {E1: [good.write_id]}, "the other sink was still recovered"
    row = pipeline.store.get(files.sink_id, E1)
    assert row is not None and row.status is EpochStatus.PENDING
    assert row.error is not None and "MissingDataFiles" in row.error


def test_the_sink_lock_keeps_a_second_recovery_out(world: World) -> None:
    iceberg, _ = _sinks(world)
    left = leave_crash(world, iceberg)
    store = world.pipeline.store
    assert store.registry.acquire_sink_lock(iceberg.sink_id, "another-recovery", ttl=timedelta(minutes=5))[0]
    with pytest.raises(SinkLocked, match="another-recovery"):
        recover_sink(store, iceberg.sink_id, holder="me", orphan_grace=GRACE)
    row = store.get(iceberg.sink_id, E1)
    assert row is not None and row.status is EpochStatus.PENDING, "nothing was done without the lock"
    assert exists(left.old_orphan)

    assert store.registry.release_sink_lock(iceberg.sink_id, "another-recovery")
    report = recover_sink(store, iceberg.sink_id, holder="me", orphan_grace=GRACE)
    assert report.ok and report.committed == [E1] and report.orphans_removed == [left.old_orphan.write_id]
    assert store.registry.acquire_sink_lock(iceberg.sink_id, "next", ttl=timedelta(minutes=5))[0], "released after use"


def test_recovery_racing_the_commit_task_commits_once(world: World) -> None:
    iceberg, _ = _sinks(world)
    pipeline = world.pipeline
    pre = pipeline.write_iceberg(iceberg.sink_id, E1, [TABLE])
    pipeline.coordinator(iceberg.sink_id, pipeline.iceberg_committer()).persist(pre)
    pipeline.checkpoint(iceberg.sink_id, E1, CheckpointStatus.COMPLETED)
    pipeline.store.registry.register_sink(iceberg.sink_id, iceberg.model_dump(mode="json"), None)

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def commit_task() -> None:  # what CommitEpochOperator runs, without the recovery lock
        try:
            barrier.wait()
            pipeline.coordinator(iceberg.sink_id, pipeline.iceberg_committer()).commit(iceberg.sink_id, E1)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=commit_task)
    thread.start()
    barrier.wait()
    report = recover_sink(pipeline.store, iceberg.sink_id, holder=f"race-{uuid.uuid4()}", orphan_grace=GRACE)
    thread.join()
    assert errors == [] and report.ok
    assert world.markers() == {E1: [pre.write_id]}
    row = pipeline.store.get(iceberg.sink_id, E1)
    assert row is not None and row.status is EpochStatus.COMMITTED


def test_epoch_operators_register_their_sink(world: World) -> None:
    from tests.task_groups.test_epoch_dags import DAY, epoch_dag

    sink = world.iceberg_sink()
    dag = epoch_dag(world, sink, mark_checkpoint=True)
    dr = run(dag, DAY + dt.timedelta(days=1))
    assert str(dr.state) == "success"
    registered = world.pipeline.store.registry.registered_sink(sink.sink_id)
    assert registered == (sink.model_dump(mode="json"), world.checkpoint().model_dump(mode="json"))


def test_a_location_the_table_references_is_never_removed_as_an_orphan(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 4 does not rest on the orphan scan: with the store "forgetting" every write, its
    enqueue still refuses live writes; with that check bypassed too, the Iceberg committer's own
    check refuses to delete a location the table references."""
    iceberg, _ = _sinks(world)
    left = leave_crash(world, iceberg)
    store = world.pipeline.store
    monkeypatch.setattr(store.registry, "known_writes", lambda sink_id, write_ids: set())
    report = recover_sink(store, iceberg.sink_id, holder="forgetful", orphan_grace=GRACE)
    assert report.ok, report.failed
    assert sorted(report.orphans_removed) == sorted([left.old_orphan.write_id, left.aborted_with_files.write_id])
    assert exists(left.committed) and exists(left.pending_completed)

    monkeypatch.setattr(
        store.registry,
        "enqueue_orphan_cleanup",
        lambda pre, *, reason, written_since: store.enqueue_cleanup(pre, reason=reason),
    )
    report = recover_sink(store, iceberg.sink_id, holder="forgetful", orphan_grace=GRACE)
    for write in (left.committed, left.pending_completed):
        assert "references" in report.failed[f"orphan {write.write_id}"]
        assert exists(write)
    assert world.markers() == {E0: [left.committed.write_id], E1: [left.pending_completed.write_id]}
    assert {w for _, _, w in world.rows()} == {left.committed.write_id, left.pending_completed.write_id}


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("history_retention_days", "1e12"),
        ("history_retention_days", "inf"),
        ("history_retention_days", "0"),
        ("history_retention_days", "-1"),
        ("history_retention_days", "abc"),
        ("recovery_orphan_grace_seconds", "nan"),
        ("recovery_orphan_grace_seconds", "1e300"),
        ("recovery_orphan_grace_seconds", "-1"),
        ("recovery_orphan_grace_seconds", "abc"),
        ("recovery_orphan_grace_seconds", "9" * 100_000),
    ],
)
def test_the_recovery_dag_file_refuses_an_absurd_setting_in_one_line_naming_it(
    option: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a bare ``OverflowError`` from ``timedelta``: the option, its variable and what it takes."""
    monkeypatch.setenv(f"AIRFLOW__EXACTLY_ONCE__{option.upper()}", value)
    with pytest.raises(ValueError) as refused:
        runpy.run_path(str(RECOVERY_DAG_FILE))
    message = str(refused.value)
    assert type(refused.value) is ValueError, repr(refused.value)
    assert message.startswith(f"[exactly_once] {option} (AIRFLOW__EXACTLY_ONCE__{option.upper()}) = ")
    assert "give a number of" in message and "up to" in message
    assert "\n" not in message and len(message) < 300


def test_the_recovery_dag_takes_the_settings_it_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__HISTORY_RETENTION_DAYS", " 36500 ")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__RECOVERY_ORPHAN_GRACE_SECONDS", "0")
    recover = runpy.run_path(str(RECOVERY_DAG_FILE))["dag"].get_task("recover_sink")
    assert recover.partial_kwargs["history_retention"] == timedelta(days=36500)
    assert recover.partial_kwargs["orphan_grace"] == timedelta(0)
