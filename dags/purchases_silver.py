"""The purchases of ``examples.events`` into a silver table, each event exactly once, incrementally.

``examples.events`` (the bronze table ``hourly_events.py`` fills, or any engine appending to it) is
read by what its appends added since this sink's last committed epoch: each hourly run reserves the
range of snapshots after that position up to the table's current snapshot, reads the files those
snapshots added, and commits the purchases among them into ``examples.purchases_silver`` with the
range written beside the data. A purchase that lands late in bronze, for an hour this DAG already
ran, is read by the next run; a retry or a clear of a run reads its own range again; a failed run's
range is read by the next one. Runs go one at a time: a run's range starts where the last committed
one ended.

Settings as in ``hourly_events.py``: ``EO_EXAMPLES_ICEBERG_CONN_ID``, ``EO_EXAMPLES_SPARK_CONN_ID``,
``EO_EXAMPLES_META_CONN_ID``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once import (
    IcebergSinkConfig,
    IcebergTableInput,
    SnapshotRangeCheckpoint,
    SparkWrite,
    TableSelect,
    TableSpec,
    exactly_once_epoch,
)

BRONZE = "examples.events"
SILVER = "examples.purchases_silver"
SINK = IcebergSinkConfig(
    "purchases-silver",
    (SILVER,),
    iceberg_conn_id=os.environ.get("EO_EXAMPLES_ICEBERG_CONN_ID", "iceberg_default"),
    select={SILVER: TableSelect(where="event_type = 'purchase'")},
)
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

with DAG(
    "exactly_once_purchases_silver",
    description="The purchases of the bronze events table into a silver table, each read once",
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["exactly-once", "example"],
    doc_md=__doc__,
) as dag:
    exactly_once_epoch(
        SparkWrite(
            # The bronze table in the sink's own catalog; catalog_conn_id names another one.
            IcebergTableInput(table=BRONZE),
            conn_id=os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default"),
            conf={
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.driver.memory": os.environ.get("EO_EXAMPLES_SPARK_DRIVER_MEMORY", "768m"),
                "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
            },
            retries=3,
            retry_delay=dt.timedelta(minutes=1),
        ),
        sink=SINK,
        # Complete once the run's range is reserved: a snapshot never changes, so nothing more can
        # come to the epoch's input; appends after the reservation are the next run's.
        checkpoint=SnapshotRangeCheckpoint(),
        table=TABLE,
        meta_conn_id=os.environ.get("EO_EXAMPLES_META_CONN_ID"),
        group_id="purchases",
    )
