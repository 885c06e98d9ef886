"""The harness pipeline: the example pipeline (``dags/hourly_events.py``) parameterised for fault runs.

One DAG per scenario, built by ``build(params)`` from a one-line DAG file the harness writes into
the cluster's DAGs folder. The differences from the example, each for a reason:

- hourly intervals from ``start`` with ``catchup`` and an ``end_date``: the scheduler creates every
  epoch at once instead of one per hour of wall time;
- ``writer="light"`` (the default) writes each epoch's real Parquet files with pyarrow and describes
  them with the same ``describe_parquet_file`` the Spark writer uses, without a JVM (a Spark write
  costs 15-30 s here); ``writer="spark"`` is the example's ``SparkPreCommitOperator`` through real
  ``spark-submit``, used by the scenarios that kill the Spark write; ``writer="connect"`` is the same
  operator on the connection ``SPARK_CONNECT_CONN_ID`` (type ``spark_connect``) to the stack's Spark
  Connect server, and with ``write_pause_s`` reads the hour slowly (``spark_input``), for the
  scenarios that kill that server under a write;
- the light writer reaches the fault point ``write.files_written`` (after its files exist, before
  it returns them), so a plan can kill a write that left files behind;
- no settled gate (``wait_until_settled``) before the write: the harness lands every hour's files before the run
  and only the markers arrive late, so the epoch's own sensor is the one that waits;
- short retry delays and poke intervals, so that recovery from a fault takes seconds;
- an unpartitioned table (partitioning is not what the harness tests);
- ``tables``: more than one makes a fan-out: the light write puts the hour's rows into each table,
  and the commit reaches them together (one catalog transaction where the connection takes one:
  the production stack's, ``stacks``);
- ``mode="upsert"``: an upsert sink whose light write applies each hour's changes copy-on-write
  (``upsert_pipeline``); the Spark writers apply them as the product's upsert job does;
- ``audited``: write, audit, publish (design.md D23): the epoch group gets ``audit=`` one
  ``SqlCheck`` over ``epoch_rows`` (``bad_hours_check``) that fails for the hours the harness lands
  as bad (``bad_epochs``), so the checker knows which epochs must never be on ``main``;
- ``mode="incremental"``: a sink reading the upstream Iceberg table ``upstream`` incrementally
  (``IcebergTableInput``, checkpoint ``SnapshotRangeCheckpoint``, one run at a time), its light
  write ``incremental_pipeline.light_incremental_write``, its ``writer="spark"`` the product's
  ``SparkPreCommitOperator`` on that input; the landed hours play no part.

This module imports Airflow: only the DAG files of the cluster import it, never the harness.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint, SnapshotRangeCheckpoint
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from fault_harness.incremental_pipeline import light_incremental_write
from fault_harness.layout import SPARK_CONNECT_CONN_ID, WRITE_POINT, hour_template, write_starts
from fault_harness.runs import running_write
from fault_harness.upsert_changes import OP_COLUMN, ORDER_BY
from fault_harness.upsert_pipeline import light_upsert_write, upsert_sink

EVENT_SCHEMA_DDL = "event_id STRING, user_id BIGINT, event_type STRING, event_time TIMESTAMP, amount DOUBLE"


def light_write(sink_id: str, table_names: list[str], landing: str, conn_id: str) -> dict[str, Any]:
    """One epoch's write without Spark: the hour's JSON lines as one real Parquet file with Iceberg
    field ids per table (a fan-out writes the same rows into each), in the write's own location,
    returned as pre-commit metadata (nothing visible).

    The files go through each table's own FileIO (``table.io``), which carries the catalog's storage
    properties: the write lands where the table lives, local disk or S3, as a real writer's would."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
    from demo.fault_plan import fault_hook_for
    from fault_harness.table_writes import write_data_file

    start, epoch, attempt, tables = running_write(conn_id, table_names)
    write_id = str(uuid.uuid4())
    hour = Path(hour_template(landing).format(start=start))
    rows: list[dict[str, Any]] = []
    for path in sorted(hour.glob("*.json")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                event = json.loads(line)
                event["event_time"] = dt.datetime.fromisoformat(event["event_time"])
                rows.append(event)
    writes = []
    for name, table in zip(table_names, tables, strict=True):
        location = f"{table.location().rstrip('/')}/data/_eo/{write_id}"
        descriptors = []
        if rows:
            arrow_schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
            file_path = f"{location}/part-00000-{attempt}.parquet"
            descriptors.append(write_data_file(table, file_path, pa.Table.from_pylist(rows, schema=arrow_schema)))
        writes.append(TableWrite(table=name, location=location, data_files=descriptors))
    fault_hook_for(sink_id, epoch, attempt)(WRITE_POINT)
    pre = PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=writes)
    value: dict[str, Any] = json.loads(pre.model_dump_json(exclude_defaults=True))
    return value


