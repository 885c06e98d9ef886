"""Descriptors computed on the writer side equal what pyiceberg computes from the same files."""

from __future__ import annotations

import math
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.sinks.iceberg import describe_parquet_file
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_file

from .iceberg_helpers import create_table, local_path, write_location

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "small", IntegerType(), required=False),
    NestedField(3, "name", StringType(), required=False),
    NestedField(4, "x", DoubleType(), required=False),
    NestedField(5, "amount", DecimalType(10, 2), required=False),
    NestedField(6, "day", DateType(), required=False),
    NestedField(7, "at", TimestamptzType(), required=False),
    NestedField(8, "tags", ListType(9, StringType(), element_required=False), required=False),
    NestedField(10, "point", StructType(NestedField(11, "lat", DoubleType(), required=False)), required=False),
)


def _arrow_data(n: int) -> pa.Table:
    import datetime as dt
    from decimal import Decimal

    return pa.table(
        {
            "id": pa.array(list(range(n)), pa.int64()),
            "small": pa.array([i if i % 3 else None for i in range(n)], pa.int32()),
            "name": pa.array([f"name-{i:04d}" * 3 for i in range(n)]),
            "x": pa.array([math.nan if i == 2 else i * 1.5 for i in range(n)], pa.float64()),
            "amount": pa.array([Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(2024, 1, 1 + i % 28) for i in range(n)], pa.date32()),
            "at": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i) for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
            "tags": pa.array([["a", "b"] if i % 2 else None for i in range(n)], pa.list_(pa.string())),
            "point": pa.array([{"lat": i / 10} for i in range(n)], pa.struct([("lat", pa.float64())])),
        }
    )


def _stats(data_file: DataFile) -> dict[str, object]:
    return {
        name: getattr(data_file, name)
        for name in (
            "file_path",
            "record_count",
            "file_size_in_bytes",
            "column_sizes",
            "value_counts",
            "null_value_counts",
            "nan_value_counts",
            "lower_bounds",
            "upper_bounds",
            "split_offsets",
        )
    }


@pytest.mark.parametrize("properties", [{}, {TableProperties.DEFAULT_WRITE_METRICS_MODE: "truncate(4)"}])
def test_descriptor_round_trip_equals_pyiceberg(catalog: SqlCatalog, properties: dict[str, str]) -> None:
    table = create_table(catalog, "d", SCHEMA, properties=properties)
    location = write_location(table, str(uuid.uuid4()))
    path = f"{location}/f.parquet"
    local_path(path).parent.mkdir(parents=True)
    pq.write_table(_arrow_data(40), local_path(path), row_group_size=15)  # several row groups

    descriptor = describe_parquet_file(
        path, table_schema=table.schema(), partition={}, table_properties=table.properties
    )
    ours = build_data_file(
        descriptor,
        schema=table.schema(),
        spec=table.spec(),
        spec_id=table.metadata.default_spec_id,
        table="ns.d",
    )
    # pyiceberg's add_files path, reading the footer itself (it needs the name mapping for id-less files).
    metadata = (
        table.transaction()
        .set_properties({TableProperties.DEFAULT_NAME_MAPPING: table.schema().name_mapping.model_dump_json()})
        .table_metadata
    )
    theirs = parquet_file_to_data_file(table.io, metadata, path)

    assert _stats(ours) == _stats(theirs)
    assert len(ours.split_offsets or []) == 3
    assert {"id", "name", "amount", "day", "at"} <= set(descriptor.lower_bounds) & set(descriptor.upper_bounds)
    assert descriptor.null_value_counts["small"] == 14
    assert "tags.element" in descriptor.value_counts and "point.lat" in descriptor.value_counts
    # The descriptor survives the trip through JSON (XCom, the meta store) unchanged.
    assert type(descriptor).model_validate_json(descriptor.model_dump_json()) == descriptor


def test_descriptor_from_writer_metadata_reads_nothing(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "d", SCHEMA)
    path = f"{write_location(table, 'w')}/f.parquet"
    local_path(path).parent.mkdir(parents=True)
    with pq.ParquetWriter(local_path(path), _arrow_data(3).schema) as writer:
        writer.write_table(_arrow_data(3))
    metadata = writer.writer.metadata if hasattr(writer, "writer") else pq.read_metadata(local_path(path))
    size = local_path(path).stat().st_size
    local_path(path).unlink()  # proves nothing is read back

    descriptor = describe_parquet_file(
        path,
        table_schema=SCHEMA,
        partition={},
        parquet_metadata=metadata,
        file_size_in_bytes=size,
        writer="task-3",
    )
    assert descriptor.record_count == 3 and descriptor.file_size_in_bytes == size and descriptor.writer == "task-3"


def test_partition_is_carried_as_given(catalog: SqlCatalog) -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "k", StringType(), required=False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="k"))
    table = create_table(catalog, "p", schema, spec=spec)
    path = f"{write_location(table, 'w')}/f.parquet"
    local_path(path).parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "k": ["a"]}), local_path(path))

    descriptor = describe_parquet_file(path, table_schema=schema, partition={"k": "a"})
    data_file = build_data_file(
        descriptor,
        schema=schema,
        spec=table.spec(),
        spec_id=0,
        table="ns.p",
    )
    assert data_file.partition[0] == "a"
    assert (
        data_file.partition
        == parquet_file_to_data_file(
            table.io,
            table.transaction()
            .set_properties({TableProperties.DEFAULT_NAME_MAPPING: schema.name_mapping.model_dump_json()})
            .table_metadata,
            path,
        ).partition
    )


def test_column_of_incompatible_shape_is_named(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "d", SCHEMA)
    path = f"{write_location(table, 'w')}/f.parquet"
    local_path(path).parent.mkdir(parents=True)
    # "point" is a struct in the table but a plain column in the file: its Parquet path does not exist.
    pq.write_table(pa.table({"point": pa.array([1.0])}), local_path(path))
    with pytest.raises(InvalidPreCommit, match="point"):
        describe_parquet_file(path, table_schema=SCHEMA, partition={})


def test_the_executors_modules_import_no_committer_and_no_sqlalchemy() -> None:
    """Each of the executors' Python workers is a new process (on Spark Connect, each session starts
    its own), so what it imports is paid on every write: describing files needs no catalog access."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from airflow_provider_exactly_once.spark import inputs, upsert, writers\n"
        "from airflow_provider_exactly_once.sinks.iceberg import describe_parquet_file\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'"
        " or m.endswith(('.committer', '.catalog_access')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
