"""first-pipeline.md's ``orders`` DAG with a plain Python write in place of Spark: the same timetable,
checkpoint and task group, so its runs, data intervals and epochs are the tutorial's. Copied into
the test's DAGs folder; the paths come from the environment the test gives Airflow."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once import IcebergSinkConfig, MarkerFileCheckpoint, exactly_once_epoch

LANDING = os.environ["AIRFLOW_HOME"] + "/landing"
DAY_DIR = LANDING + "/{start:%Y/%m/%d}"
SINK = IcebergSinkConfig("orders", ("shop.orders",))
CHECKPOINT = MarkerFileCheckpoint(DAY_DIR)
#: For the scheduler: catch up on the two days of the test, and no later one.
CATCHUP = os.environ.get("EO_DOC_CATCHUP") == "1"


def write(**context: Any) -> dict[str, Any]:
    """One row per landed order of the run's day, as Parquet files in the write's own location."""
    from airflow_provider_exactly_once.runtime.assembly import run_epoch
    from tests.support.pipeline import Pipeline

    start = context["data_interval_start"]
    day = Path(LANDING, f"{start:%Y/%m/%d}", "part-0.json")
    orders = [json.loads(line) for line in day.read_text(encoding="utf-8").splitlines() if line.strip()]
    home = os.environ["AIRFLOW_HOME"]
    pipeline = Pipeline(
        meta_url=f"sqlite:///{home}/writer-scratch.db",  # the writer's own; the tasks use the default store
        catalog_url=f"sqlite:///{home}/catalog.db",
        warehouse=Path(home, "warehouse"),
        catalog_name="iceberg_default",
        namespace="shop",
    )
    try:
        epoch = run_epoch(context, SINK.sink_id, "exactly_once_default")
        return pipeline.write_iceberg(SINK.sink_id, epoch, ["orders"], len(orders)).model_dump(mode="json")
    finally:
        pipeline.dispose()


with DAG(
    "orders",
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=dt.datetime(2024, 5, 31, tzinfo=dt.UTC),
    catchup=CATCHUP,
    end_date=dt.datetime(2024, 6, 1, tzinfo=dt.UTC) if CATCHUP else None,
    max_active_runs=1,
):
    exactly_once_epoch(
        PythonOperator(task_id="write", python_callable=write),
        sink=SINK,
        checkpoint=CHECKPOINT,
        sensor_kwargs={"poke_interval": 1, "timeout": 60},
    )
