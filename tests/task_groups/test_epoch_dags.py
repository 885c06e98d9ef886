"""The epoch task group in real DAG runs (``dag.test()``): every rerun, clear, retry and backfill
leaves each epoch in the sink exactly once, and aborted epochs leave nothing behind."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.operators import MarkCheckpointOperator
from airflow_provider_exactly_once.sinks.config import SinkConfig
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger
from tests.support.airflow_world import World, clear_and_resume, run, ti_states, xcom
from tests.support.pipeline import expected_rows, local_path, write_location_exists

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
G = "eo"  # the task group id used by these DAGs


def epoch_dag(
    world: World,
    sink: SinkConfig,
    *,
    schedule: Any = "@daily",
    checkpoint: Any = None,
    sensor_kwargs: dict[str, Any] | None = None,
    write_kwargs: dict[str, Any] | None = None,
    write_retries: int = 0,
    mark_checkpoint: bool = False,
) -> DAG:
    """write -> [persist -> wait -> commit | abort], optionally with an upstream that marks the checkpoint."""
    with DAG(
        f"eo_{uuid.uuid4().hex[:10]}",
        schedule=schedule,
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        default_args={"retries": 2, "retry_delay": dt.timedelta(0)},
    ) as dag:
        write = PythonOperator(
            task_id="write",
            python_callable=world.writer(sink, **(write_kwargs or {})),
            retries=write_retries,
            retry_delay=dt.timedelta(0),
        )
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=checkpoint or world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30, **(sensor_kwargs or {})},
            commit_retries=2,
            commit_retry_delay=dt.timedelta(0),
        )
        if mark_checkpoint:
            mark = MarkCheckpointOperator(
                task_id="upstream_done", sink_id=world.sink_id, status="COMPLETED", meta_conn_id=world.meta_conn_id
            )
            mark >> dag.task_dict[f"{G}.wait_for_checkpoint"]
    return dag


def committed_once(world: World, epoch: int) -> str:
    """Assert the epoch is Committed in the store and visible once in the table; its write id."""
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED, row
    # one marked snapshot per revision (a rerun of the interval replaces the epoch), the last one its write's
    markers = world.markers().get(epoch, [])
    assert len(markers) == row.revision + 1 and markers[-1] == row.write_id, (markers, row.revision)
    held = [r for r in world.rows() if r[1] == epoch]
    assert held == expected_rows([w for w in world.writes if w.write_id == row.write_id], world.table)
    assert held and {r[2] for r in held} == {row.write_id}
    return row.write_id


def test_happy_path_into_iceberg(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink())

    dr = run(dag, DAY)

    assert dr.state == "success"
    states = ti_states(dag.dag_id, dr.run_id)
    assert states[f"{G}.commit"][0] == "success" and states[f"{G}.abort"][0] == "skipped"
    write_id = committed_once(world, epoch)
    assert len(world.rows()) == 5
    assert xcom(dag.dag_id, dr.run_id, f"{G}.persist") == {
        "sink_id": world.sink_id,
        "epoch": epoch,
        "outcome": "persisted",
        "write_id": write_id,
        "persisted_write_id": write_id,
    }
    assert xcom(dag.dag_id, dr.run_id, f"{G}.commit")["outcome"] == "committed"


def test_failed_checkpoint_aborts_removes_files_and_fails_the_run(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.FAILED)
    dag = epoch_dag(world, world.iceberg_sink())

    dr = run(dag, DAY)

    assert dr.state == "failed"
    states = ti_states(dag.dag_id, dr.run_id)
    # FAILED is final: the sensor fails on its first try although the DAG's default is 2 retries.
    assert states[f"{G}.wait_for_checkpoint"] == ("failed", 1)
    assert states[f"{G}.abort"][0] == "success"
    assert states[f"{G}.commit"][0] == "upstream_failed"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.ABORTED
    [write] = world.writes
    assert not write_location_exists(write)
    assert world.rows() == [] and world.markers() == {}
    assert xcom(dag.dag_id, dr.run_id, f"{G}.abort")["outcome"] == "aborted"


def test_timed_out_checkpoint_aborts_and_a_clear_redoes_the_epoch(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    dag = epoch_dag(world, world.iceberg_sink(), sensor_kwargs={"timeout": 1.5})

    first = run(dag, DAY)

    assert first.state == "failed"
    assert ti_states(dag.dag_id, first.run_id)[f"{G}.wait_for_checkpoint"] == ("failed", 1)
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not write_location_exists(world.writes[0]) and world.rows() == []

    # The upstream catches up; clearing the whole run writes the epoch again with a new write.
    world.mark(epoch, CheckpointStatus.COMPLETED)
    second = clear_and_resume(dag, first.run_id, [t for t in dag.task_dict])

    assert second.state == "success"
    assert len(world.writes) == 2
    assert committed_once(world, epoch) == world.writes[1].write_id
    # The new write re-opened the Aborted row (the coordinator reports it as a replacement).
    assert xcom(dag.dag_id, first.run_id, f"{G}.persist")["outcome"] == "replaced an earlier write"


def test_rerun_of_a_successful_run_replaces_the_epoch_once(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink())

    first_run = run(dag, DAY)
    assert first_run.state == "success"
    again = run(dag, DAY)  # the same interval again: a deliberate rerun, a newer generation

    assert again.state == "success"
    first, second = world.writes
    assert first.generation is None and second.generation is None  # the test's writer stamps none
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == second.write_id
    assert world.markers()[epoch] == [first.write_id, second.write_id]  # one snapshot each, in order
    assert [r for r in world.rows() if r[1] == epoch] == expected_rows([second], world.table)
    assert xcom(dag.dag_id, again.run_id, f"{G}.persist")["outcome"].startswith("revision opened")
    assert xcom(dag.dag_id, again.run_id, f"{G}.commit")["outcome"] == "committed"
    assert row.revision == 1 and row.pre_commit.generation is not None
    table = world.pipeline.catalog.load_table(world.table)
    assert [s.summary.operation.value for s in table.snapshots() if s.summary] == ["append", "overwrite"]
    assert write_location_exists(first)  # still listed by the first snapshot: kept for time travel
    # the commit's asset events fire again, for the corrected data
    assert xcom(dag.dag_id, again.run_id, f"{G}.commit")["write_id"] == second.write_id


def test_rerun_of_a_kept_sink_changes_nothing(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    sink = world.iceberg_sink().model_copy(update={"on_reprocess": "keep"})
    dag = epoch_dag(world, sink)

    assert run(dag, DAY).state == "success"
    again = run(dag, DAY)

    assert again.state == "success"
    first, second = world.writes
    assert committed_once(world, epoch) == first.write_id
    persisted = xcom(dag.dag_id, again.run_id, f"{G}.persist")
    assert persisted["outcome"].startswith("kept") and "on_reprocess='keep'" in persisted["warning"]
    assert xcom(dag.dag_id, again.run_id, f"{G}.commit")["outcome"] == "already committed"
    assert not write_location_exists(second)  # the newer write was removed, never committed
    assert len(world.pipeline.catalog.load_table(world.table).snapshots()) == 1


def test_clear_of_only_the_commit_task_is_still_once(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink())
    dr = run(dag, DAY)
    assert dr.state == "success"

    again = clear_and_resume(dag, dr.run_id, [f"{G}.commit"])

    assert again.state == "success"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.commit"] == ("success", 2)
    assert xcom(dag.dag_id, dr.run_id, f"{G}.commit")["outcome"] == "already committed"
    assert len(world.writes) == 1
    committed_once(world, epoch)
    assert len(world.pipeline.catalog.load_table(world.table).snapshots()) == 1


def test_write_that_fails_once_then_succeeds_on_retry_is_once(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink(), write_kwargs={"fail_tries": (1,)}, write_retries=1)

    dr = run(dag, DAY)

    assert dr.state == "success"
    assert ti_states(dag.dag_id, dr.run_id)["write"] == ("success", 2)
    failed_try, retry = world.writes
    assert committed_once(world, epoch) == retry.write_id
    assert failed_try.write_id not in {r[2] for r in world.rows()}


def test_a_run_whose_write_failed_is_recorded_aborted_with_its_cause(world: World) -> None:
    """The abort says which task failed, on which try, with its error (design.md D22), and the
    epoch's history keeps each failed try of the write, though the write was never persisted."""
    epoch = epoch_from_interval_start(DAY)
    dag = epoch_dag(world, world.iceberg_sink(), write_kwargs={"fail_tries": (1, 2)}, write_retries=1)

    dr = run(dag, DAY)

    assert dr.state == "failed"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.abort"][0] == "success"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.ABORTED and not row.pre_commit.written
    cause = "write failed on try 2: RuntimeError: write try 2 fails on purpose after writing its files"
    assert row.dag_id == dag.dag_id and row.error == cause
    assert xcom(dag.dag_id, dr.run_id, f"{G}.abort")["outcome"] == "recorded Aborted: the run produced no write"
    history = world.pipeline.store.history.events(world.sink_id, epoch)
    events = [(e.event.value, e.actor.name, e.actor.try_number, e.reason) for e in history]
    assert events == [
        ("try failed", f"{dag.dag_id}.write", 1, "RuntimeError: write try 1 fails on purpose after writing its files"),
        ("error", f"{dag.dag_id}.write", 2, "RuntimeError: write try 2 fails on purpose after writing its files"),
        ("aborted unpersisted", f"{dag.dag_id}.{G}.abort", 1, cause),
        ("cleaned up", f"{dag.dag_id}.{G}.abort", 1, cause),
    ]


