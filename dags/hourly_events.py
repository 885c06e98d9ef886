"""Hourly event files into an Iceberg table, exactly once per hour.

An upstream lands JSON-lines event files per hour under ``<landing>/YYYY/MM/DD/HH/`` and writes
``_SUCCESS`` there when the hour is complete (``_FAILED`` when it gave up on it). Each hourly run
is one epoch: Spark reads the hour's files and writes them, invisibly, into
``examples.events`` (partitioned by ``day(event_time)``); the run persists the write, waits for
the hour's ``_SUCCESS`` and commits it as one snapshot. A retry, a clear or a backfill of any task
cannot add the hour twice, and a failed hour is aborted and leaves no file behind.

Settings come from the environment so the file imports without side effects anywhere; every one
has a default under ``$AIRFLOW_HOME``:

- ``EO_EXAMPLES_LANDING``: the landing root (default ``$AIRFLOW_HOME/exactly_once_examples/landing/events``)
- ``EO_EXAMPLES_ICEBERG_CONN_ID``: the Iceberg connection (default ``iceberg_default``); its extra
  holds the pyiceberg catalog properties, which the write hands to Spark when it runs
- ``EO_EXAMPLES_SPARK_CONN_ID``: the Spark connection (default ``spark_default``)
- ``EO_EXAMPLES_STORAGE_CONN_ID``: an ``aws`` connection for a landing root on S3 (default none: local
  files, or the environment's credentials); the checkpoint markers are read through it
- ``EO_EXAMPLES_META_CONN_ID``: the meta store connection (default ``[exactly_once] meta_conn_id``,
  itself ``exactly_once_default`` unless set; without that connection the embedded SQLite file
  under ``$AIRFLOW_HOME/exactly_once/`` is used)
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once import (
    FilesInput,
    IcebergSinkConfig,
    MarkerFileCheckpoint,
    SparkWrite,
    TableSpec,
    exactly_once_epoch,
)

_HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
LANDING = os.environ.get("EO_EXAMPLES_LANDING", str(_HOME / "exactly_once_examples" / "landing" / "events"))

#: The hour's directory; the input and the checkpoint name the same one, so the hour Spark read
#: is the hour whose ``_SUCCESS`` the commit waits for.
HOUR_DIR = LANDING.rstrip("/") + "/{start:%Y/%m/%d/%H}"
SINK = IcebergSinkConfig(
    "hourly-events",
    ("examples.events",),
    iceberg_conn_id=os.environ.get("EO_EXAMPLES_ICEBERG_CONN_ID", "iceberg_default"),
)
CHECKPOINT = MarkerFileCheckpoint(HOUR_DIR, storage_conn_id=os.environ.get("EO_EXAMPLES_STORAGE_CONN_ID"))

#: The table, created by the first run and left alone by every later one. Column name to Iceberg
#: type: checked when the DAG is parsed, turned into pyiceberg's ``Schema`` only when the task
#: runs, so the parse does not import pyiceberg. It is also the schema Spark reads the hour's JSON
#: with (``timestamptz`` is Spark's ``TIMESTAMP``), so that Spark does not infer one per hour: an
#: hour with a missing field would otherwise be read with other types than the table's.
#: Partitioned by day so that a day's hours share a partition and queries prune by day.
TABLE = TableSpec(
    schema={
        "event_id": "string",
        "user_id": "long",
        "event_type": "string",
        "event_time": "timestamptz",
        "amount": "double",
    },
    partitioning=["day(event_time) as event_day"],
)

#: Spark settings for a small machine; a cluster takes its own from the Spark connection.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": os.environ.get("EO_EXAMPLES_SPARK_DRIVER_MEMORY", "768m"),
    "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
}


with DAG(
    "exactly_once_hourly_events",
    description="Hourly JSON event files into an Iceberg table, exactly once per hour",
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
        # The table and its catalog come from the sink and its Iceberg connection when the task runs.
        SparkWrite(
            FilesInput(format="json", path=HOUR_DIR),
            conn_id=os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default"),
            conf=SPARK_CONF,
            retries=2,
            retry_delay=dt.timedelta(minutes=1),
        ),
        sink=SINK,
        checkpoint=CHECKPOINT,
        table=TABLE,
        # Reading the hour while files still arrive would commit a partial hour; a _FAILED hour
        # settles too, so the write runs and the epoch's wait aborts it, recorded in the meta store.
        wait_until_settled=True,
        meta_conn_id=os.environ.get("EO_EXAMPLES_META_CONN_ID"),
        group_id="events",
        # The upstream may be late: look every minute, give up (and abort the hour) after 6 hours.
        sensor_kwargs={"poke_interval": 60, "timeout": 6 * 3600, "mode": "reschedule"},
    )
