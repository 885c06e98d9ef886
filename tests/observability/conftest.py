"""The Airflow tests here run on the Airflow suite's set-up (a private AIRFLOW_HOME set before anything
imports Airflow, its fixtures ``airflow_home``, ``world``, ``unique``); the core metrics tests need none."""

from __future__ import annotations

import datetime as dt
import socket
import uuid

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, epoch_from_interval_start
from tests.support.airflow_world import World, run

__all__ = ["DAY", "run_epoch_then_recover"]

DAY = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)


def run_epoch_then_recover(world: World, dag_prefix: str) -> int:
    """One real epoch of 6 rows committed by ``dag.test()``, then a second epoch left Pending (its
    checkpoint never completes) and the recovery task: every metric the provider sends, commit
    counters and timers as well as the recovery's Pending gauges. Returns the committed epoch."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    from airflow_provider_exactly_once.recovery.sink import recover_sink
    from airflow_provider_exactly_once.task_groups import exactly_once_epoch

    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    sink = world.iceberg_sink()
    with DAG(
        f"{dag_prefix}_{uuid.uuid4().hex[:8]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        write = PythonOperator(task_id="write", python_callable=world.writer(sink, rows=6))
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id="eo",
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=0,
        )

    assert run(dag, DAY).state == "success"
    pending = world.pipeline.write_iceberg(world.sink_id, epoch + 1, ["events"], rows=2)
    world.pipeline.coordinator(world.sink_id, world.pipeline.iceberg_committer()).persist(pending)
    report = recover_sink(world.pipeline.store, world.sink_id, holder=f"test@{socket.gethostname()}")
    assert report.waiting == [epoch + 1]
    return epoch
