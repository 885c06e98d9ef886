"""Building real tables, real Parquet files and pre-commits for the Iceberg committer tests."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from airflow_provider_exactly_once.core.precommit import (
    DataFileDescriptor,
    PartitionValue,
    PreCommit,
    TableWrite,
    WrittenColumn,
)
from airflow_provider_exactly_once.sinks.iceberg import describe_parquet_file

NAMESPACE = "ns"

SIMPLE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "score", DoubleType(), required=False),
)
SIMPLE_ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {"id": ids, "name": [f"n{i}" for i in ids], "score": [i / 2 for i in ids]},
        schema=SIMPLE_ARROW,
    )


def now() -> datetime:
    return datetime.now(UTC)


def create_table(
    catalog: Catalog,
    name: str,
    schema: Schema = SIMPLE_SCHEMA,
    *,
    spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
    properties: Mapping[str, str] | None = None,
) -> Table:
    return catalog.create_table(
        f"{NAMESPACE}.{name}", schema=schema, partition_spec=spec, properties=dict(properties or {})
    )


def local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def write_location(table: Table, write_id: str) -> str:
    return f"{table.location().rstrip('/')}/data/_eo_staging/{write_id}"


def write_parquet(
    table: Table,
    location: str,
    data: pa.Table,
    *,
    partition: Mapping[str, PartitionValue] | None = None,
    name: str | None = None,
    schema: Schema | None = None,
) -> DataFileDescriptor:
    """Write ``data`` as Parquet (no field ids, like Spark) below ``location`` and describe it."""
    path = f"{location}/{name or uuid.uuid4().hex}.parquet"
    target = local_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, target)
    return describe_parquet_file(
        path,
        table_schema=schema or table.schema(),
        partition=dict(partition or {}),
        table_properties=table.properties,
    )


def table_write(
    table: Table,
    location: str,
    files: Sequence[DataFileDescriptor],
    *,
    schema_written: Sequence[WrittenColumn] = (),
    added_columns: Sequence[WrittenColumn] = (),
) -> TableWrite:
    """The write as the Spark writer records it: partitioned for the table's spec of the moment."""
    return TableWrite(
        table=".".join(table.name()),
        location=location,
        data_files=list(files),
        schema_written=list(schema_written),
        added_columns=list(added_columns),
        spec_id=table.metadata.default_spec_id,
    )


def pre_commit(sink_id: str, epoch: int, tables: Sequence[TableWrite], write_id: str | None = None) -> PreCommit:
    return PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id or str(uuid.uuid4()), tables=list(tables))


def simple_write(
    table: Table,
    sink_id: str,
    epoch: int = 1000,
    *,
    start: int = 0,
    count: int = 5,
    files: int = 1,
    **kw: Any,
) -> PreCommit:
    write_id = str(uuid.uuid4())
    location = write_location(table, write_id)
    descriptors = [write_parquet(table, location, rows(start + i * count, count)) for i in range(files)]
    return pre_commit(sink_id, epoch, [table_write(table, location, descriptors, **kw)], write_id=write_id)


def snapshot_count(table: Table) -> int:
    return len(table.refresh().metadata.snapshots)


def ids_in(table: Table, branch: str = "main") -> list[int]:
    """The ids the head of ``branch`` shows (none while the branch does not exist)."""
    ref = table.refresh().metadata.refs.get(branch)
    if ref is None:
        return []
    return sorted(table.scan(snapshot_id=ref.snapshot_id).to_arrow()["id"].to_pylist())


def branch_head(table: Table, branch: str) -> int | None:
    ref = table.refresh().metadata.refs.get(branch)
    return None if ref is None else ref.snapshot_id
