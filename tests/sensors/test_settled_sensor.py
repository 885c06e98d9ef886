"""``CheckpointSettledSensor`` ahead of the write in real DAG runs: a FAILED checkpoint lets the write
run and the epoch's own wait abort it, so the meta store shows the aborted epoch and its reason."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.sensors import CheckpointSettledSensor
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from tests.support.airflow_world import World, run, ti_states
from tests.support.pipeline import write_location_exists

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def settled_dag(world: World) -> DAG:
    with DAG(
        f"eo_settled_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        sink = world.iceberg_sink()
        settled = CheckpointSettledSensor(
            task_id="settled",
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            poke_interval=0.2,
            timeout=30,
        )
        write = PythonOperator(task_id="write", python_callable=world.writer(sink))
        settled >> write
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id="eo",
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=0,
        )
    return dag


def test_a_failed_checkpoint_settles_and_the_epoch_is_aborted_with_its_write(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.FAILED)
    dag = settled_dag(world)

    dr = run(dag, DAY)

    states = ti_states(dag.dag_id, dr.run_id)
    assert states["settled"][0] == "success", "FAILED is settled: the sensor must not fail on it"
    assert states["write"][0] == "success"
    assert states["eo.wait_for_checkpoint"][0] == "failed"
    assert states["eo.abort"][0] == "success"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not write_location_exists(world.writes[0])
    assert world.rows() == []


def test_a_completed_checkpoint_settles_and_commits(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = settled_dag(world)

    dr = run(dag, DAY)

    assert dr.state == "success"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED


def test_pending_is_not_settled_and_the_log_names_the_interval_and_location(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    sensor = CheckpointSettledSensor(
        task_id="settled", sink=world.iceberg_sink(), checkpoint=world.checkpoint(), meta_conn_id=world.meta_conn_id
    )
    epoch = epoch_from_interval_start(DAY)
    context = {"data_interval_start": DAY, "data_interval_end": DAY + dt.timedelta(days=1)}
    assert sensor.poke(context) is False
    world.mark(epoch, CheckpointStatus.FAILED)
    assert sensor.poke(context) is True
    # the deferred path decides the same way
    sensor.execute_complete(context, {"status": "FAILED", "epoch": epoch})
    text = capsys.readouterr().out  # Airflow's task loggers write through structlog to stdout
    assert f"epoch {epoch} = [2024-03-01T00:00Z, 2024-03-02T00:00Z)" in text
    assert f"meta-store checkpoint {world.sink_id!r}" in text