def test_backfill_out_of_order_commits_each_interval_once(world: World) -> None:
    dag = epoch_dag(
        world,
        world.iceberg_sink(),
        schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
        mark_checkpoint=True,
        write_kwargs={"compressed": True},  # the XCom form large writes use
    )
    days = [DAY + dt.timedelta(days=n) for n in (2, 0, 1, 0)]  # out of order, one interval twice

    runs = [run(dag, day) for day in days]

    assert [r.state for r in runs] == ["success"] * 4
    epochs = [epoch_from_interval_start(r.data_interval_start) for r in runs]
    assert len(set(epochs)) == 3 and epochs[1] == epochs[3]
    for epoch in set(epochs):
        committed_once(world, epoch)
    assert sorted(world.markers()) == sorted(set(epochs))
    assert len(world.rows()) == 3 * 5


def test_manual_runs_without_a_data_interval_get_an_allocated_epoch(world: World) -> None:
    dag = epoch_dag(world, world.iceberg_sink(), schedule=None, mark_checkpoint=True)

    seen = []
    for _ in range(2):
        dr = run(dag, None)  # dag.test() replaces the previous run without a logical date: check each now
        assert dr.state == "success" and dr.data_interval_start is None
        # Every task of the run arrived at the run's allocated epoch: the write, the checkpoint
        # mark, the sensor, persist and commit.
        epoch = world.pipeline.store.epochs.allocate_epoch(world.sink_id, dr.run_id)
        assert xcom(dag.dag_id, dr.run_id, f"{G}.commit")["epoch"] == epoch
        assert xcom(dag.dag_id, dr.run_id, "upstream_done")["epoch"] == epoch
        committed_once(world, epoch)
        seen.append(epoch)
    assert seen[0] != seen[1]


