"""The upsert pipeline's light write: an hour's changes applied copy-on-write with pyiceberg and
pyarrow, producing the pre-commit the Spark upsert job (``spark/upsert.py``) produces, without a JVM.

Same rule as the Spark job, on the harness's event table (key ``event_id``): the data files of the
branch head that hold a changed key (planned by pyiceberg with ``In`` on the key, read with its own
Arrow reader) are rewritten without the changed and deleted keys, the epoch's inserted and updated
rows are written beside them, in one file; the pre-commit names the rewritten files, the snapshot
read, the epoch's key range (deletes included) and the counts. Everything goes through the table's
FileIO, so the write lands where the table lives, local disk or S3. ``tests/support/upsert_writer.py``
is the same idea on a two-column table for the coordinator's unit tests; this one is what a DAG task
runs under the real scheduler.

No Airflow here: the DAG's task (``pipeline.light_upsert_write``) and the checker's unit tests call it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import to_bytes
from pyiceberg.expressions import AlwaysTrue, In
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.table import Table
from pyiceberg.types import StringType

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RewrittenFile
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from fault_harness.landed import COLUMNS, Row
from fault_harness.table_writes import write_data_file
from fault_harness.upsert_changes import KEY, Change


def write_upsert(
    table: Table,
    table_name: str,
    sink_id: str,
    epoch: int,
    write_id: str,
    changes: Mapping[str, Change],
    *,
    branch: str = "main",
    file_name: str = "part-00000.parquet",
) -> PreCommit:
    """``changes`` (one per key, ``upsert_changes.last_per_key``) applied copy-on-write against the
    head of ``branch`` of ``table`` (``table_name``, as the sink names it) as it is now; the files
    written, nothing visible."""
    head = table.metadata.snapshot_by_name(branch)
    location = iceberg_write_location(iceberg_data_root(table.location(), table.properties), write_id)
    arrow_schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
    keys = sorted(changes)
    key_set = pa.array(keys, pa.string())
    rewritten: list[RewrittenFile] = []
    kept: list[pa.Table] = []
    found: set[str] = set()
    if head is not None and keys:
        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        tasks = table.scan(row_filter=In(term=KEY, literals=keys), snapshot_id=head.snapshot_id).plan_files()
        for task in sorted(tasks, key=lambda t: t.file.file_path):
            if task.delete_files:
                raise RuntimeError(f"{task.file.file_path} has delete files: copy-on-write cannot rewrite it")
            data = scan.to_table([task]).select(list(COLUMNS))
            hit = pc.is_in(data.column(KEY), value_set=key_set)
            if not pc.any(hit).as_py():
                continue  # its statistics overlapped, its rows do not: left alone, as Spark does
            found.update(str(k) for k in data.filter(hit).column(KEY).to_pylist())
            rewritten.append(RewrittenFile(path=task.file.file_path, record_count=int(task.file.record_count)))
            kept.append(_conform(data.filter(pc.invert(hit)), arrow_schema))
    upserts = [c.row for c in changes.values() if c.op == "upsert"]
    rows = pa.concat_tables([*kept, _arrow_rows(upserts, arrow_schema)])
    data_files = []
    if rows.num_rows:
        path = f"{location}/{file_name}"
        data_files.append(write_data_file(table, path, rows.cast(arrow_schema)))
    updated = sum(1 for c in changes.values() if c.op == "upsert" and c.key in found)
    deleted = sum(1 for c in changes.values() if c.op == "delete" and c.key in found)
    deletes = sum(1 for c in changes.values() if c.op == "delete")
    bounds: dict[str, dict[str, str]] = {}
    if keys:
        bounds = {"key_lower_bounds": {KEY: _bound(keys[0])}, "key_upper_bounds": {KEY: _bound(keys[-1])}}
    write = TableWrite(
        table=table_name,
        location=location,
        data_files=data_files,
        rewritten=rewritten,
        read_snapshot_id=None if head is None else head.snapshot_id,
        changes=ChangeCounts(
            inserted=len(upserts) - updated,
            updated=updated,
            deleted=deleted,
            deletes_of_absent_keys=deletes - deleted,
            rows_rewritten=max(sum(f.record_count for f in rewritten) - updated - deleted, 0),
        ),
        **bounds,
    )
    return PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=[write])


def _bound(key: str) -> str:
    """Iceberg's single-value serialisation of a string key (UTF-8 bytes; ASCII keys order alike)."""
    return base64.b64encode(to_bytes(StringType(), key)).decode("ascii")


def _conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([data.column(f.name).cast(f.type) for f in schema], schema=schema)


def _arrow_rows(rows: list[Row], schema: pa.Schema) -> pa.Table:
    """``landed.Row`` tuples (event time in microseconds, UTC) as a table of ``schema``."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in COLUMNS]
    arrays = []
    for field, values in zip(schema, columns, strict=True):
        if field.name == "event_time":
            arrays.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
