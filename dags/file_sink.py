"""Hourly events into a plain Parquet directory, exactly once per hour (the file sink).

Spark writes the hour's files under ``<root>/_staging/<write id>/`` (readers skip ``_`` folders);
the commit moves them to deterministic final names ``<root>/event_type=<v>/<epoch>-<writer>-<n>.parquet``.
A final name that exists is the proof its move happened, so a crash in the middle of the moves is
finished by the commit's retry or the recovery DAG, and no rerun can add a second copy of an hour.

Settings: ``EO_EXAMPLES_LANDING`` (as in ``hourly_events.py``), ``EO_EXAMPLES_FILE_SINK_ROOT``
(default ``$AIRFLOW_HOME/exactly_once_examples/events_parquet``), ``EO_EXAMPLES_SPARK_CONN_ID``,
``EO_EXAMPLES_META_CONN_ID``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once import (
    FileSinkConfig,
    FilesInput,
    MarkerFileCheckpoint,
    SparkWrite,
    exactly_once_epoch,
)

_HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
LANDING = os.environ.get("EO_EXAMPLES_LANDING", str(_HOME / "exactly_once_examples" / "landing" / "events"))
ROOT = os.environ.get("EO_EXAMPLES_FILE_SINK_ROOT", str(_HOME / "exactly_once_examples" / "events_parquet"))

HOUR_DIR = LANDING.rstrip("/") + "/{start:%Y/%m/%d/%H}"
#: A file sink has no table to declare: its one schema is the one Spark reads the hour with.
EVENT_SCHEMA = "event_id STRING, user_id BIGINT, event_type STRING, event_time TIMESTAMP, amount DOUBLE"
#: The directory is created by the first commit; there is nothing to set up beforehand.
SINK = FileSinkConfig("events-parquet", ROOT)


with DAG(
    "exactly_once_file_sink",
    description="Hourly events into a Parquet directory, exactly once per hour",
    # Runs cover the hour that just ended ([00:00, 01:00) runs at 01:00); "@hourly" alone would
    # give zero-length intervals in Airflow 3 and name each epoch after the run's own instant.
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=4,
    tags=["exactly-once", "example"],
    doc_md=__doc__,
) as dag:
    exactly_once_epoch(
        SparkWrite(
            FilesInput(format="json", path=HOUR_DIR, schema_ddl=EVENT_SCHEMA),
            conn_id=os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default"),
            partition_by=["event_type"],
            conf={
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.driver.memory": os.environ.get("EO_EXAMPLES_SPARK_DRIVER_MEMORY", "768m"),
                "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
            },
            retries=2,
            retry_delay=dt.timedelta(minutes=1),
        ),
        sink=SINK,
        checkpoint=MarkerFileCheckpoint(HOUR_DIR),
        # Reading the hour while files still arrive would commit a partial hour; a _FAILED hour
        # settles too, so the write runs and the epoch's wait aborts it, recorded in the meta store.
        wait_until_settled=True,
        meta_conn_id=os.environ.get("EO_EXAMPLES_META_CONN_ID"),
        group_id="events",
        sensor_kwargs={"poke_interval": 60, "timeout": 6 * 3600, "mode": "reschedule"},
    )
