"""Any Spark operator can write an epoch: the writer leaves the pre-commit in its write location, and
persist takes it from there when the write task returned none (``core/cleanups.py``).

Real DAG runs (``dag.test()``) with write tasks that are not ours: the Spark provider's own
``SparkSubmitOperator`` running the epoch writer application (a driver whose local files the task
never sees: the spec has no ``output_path``), and a ``@task`` running PySpark in-process that calls
``write_epoch``. Then the crash cases: a driver that died after leaving its pre-commit, and one that
died half way; the retry's write is the one committed, the others are orphans the scan finds.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.core.cleanups import scan_orphans
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.operators.spark_precommit import EPOCH_WRITER_APPLICATION
from airflow_provider_exactly_once.runtime.assembly import open_sink
from airflow_provider_exactly_once.sinks.layout import PRE_COMMIT_FILE, pre_commit_from_file
from airflow_provider_exactly_once.spark.epoch_writer import write_epoch
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from tests.spark.conftest import VENV_BIN, local
from tests.support.airflow_world import World, run, ti_states, xcom
from tests.support.independent_reader import read_rows

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
EPOCH = epoch_from_interval_start(DAY)
G = "eo"


def landed(world: World, rows: int) -> Path:
    """The epoch's input: ``rows`` rows in the table's columns."""
    landing = world.tmp / f"landing-{uuid.uuid4().hex[:6]}"
    landing.mkdir()
    ids = list(range(rows))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "epoch": pa.array([EPOCH] * rows, pa.int64()),
            "write_id": pa.array([f"row-{i}" for i in ids], pa.string()),
        }
    )
    pq.write_table(table, landing / "part-0.parquet")
    return landing


def spec_for(world: World, landing: Path) -> EpochJobSpec:
    """What a DAG author's own job would be given: no ``output_path``, a write id of its own."""
    return EpochJobSpec.model_validate(
        {
            "sink_id": world.sink_id,
            "epoch": EPOCH,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": DAY,
            "data_interval_end": DAY + dt.timedelta(days=1),
            "input": {"kind": "files", "format": "parquet", "path": str(landing)},
            "target": {
                "kind": "iceberg",
                "catalog_name": world.iceberg_conn_id,
                "catalog_properties": {
                    "type": "sql",
                    "uri": world.pipeline.catalog_url,
                    "warehouse": f"file://{world.pipeline.warehouse}",
                },
                "table": world.table,
            },
        }
    )


def epoch_dag(world: World, write: Any) -> DAG:
    exactly_once_epoch(
        write,
        sink=world.iceberg_sink(),
        checkpoint=world.checkpoint(),
        meta_conn_id=world.meta_conn_id,
        group_id=G,
        sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
    )
    dag: DAG = write.dag
    return dag


def new_dag(**kwargs: Any) -> DAG:
    return DAG(
        f"eo_foreign_{uuid.uuid4().hex[:8]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        **kwargs,
    )


def committed_rows(world: World) -> list[tuple[Any, ...]]:
    return sorted(read_rows(world.pipeline.catalog.load_table(world.table), "id, epoch"))


def test_the_spark_providers_own_operator_writes_an_epoch_persist_takes_from_its_write_location(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    monkeypatch.setenv("PATH", f"{VENV_BIN}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    world.mark(EPOCH, CheckpointStatus.COMPLETED)
    spec = spec_for(world, landed(world, 40))
    with new_dag() as dag:
        write = SparkSubmitOperator(
            task_id="write",
            conn_id="spark_local",
            application=EPOCH_WRITER_APPLICATION,
            application_args=[spec.to_json()],  # no output_path: the task never sees the driver's files
            conf={"spark.ui.enabled": "false", "spark.pyspark.python": sys.executable},
        )
        epoch_dag(world, write)

    dr = run(dag, DAY)

    assert dr.state == "success", ti_states(dag.dag_id, dr.run_id)
    assert xcom(dag.dag_id, dr.run_id, "write") is None  # the provider's operator returns nothing
    persisted = xcom(dag.dag_id, dr.run_id, f"{G}.persist")
    assert persisted["outcome"] == "persisted" and persisted["persisted_write_id"] == spec.write_id
    row = world.pipeline.store.get(world.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == spec.write_id
    assert committed_rows(world) == [(i, EPOCH) for i in range(40)]


def test_a_task_running_pyspark_in_process_writes_with_write_epoch_and_returns_nothing(
    spark: Any, world: World
) -> None:
    world.mark(EPOCH, CheckpointStatus.COMPLETED)
    spec = spec_for(world, landed(world, 25))

    def my_job() -> None:
        write_epoch(spark, spec)  # the author's own PySpark job: no XCom

    with new_dag() as dag:
        epoch_dag(world, PythonOperator(task_id="write", python_callable=my_job))

    dr = run(dag, DAY)

    assert dr.state == "success", ti_states(dag.dag_id, dr.run_id)
    left = Path(local(world.pipeline.catalog.load_table(world.table).location())) / "data/_eo" / spec.write_id
    assert PreCommit.from_json(pre_commit_from_file((left / PRE_COMMIT_FILE).read_bytes())).write_id == spec.write_id
    assert committed_rows(world) == [(i, EPOCH) for i in range(25)]


def test_a_retry_after_a_dead_driver_is_the_write_taken_and_the_others_are_orphans(spark: Any, world: World) -> None:
    """Try 1's driver died after leaving its pre-commit, try 2's half way (files, no pre-commit);
    try 3 finished. Persist takes try 3's write; the other two stay unknown to the store, and the
    orphan scan finds exactly them."""
    world.mark(EPOCH, CheckpointStatus.COMPLETED)
    landing = landed(world, 30)
    specs: list[EpochJobSpec] = []

    def my_job(ti: Any) -> None:
        spec = spec_for(world, landing)
        specs.append(spec)
        pre_commit = write_epoch(spark, spec)
        if ti.try_number == 2:
            (Path(local(pre_commit.tables[0].location)) / PRE_COMMIT_FILE).unlink()
        if ti.try_number < 3:
            raise RuntimeError(f"the driver of try {ti.try_number} died")

    with new_dag(default_args={"retry_delay": dt.timedelta(0)}) as dag:
        epoch_dag(world, PythonOperator(task_id="write", python_callable=my_job, retries=2))

    dr = run(dag, DAY)

    assert dr.state == "success", ti_states(dag.dag_id, dr.run_id)
    died, half, finished = (s.write_id for s in specs)
    row = world.pipeline.store.get(world.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == finished
    assert committed_rows(world) == [(i, EPOCH) for i in range(30)]
    old, young, error = scan_orphans(
        world.sink_id, open_sink(world.iceberg_sink()).write_folders, world.pipeline.store.registry, dt.timedelta(0)
    )
    assert error is None and not young
    assert sorted(c.write_id for c in old) == sorted([died, half])


def test_a_write_task_that_left_nothing_fails_persist_naming_what_to_do(world: World) -> None:
    world.mark(EPOCH, CheckpointStatus.COMPLETED)
    with new_dag() as dag:
        epoch_dag(world, PythonOperator(task_id="write", python_callable=lambda: None))

    dr = run(dag, DAY)

    assert dr.state == "failed"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.persist"][0] == "failed"
    row = world.pipeline.store.get(world.sink_id, EPOCH)
    assert row is None or row.status is not EpochStatus.COMMITTED
