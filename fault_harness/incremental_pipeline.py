"""The incremental variant of the harness pipeline (``pipeline.build`` with ``mode="incremental"``).

Its sink reads an upstream Iceberg table beside its own (``IcebergTableInput``, same catalog): each
epoch reads what the upstream's appends added in the snapshot range the epoch reserved in the meta
store before its write (``core.input_ranges``); its checkpoint is that reservation
(``SnapshotRangeCheckpoint``); the DAG runs one epoch at a time (``max_active_runs=1``), as a range
starts where the last committed one ended. The harness's producer (``incremental``) appends to the
upstream while the epochs run.

The light write (``light_incremental_write``) is the product's code for everything but Spark: the
range reserved by ``runtime.run_epochs.reserved_range`` (the meta store opened as the product's
operator opens it, the upstream's current snapshot by ``current_snapshot_of`` on the connection's
catalog properties), planned by ``spark.inputs.range_snapshots`` and ``added_files``
(the driver-side pieces of the Spark read), the files read by ``TableFiles``' pyiceberg ``ArrowScan``
(what the Spark read's executors run), in-process; the rows go into one real Parquet file in the
write's own location, as ``pipeline.light_write``'s do. The ``writer="spark"`` variant is the
product's ``SparkPreCommitOperator(input=IcebergTableInput(...))`` (``pipeline.build``).

``light_incremental_write`` imports Airflow (only in the task); ``read_range`` and ``write_range``
do not, so the checker's tests drive them without a cluster.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from fault_harness.layout import WRITE_POINT

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
    from airflow_provider_exactly_once.core.precommit import PreCommit


def light_incremental_write(sink_id: str, table_name: str, upstream: str, conn_id: str) -> dict[str, Any]:
    """One incremental epoch's write without Spark: the epoch's range of ``upstream`` reserved (or
    read back: a retry, a clear), its appended rows read and written as one Parquet file into the
    sink's write location, returned as pre-commit metadata whose ``source_positions`` are the
    range's (nothing visible). Reaches ``write.files_written`` after its file exists."""
    from airflow.sdk import get_current_context
    from pyiceberg.catalog import load_catalog

    from airflow_provider_exactly_once.operators._common import airflow_errors
    from airflow_provider_exactly_once.operators.spark_precommit import iceberg_catalog_properties
    from airflow_provider_exactly_once.runtime.assembly import open_meta_store
    from airflow_provider_exactly_once.runtime.run_epochs import current_snapshot_of, reserved_range
    from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table
    from demo.fault_plan import fault_hook_for
    from fault_harness.runs import running_write

    _start, epoch, attempt, (table,) = running_write(conn_id, [table_name])
    run_id = str(get_current_context()["run_id"])
    # The connection's catalog, as the product's operator reads the upstream's (``upstream_settings``).
    properties = iceberg_catalog_properties(conn_id)
    with airflow_errors():  # a refusal (InputRangeRefused) fails the task for good; a wait is retried
        store = open_meta_store(None)  # the configured meta store: the cluster's exactly_once_default
        try:
            reserved = reserved_range(
                store, sink_id, epoch, upstream, current_snapshot_of(conn_id, properties, upstream), run_id=run_id
            )
        finally:
            store.dispose()
        source = None if reserved.empty else load_table(load_catalog(conn_id, **properties), upstream)
        batches, read = read_range(source, reserved, properties, f"sink {sink_id!r} epoch {epoch}")
    pre = write_range(table, table_name, sink_id, epoch, reserved, batches, read, f"part-00000-{attempt}.parquet")
    fault_hook_for(sink_id, epoch, attempt)(WRITE_POINT)
    print(f"incremental write {pre.write_id}: {reserved.describe()}: {read}", flush=True)
    value: dict[str, Any] = json.loads(pre.model_dump_json(exclude_defaults=True))
    return value


def read_range(
    source: Table | None, reserved: SnapshotRange, properties: dict[str, str], owner: str
) -> tuple[list[pa.RecordBatch], dict[str, int]]:
    """The rows the range's appends added to ``source`` (the upstream, loaded; ``None`` for an empty
    range), and what was read (snapshots, files, records), by the Spark read's own pieces: the
    range checked and its snapshots listed (``range_snapshots``, ``check_from_first``), its added
    files planned at the range's last schema (``added_files``), each read by the executors' reader
    (``TableFiles.scan``), here in-process."""
    from pyiceberg.table import FileScanTask

    from airflow_provider_exactly_once.spark.file_io import storage_properties
    from airflow_provider_exactly_once.spark.inputs import (
        _at_schema_of,
        added_files,
        check_from_first,
        range_snapshots,
    )
    from airflow_provider_exactly_once.spark.upsert import TableFiles

    if reserved.empty or source is None:
        return [], {"snapshots": 0, "files": 0, "records": 0}
    snapshots = range_snapshots(source.metadata, reserved, owner)
    if reserved.after_snapshot_id is None:
        check_from_first(source, snapshots, reserved, owner)
    pinned = _at_schema_of(source.metadata, snapshots[-1])
    files = added_files(source, pinned, reserved, snapshots, owner)
    shipped = TableFiles(pinned.model_dump_json(), storage_properties({**properties, **source.io.properties}), files)
    scan = shipped.scan()
    batches = [batch for path in sorted(files) for batch in scan.to_record_batches([FileScanTask(files[path])])]
    records = sum(int(f.record_count) for f in files.values())
    return batches, {"snapshots": len(snapshots), "files": len(files), "records": records}


def write_range(
    table: Table,
    table_name: str,
    sink_id: str,
    epoch: int,
    reserved: SnapshotRange,
    batches: list[pa.RecordBatch],
    read: dict[str, int],
    file_name: str,
) -> PreCommit:
    """The rows as one Parquet file (the sink's schema, with field ids) in a new write's location
    of ``table``, through its FileIO (``table_writes``); the pre-commit, the range as its source
    positions. No rows: no file (the commit of an empty write adds no snapshot)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
    from fault_harness.table_writes import write_data_file

    write_id = str(uuid.uuid4())
    location = f"{table.location().rstrip('/')}/data/_eo/{write_id}"
    descriptors = []
    if any(b.num_rows for b in batches):
        arrow_schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
        data = pa.Table.from_batches(batches)
        columns = [data.column(f.name).cast(f.type) for f in arrow_schema]
        rows = pa.Table.from_arrays(columns, schema=arrow_schema)
        descriptors.append(write_data_file(table, f"{location}/{file_name}", rows))
    return PreCommit(
        sink_id=sink_id,
        epoch=epoch,
        write_id=write_id,
        tables=[TableWrite(table=table_name, location=location, data_files=descriptors)],
        source_positions=reserved.positions(**read),
    )