def test_file_sink_through_the_same_task_group(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    checkpoints = world.tmp / "checkpoints"
    checkpoint = MarkerFileCheckpoint(path_template=f"{checkpoints}/{{epoch}}")
    (checkpoints / str(epoch)).mkdir(parents=True)
    (checkpoints / str(epoch) / "_SUCCESS").touch()
    sink = world.file_sink()
    dag = epoch_dag(world, sink, checkpoint=checkpoint)

    first = run(dag, DAY)
    second = run(dag, DAY)  # a rerun: the late write must not add files

    assert (first.state, second.state) == ("success", "success")
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == world.writes[0].write_id
    root = Path(sink.root)
    finals = sorted(p for p in root.rglob("*.parquet") if "_staging" not in p.parts)
    assert len(finals) == 2 and all(p.name.startswith(f"{epoch}-") for p in finals)
    visible = sorted((r["id"], r["epoch"], r["write_id"]) for p in finals for r in pq.read_table(p).to_pylist())
    assert visible == [(epoch * 1_000_000 + n, epoch, world.writes[0].write_id) for n in range(5)]
    assert not any(Path(local_path(t.location)).exists() for w in world.writes for t in w.tables)


def test_deferrable_sensor_waits_in_the_trigger_until_the_checkpoint_completes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = epoch_from_interval_start(DAY)
    dag = epoch_dag(world, world.iceberg_sink(), sensor_kwargs={"deferrable": True, "timeout": 60})
    started: list[tuple[str, dict[str, Any]]] = []
    real_run = CheckpointTrigger.run

    async def observed_run(self: CheckpointTrigger) -> Any:
        started.append(self.serialize())  # the real trigger, rebuilt by dag.test from its serialized form
        async for event in real_run(self):
            yield event

    monkeypatch.setattr(CheckpointTrigger, "run", observed_run)

    def upstream() -> None:  # completes the checkpoint only once the sensor is deferred
        deadline = time.monotonic() + 60
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        world.mark(epoch, CheckpointStatus.COMPLETED)

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    dr = run(dag, DAY)
    thread.join(5)

    assert dr.state == "success"
    [(classpath, kwargs)] = started
    assert classpath == "airflow_provider_exactly_once.triggers.checkpoint.CheckpointTrigger"
    assert kwargs["epoch"] == epoch and kwargs["sink_id"] == world.sink_id
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.wait_for_checkpoint"] == ("success", 1)
    committed_once(world, epoch)


def test_deferrable_sensor_fails_without_retries_when_the_checkpoint_fails_while_deferred(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = epoch_from_interval_start(DAY)
    dag = epoch_dag(world, world.iceberg_sink(), sensor_kwargs={"deferrable": True, "timeout": 60})
    timer = threading.Timer(1.5, world.mark, (epoch, CheckpointStatus.FAILED))
    timer.start()

    dr = run(dag, DAY)
    timer.join()

    assert dr.state == "failed"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.wait_for_checkpoint"] == ("failed", 1)
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not write_location_exists(world.writes[0])


def test_abort_refused_for_a_completed_checkpoint_is_reported_not_failed(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    # An earlier attempt persisted a write and the checkpoint completed; this run's write fails.
    earlier = world.pipeline.write_iceberg(world.sink_id, epoch, ["events"])
    world.pipeline.coordinator(world.sink_id, world.pipeline.iceberg_committer()).persist(earlier)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink(), write_kwargs={"fail_tries": (1,)})

    dr = run(dag, DAY)

    assert dr.state == "failed"  # the epoch was not committed in this run, and the UI shows it
    states = ti_states(dag.dag_id, dr.run_id)
    assert states[f"{G}.abort"] == ("success", 1)
    summary = xcom(dag.dag_id, dr.run_id, f"{G}.abort")
    assert summary["outcome"] == "refused" and "COMPLETED" in summary["refused_because"]
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.PENDING and row.write_id == earlier.write_id
    assert write_location_exists(earlier)  # nothing of a write that must be committed was deleted


def test_mark_checkpoint_operator_records_final_statuses(world: World) -> None:
    with DAG(
        f"mark_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        default_args={"retries": 2, "retry_delay": dt.timedelta(0)},
    ) as dag:
        by_name = MarkCheckpointOperator(
            task_id="by_name", checkpoint_name="orders-ingest", status="COMPLETED", meta_conn_id=world.meta_conn_id
        )
        by_sink = MarkCheckpointOperator(
            task_id="by_sink", sink_id=world.sink_id, status=CheckpointStatus.COMPLETED, meta_conn_id=world.meta_conn_id
        )
        contradiction = MarkCheckpointOperator(
            task_id="contradiction", sink_id=world.sink_id, status="FAILED", meta_conn_id=world.meta_conn_id
        )
        by_name >> by_sink >> contradiction

    dr = run(dag, DAY)

    epoch = epoch_from_interval_start(DAY)
    store = world.pipeline.store
    assert store.checkpoints.get_checkpoint("orders-ingest", epoch) is CheckpointStatus.COMPLETED
    assert store.checkpoints.get_checkpoint(world.sink_id, epoch) is CheckpointStatus.COMPLETED  # final: not moved
    states = ti_states(dag.dag_id, dr.run_id)
    assert states["by_sink"] == ("success", 1)
    assert states["contradiction"] == ("failed", 1)  # a refusal, not retried
    assert dr.state == "failed"
    assert xcom(dag.dag_id, dr.run_id, "by_name") == {
        "checkpoint": "orders-ingest",
        "epoch": epoch,
        "status": "COMPLETED",
    }


@pytest.mark.postgres
def test_happy_path_with_the_meta_store_and_catalog_on_postgresql(
    airflow_home: Path, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World.create(tmp_path, monkeypatch, meta_url=pg_url, catalog_url=pg_url)
    try:
        epoch = epoch_from_interval_start(DAY)
        world.mark(epoch, CheckpointStatus.COMPLETED)
        dag = epoch_dag(world, world.iceberg_sink())

        assert run(dag, DAY).state == "success"
        assert run(dag, DAY).state == "success"  # and a rerun, which replaces the epoch

        assert committed_once(world, epoch) == world.writes[1].write_id
        assert len(world.rows()) == 5
    finally:
        world.dispose()


def bare_epoch_dag(world: World, *, schedule: Any = None, **group_kwargs: Any) -> DAG:
    """write -> the epoch group, in a DAG that gives no task retries of its own (no ``default_args``):
    whatever retries the group's tasks have are the group's."""
    with DAG(
        f"eo_{uuid.uuid4().hex[:10]}",
        schedule=schedule,
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        write = PythonOperator(task_id="write", python_callable=world.writer(world.iceberg_sink()))
        exactly_once_epoch(
            write,
            sink=world.iceberg_sink(),
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            **group_kwargs,
        )
    return dag


def test_persist_is_retried_like_commit_and_abort(world: World) -> None:
    """Found building the fault harness (meta_store_outage): persist had no retries of its own, so in a DAG
    without default retries a meta store restarting during persist failed the run into its abort,
    which dropped an epoch whose checkpoint had completed. Persist is idempotent: it is retried."""
    dag = bare_epoch_dag(world, commit_retries=5, commit_retry_delay=dt.timedelta(seconds=7))
    for task_id in ("persist", "commit", "abort"):
        task = dag.task_dict[f"{G}.{task_id}"]
        assert (task.retries, task.retry_delay, task.retry_exponential_backoff) == (
            5,
            dt.timedelta(seconds=7),
            True,
        ), task_id
    assert dag.task_dict["write"].retries == 0  # the DAG's own default: nothing else was given retries


def test_a_sensor_whose_worker_died_is_retried_not_aborted(world: World) -> None:
    """Found by the fault harness (kill_sensor_wait): the sensor had no retries of its own, so in a DAG
    without default retries a worker lost while the sensor waited failed the run into its abort, which
    dropped an epoch whose checkpoint was only pending. The wait is retried like persist and commit;
    a failed checkpoint still fails it at once (``test_failed_checkpoint_aborts...``)."""

    def worker_lost_on_first_try(context: Any) -> None:
        if context["ti"].try_number == 1:
            raise RuntimeError("the worker running the sensor was lost")

    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = bare_epoch_dag(
        world,
        schedule="@daily",
        sensor_kwargs={"poke_interval": 0.2, "timeout": 30, "pre_execute": worker_lost_on_first_try},
        commit_retries=2,
        commit_retry_delay=dt.timedelta(0),
    )
    sensor = dag.task_dict[f"{G}.wait_for_checkpoint"]
    assert (sensor.retries, sensor.retry_delay) == (2, dt.timedelta(0))

    dr = run(dag, DAY)

    states = ti_states(dag.dag_id, dr.run_id)
    assert dr.state == "success", states
    assert states[f"{G}.wait_for_checkpoint"] == ("success", 2)
    assert states[f"{G}.abort"][0] == "skipped"
    committed_once(world, epoch)


def test_sensor_kwargs_retries_win_over_the_group_default(world: World) -> None:
    dag = bare_epoch_dag(world, sensor_kwargs={"retries": 0})
    assert dag.task_dict[f"{G}.wait_for_checkpoint"].retries == 0
    assert dag.task_dict[f"{G}.commit"].retries == 8