def bad_hours_check(bad_epochs: list[int]) -> Any:
    """An audited pipeline's check: the epoch's rows whose event time lies in a bad hour (epoch ms of
    its start). Every row of an hour lies in it, so the check fails for exactly the bad hours, on
    every try, whatever was killed before it ran."""
    from airflow_provider_exactly_once.sinks.config import SqlCheck

    hours = ", ".join(str(int(epoch) // 3_600_000) for epoch in bad_epochs) or "-1"
    return SqlCheck(
        name="harness_bad_hours",
        sql=f"select event_id from epoch_rows where floor(epoch(event_time) / 3600) in ({hours})",
        message="an hour the fault harness landed as bad",
    )


def spark_input(params: dict[str, Any], upsert: bool) -> Any:
    """The Spark writers' input: the hour's JSON lines (an upsert pipeline's with their operation and
    order columns); with ``write_pause_s``, the same rows through ``slow_input``, so that a scenario
    can kill the Spark under a running write."""
    from airflow_provider_exactly_once.spark.jobspec import FilesInput, FunctionInput

    ddl = EVENT_SCHEMA_DDL + (f", {OP_COLUMN} STRING, {ORDER_BY} BIGINT" if upsert else "")
    pause = float(params.get("write_pause_s", 0))
    if not pause:
        return FilesInput(format="json", path=hour_template(params["landing"]), schema_ddl=ddl)
    return FunctionInput(
        callable="fault_harness.slow_input:slow_hour",
        options={
            "path": hour_template(params["landing"]),
            "schema_ddl": ddl,
            "seconds_per_row": pause,
            "started": write_starts(params["landing"]),
        },
    )


def incremental_input(params: dict[str, Any]) -> Any:
    """The Spark writer's input of an incremental pipeline: the upstream table, on the sink's catalog."""
    from airflow_provider_exactly_once.spark.author_specs import IcebergTableInput

    if params.get("write_pause_s"):
        raise ValueError(f"{params['dag_id']}: an incremental pipeline's Spark write reads the upstream as it is")
    return IcebergTableInput(table=params["upstream"])


def build(params: dict[str, Any]) -> DAG:
    """The DAG of one scenario. ``params``: dag_id, sink_id, tables (the first the only one but in a
    fan-out), landing, start (ISO hour), epochs,
    writer (light|spark|connect), write_pause_s (``spark_input``), sensor (poke|reschedule|deferrable),
    conn_id, max_active_runs, mode (append|upsert: ``upsert_pipeline``, one run at a time|incremental:
    ``incremental_pipeline``, one run at a time, reading the table ``upstream``), audited and
    bad_epochs (``bad_hours_check``)."""
    dag_id, sink_id, tables, landing = params["dag_id"], params["sink_id"], params["tables"], params["landing"]
    table = tables[0]
    conn_id = params["conn_id"]
    start = dt.datetime.fromisoformat(params["start"])
    end = start + dt.timedelta(hours=int(params["epochs"]) - 1)
    mode = params.get("mode", "append")
    upsert, incremental = mode == "upsert", mode == "incremental"
    if (upsert or incremental) and int(params.get("max_active_runs", 1)) != 1:
        raise ValueError(f"{dag_id}: an {mode} pipeline runs one epoch at a time (max_active_runs=1), got {params}")
    sink = (
        upsert_sink(sink_id, table, conn_id)
        if upsert
        else IcebergSinkConfig(sink_id, tuple(tables), iceberg_conn_id=conn_id)
    )
    checkpoint: Any = SnapshotRangeCheckpoint() if incremental else MarkerFileCheckpoint(hour_template(landing))
    sensor = params.get("sensor", "poke")
    quick: dict[str, Any] = {"retries": 3, "retry_delay": dt.timedelta(seconds=3)}
    with DAG(
        dag_id,
        schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
        start_date=start,
        end_date=end,
        catchup=True,
        max_active_runs=int(params.get("max_active_runs", 3)),
        is_paused_upon_creation=False,
        render_template_as_native_obj=True,
        tags=["exactly-once", "fault-harness"],
    ) as dag:
        if (writer := params.get("writer", "light")) in ("spark", "connect"):
            from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator

            write: Any = SparkPreCommitOperator(
                task_id="transform",
                conn_id=SPARK_CONNECT_CONN_ID if writer == "connect" else "spark_default",
                sink=sink,
                input=incremental_input(params) if incremental else spark_input(params, upsert),
                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"},
                # Spaced out: on the production stack its tries share the S3 that catalog_restart
                # takes down for 20 s, and three quick retries of a spark-submit fit inside that.
                **{**quick, "retry_delay": dt.timedelta(seconds=15)},
            )
        else:
            light = task(task_id="transform", **quick)
            if upsert:
                write = light(light_upsert_write)(sink_id, table, landing, conn_id)
            elif incremental:
                write = light(light_incremental_write)(sink_id, table, params["upstream"], conn_id)
            else:
                write = light(light_write)(sink_id, tables, landing, conn_id)
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=checkpoint,
            group_id="events",
            sensor_kwargs={
                "poke_interval": 2,
                "timeout": 1800,
                "mode": "reschedule" if sensor == "reschedule" else "poke",
                "deferrable": sensor == "deferrable",
                # no retries here: the task group's default (commit_retries) is what kill_sensor_wait tests
            },
            commit_retries=6,
            commit_retry_delay=dt.timedelta(seconds=2),
            audit=[bad_hours_check(params.get("bad_epochs", []))] if params.get("audited") else None,
        )
    return dag
