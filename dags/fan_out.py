"""One write into two Iceberg tables, committed together as one epoch (fan-out).

The hour's events go to two tables with different layouts for different readers:
``examples.events_by_day`` (partitioned by ``day(event_time)``) and ``examples.events_by_type``
(partitioned by ``event_type``). Both belong to one sink, so the epoch is Committed only when both
tables hold the hour, each as one snapshot carrying the marker; a crash between the two table
commits is finished by the commit's retry or the recovery DAG, which find the first table's marker
and commit only the second.

The epoch writer writes one table per Spark job, so the write task submits it once per table,
inside one task try, and returns one pre-commit for both. Doing both in one try matters: every try
gets fresh write locations for both tables, so a retry or clear never produces a write that shares
files with an earlier one (a replaced write's files are deleted). Settings: as in ``hourly_events.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, BaseOperator
from airflow.timetables.interval import CronDataIntervalTimetable
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once import (
    CheckpointSettledSensor,
    EnsureTableOperator,
    FilesInput,
    IcebergSinkConfig,
    MarkerFileCheckpoint,
    SparkPreCommitOperator,
    exactly_once_epoch,
)
from airflow_provider_exactly_once.core.identifiers import new_write_id
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.operators.spark_precommit import xcom_value

_HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
LANDING = os.environ.get("EO_EXAMPLES_LANDING", str(_HOME / "exactly_once_examples" / "landing" / "events"))
ICEBERG_CONN_ID = os.environ.get("EO_EXAMPLES_ICEBERG_CONN_ID", "iceberg_default")
SPARK_CONN_ID = os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default")
META_CONN_ID = os.environ.get("EO_EXAMPLES_META_CONN_ID", "exactly_once_default")

TABLES = ("examples.events_by_day", "examples.events_by_type")
HOUR_DIR = LANDING.rstrip("/") + "/{start:%Y/%m/%d/%H}"
EVENT_SCHEMA = "event_id STRING, user_id BIGINT, event_type STRING, event_time TIMESTAMP, amount DOUBLE"
SINK = IcebergSinkConfig("events-fan-out", TABLES, iceberg_conn_id=ICEBERG_CONN_ID)
CHECKPOINT = MarkerFileCheckpoint(HOUR_DIR)
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": os.environ.get("EO_EXAMPLES_SPARK_DRIVER_MEMORY", "768m"),
    "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
}


#: Spark's ``TIMESTAMP`` is an instant: it maps to Iceberg's ``timestamptz``.
TABLE_SCHEMA = Schema(
    NestedField(1, "event_id", StringType()),
    NestedField(2, "user_id", LongType()),
    NestedField(3, "event_type", StringType()),
    NestedField(4, "event_time", TimestamptzType()),
    NestedField(5, "amount", DoubleType()),
)
PARTITIONING = {
    TABLES[0]: PartitionSpec(PartitionField(4, 1000, DayTransform(), "event_day")),
    TABLES[1]: PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "event_type")),
}


class FanOutWriteOperator(BaseOperator):
    """Run the epoch writer for each table of the sink and return one pre-commit for all of them.

    The pre-commit gets a write id of its own (fresh per try); each table keeps the location its
    writer wrote to, which is unique to that writer's run, so abort removes exactly this try's files.
    """

    def execute(self, context: Any) -> dict[str, Any] | str:
        writes: list[PreCommit] = []
        for table in SINK.tables:
            # One table of the sink: its catalog properties are read from the connection when it runs.
            writer = SparkPreCommitOperator(
                task_id=f"{self.task_id}__{table.replace('.', '_')}",
                conn_id=SPARK_CONN_ID,
                sink=IcebergSinkConfig(SINK.sink_id, (table,), iceberg_conn_id=ICEBERG_CONN_ID),
                input=FilesInput(format="json", path=HOUR_DIR, schema_ddl=EVENT_SCHEMA),
                conf=SPARK_CONF,
                xcom_compress_above=None,
            )
            writes.append(PreCommit.parse(writer.execute(context)))
        merged = PreCommit(
            sink_id=SINK.sink_id,
            epoch=writes[0].epoch,
            write_id=new_write_id(),
            tables=[table for write in writes for table in write.tables],
            source_positions=writes[0].source_positions,
        )
        self.log.info("%s: %d row(s) into %s", merged.describe(), merged.record_count, list(SINK.tables))
        return xcom_value(merged)


with DAG(
    "exactly_once_fan_out",
    description="Hourly events into two Iceberg tables, committed together exactly once",
    # Runs cover the hour that just ended ([00:00, 01:00) runs at 01:00); "@hourly" alone would
    # give zero-length intervals in Airflow 3 and name each epoch after the run's own instant.
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=4,
    tags=["exactly-once", "example"],
    doc_md=__doc__,
) as dag:
    create_tables = [
        EnsureTableOperator(
            task_id=f"create_{name.split('.')[-1]}",
            sink=SINK,
            table=name,
            schema=TABLE_SCHEMA,
            partition_spec=spec,
            retries=3,
        )
        for name, spec in PARTITIONING.items()
    ]
    hour_settled = CheckpointSettledSensor(
        task_id="hour_settled",
        sink=SINK,
        checkpoint=CHECKPOINT,
        meta_conn_id=META_CONN_ID,
        poke_interval=60,
        timeout=6 * 3600,
        mode="reschedule",
    )
    write = FanOutWriteOperator(task_id="write", retries=2, retry_delay=dt.timedelta(minutes=1))
    [*create_tables, hour_settled] >> write
    exactly_once_epoch(
        write,
        sink=SINK,
        checkpoint=CHECKPOINT,
        meta_conn_id=META_CONN_ID,
        group_id="events",
        sensor_kwargs={"poke_interval": 60, "timeout": 6 * 3600, "mode": "reschedule"},
    )
