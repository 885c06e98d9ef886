"""One Spark write into three Iceberg tables, committed together as one epoch (fan-out).

The hour's events go to tables laid out for different readers: ``examples.events_by_day``
(partitioned by ``day(event_time)``) and ``examples.events_by_type`` (partitioned by
``event_type``) get every event; ``examples.purchases`` gets only the purchases, without the
type column, as its ``select`` query in the sink says. All three belong to one sink, so one
``SparkPreCommitOperator`` reads the hour once and writes every table in one ``spark-submit``,
returning one pre-commit; the epoch is Committed only when every table holds the hour, each as one
snapshot carrying the marker. A crash between two table commits is finished by the commit's retry
or the recovery DAG, which find the marker in the tables already committed and commit only the
others. A write that fails in any table removes its files in all of them, and every try writes to
fresh locations, so no retry or clear can produce a write that shares files with an earlier one.

Settings: as in ``hourly_events.py``.
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
    TableSelect,
    TableSpec,
    exactly_once_epoch,
)

_HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
LANDING = os.environ.get("EO_EXAMPLES_LANDING", str(_HOME / "exactly_once_examples" / "landing" / "events"))

HOUR_DIR = LANDING.rstrip("/") + "/{start:%Y/%m/%d/%H}"
SINK = IcebergSinkConfig(
    "events-fan-out",
    ("examples.events_by_day", "examples.events_by_type", "examples.purchases"),
    iceberg_conn_id=os.environ.get("EO_EXAMPLES_ICEBERG_CONN_ID", "iceberg_default"),
    # The tables not named here get every event of the hour.
    select={
        "examples.purchases": TableSelect(
            query="SELECT event_id, user_id, event_time, amount FROM epoch_input WHERE event_type = 'purchase'"
        )
    },
)

#: Column name to Iceberg type, as in ``hourly_events.py``: no pyiceberg import at parse time. The
#: tables that get every event also give the schema Spark reads the hour with.
EVENTS = {
    "event_id": "string",
    "user_id": "long",
    "event_type": "string",
    "event_time": "timestamptz",
    "amount": "double",
}
PURCHASES = {"event_id": "string", "user_id": "long", "event_time": "timestamptz", "amount": "double"}


with DAG(
    "exactly_once_fan_out",
    description="Hourly events into three Iceberg tables, written by one Spark job, committed together exactly once",
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
        # Every table of the sink, with its selection, and their catalog come from the sink and its
        # Iceberg connection when the task runs.
        SparkWrite(
            FilesInput(format="json", path=HOUR_DIR),
            conn_id=os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default"),
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
        table={
            "examples.events_by_day": TableSpec(EVENTS, ["day(event_time) as event_day"]),
            "examples.events_by_type": TableSpec(EVENTS, ["event_type"]),
            "examples.purchases": TableSpec(PURCHASES, ["day(event_time) as event_day"]),
        },
        wait_until_settled=True,
        meta_conn_id=os.environ.get("EO_EXAMPLES_META_CONN_ID"),
        group_id="events",
        sensor_kwargs={"poke_interval": 60, "timeout": 6 * 3600, "mode": "reschedule"},
    )
