"""One write into two Iceberg tables, committed together as one epoch (fan-out).

The hour's events go to two tables with different layouts for different readers:
``examples.events_by_day`` (partitioned by ``day(event_time)``) and ``examples.events_by_type``
(partitioned by ``event_type``). Both belong to one sink, so the epoch is Committed only when both
tables hold the hour, each as one snapshot carrying the marker; a crash between the two table
commits is finished by the commit's retry or the recovery DAG, which find the first table's marker
and commit only the second.

The write task runs the epoch writer once per table, inside one task try, and returns one
pre-commit for both. Doing both in one try matters: every try gets fresh write locations for both
tables, so a retry or clear never produces a write that shares files with an earlier one (a
replaced write's files are deleted). Settings: as in ``hourly_events.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, BaseOperator, task
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.identifiers import new_write_id
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator, xcom_value
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.spark.jobspec import FilesInput
from airflow_provider_exactly_once.task_groups import exactly_once_epoch

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


@task(retries=3, retry_delay=dt.timedelta(seconds=30))
def create_tables() -> list[str]:
    """Create both tables on first use; idempotent, and safe when two runs race to it."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, IdentityTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

    catalog = IcebergHook(ICEBERG_CONN_ID).catalog
    schema = Schema(
        NestedField(1, "event_id", StringType()),
        NestedField(2, "user_id", LongType()),
        NestedField(3, "event_type", StringType()),
        NestedField(4, "event_time", TimestamptzType()),
        NestedField(5, "amount", DoubleType()),
    )
    specs = {
        TABLES[0]: PartitionSpec(PartitionField(4, 1000, DayTransform(), "event_day")),
        TABLES[1]: PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "event_type")),
    }
    for name, spec in specs.items():
        catalog.create_namespace_if_not_exists(name.split(".")[0])
        catalog.create_table_if_not_exists(name, schema, partition_spec=spec)
    return list(specs)


class FanOutWriteOperator(BaseOperator):
    """Run the epoch writer for each table of the sink and return one pre-commit for all of them.

    The pre-commit gets a write id of its own (fresh per try); each table keeps the location its
    writer wrote to, which is unique to that writer's run, so abort removes exactly this try's files.
    """

    template_fields = ("catalog_properties",)

    def __init__(self, *, catalog_properties: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_properties = catalog_properties

    def execute(self, context: Any) -> dict[str, Any] | str:
        writes: list[PreCommit] = []
        for table in SINK.tables:
            writer = SparkPreCommitOperator(
                task_id=f"{self.task_id}__{table.replace('.', '_')}",
                conn_id=SPARK_CONN_ID,
                sink_id=SINK.sink_id,
                input=FilesInput(format="json", path=HOUR_DIR, schema_ddl=EVENT_SCHEMA),
                target={
                    "kind": "iceberg",
                    "catalog_name": ICEBERG_CONN_ID,
                    "catalog_properties": self.catalog_properties,
                    "table": table,
                },
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


@task.sensor(poke_interval=60, timeout=6 * 3600, mode="reschedule")
def hour_settled(data_interval_start: dt.datetime | None = None) -> bool:
    """Hold the write until the upstream is done with the hour, either way (``_SUCCESS`` or ``_FAILED``).

    The write reads the hour's files when it runs; reading while files are still arriving would
    make a partial hour the epoch's write, and ``_SUCCESS`` would then commit it. A ``_FAILED``
    hour is still written and then aborted by the epoch's wait, which leaves an Aborted row saying
    so in the meta store.
    """
    from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
    from airflow_provider_exactly_once.core.status import CheckpointStatus

    assert data_interval_start is not None, "an hourly run always has a data interval"
    status = CHECKPOINT.source().status(SINK.sink_id, epoch_from_interval_start(data_interval_start))
    return status is not CheckpointStatus.PENDING


with DAG(
    "exactly_once_fan_out",
    description="Hourly events into two Iceberg tables, committed together exactly once",
    # Runs cover the hour that just ended ([00:00, 01:00) runs at 01:00); "@hourly" alone would
    # give zero-length intervals in Airflow 3 and name each epoch after the run's own instant.
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=4,
    render_template_as_native_obj=True,
    tags=["exactly-once", "example"],
    doc_md=__doc__,
) as dag:
    write = FanOutWriteOperator(
        task_id="write",
        catalog_properties="{{ conn.get('" + ICEBERG_CONN_ID + "').extra_dejson }}",
        retries=2,
        retry_delay=dt.timedelta(minutes=1),
    )
    [create_tables(), hour_settled()] >> write
    exactly_once_epoch(
        write,
        sink=SINK,
        checkpoint=CHECKPOINT,
        meta_conn_id=META_CONN_ID,
        group_id="events",
        sensor_kwargs={"poke_interval": 60, "timeout": 6 * 3600, "mode": "reschedule"},
    )
