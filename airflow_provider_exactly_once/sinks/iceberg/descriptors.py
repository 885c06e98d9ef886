"""Describe a Parquet file the way Iceberg wants it, where the file was written (a Spark executor).

The statistics are pyiceberg's own (so the table's metrics modes and truncation hold), then keyed by
column name with bounds base64-encoded (design.md, "Vocabulary"); ``data_files.build_data_file`` is
the exact inverse. Columns the table does not have yet get provisional ids past its highest, only for
this computation; Parquet without field ids is matched by column path.
"""

from __future__ import annotations

import base64
import itertools
import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.types import DoubleType, FloatType

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue


def describe_parquet_file(
    path: str,
    *,
    table_schema: Schema,
    partition: Mapping[str, PartitionValue],
    writer: str | None = None,
    table_properties: Mapping[str, str] | None = None,
    parquet_metadata: pq.FileMetaData | None = None,
    file_size_in_bytes: int | None = None,
) -> DataFileDescriptor:
    """The descriptor of one written Parquet file.

    Pass ``parquet_metadata`` and ``file_size_in_bytes`` when the writer has them (a closed
    ``ParquetWriter`` does): then nothing is read back from storage.
    """
    properties = dict(table_properties or {})
    if parquet_metadata is None or file_size_in_bytes is None:
        input_file = PyArrowFileIO(properties).new_input(path)
        if parquet_metadata is None:
            with input_file.open() as stream:
                parquet_metadata = pq.read_metadata(stream)
        if file_size_in_bytes is None:
            file_size_in_bytes = len(input_file)

    schema = _schema_with_new_columns(table_schema, parquet_metadata.schema.to_arrow_schema(), path)
    try:
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=parquet_metadata,
            stats_columns=compute_statistics_plan(schema, properties),
            parquet_column_mapping=parquet_path_to_id_mapping(schema),
        )
    except KeyError as exc:
        raise InvalidPreCommit(f"data file {path!r}: column {exc.args[0]!r} does not match the table schema") from None
    serialized = statistics.to_serialized_dict()
    _drop_nan_bounds(schema, serialized)

    def by_name(values: Mapping[int, int]) -> dict[str, int]:
        return {_name(schema, field_id): value for field_id, value in values.items()}

    def encoded(values: Mapping[int, bytes]) -> dict[str, str]:
        return {_name(schema, field_id): base64.b64encode(value).decode("ascii") for field_id, value in values.items()}

    return DataFileDescriptor(
        path=path,
        format="parquet",
        record_count=serialized["record_count"],
        file_size_in_bytes=file_size_in_bytes,
        partition=dict(partition),
        column_sizes=by_name(serialized["column_sizes"]),
        value_counts=by_name(serialized["value_counts"]),
        null_value_counts=by_name(serialized["null_value_counts"]),
        nan_value_counts=by_name(serialized["nan_value_counts"]),
        lower_bounds=encoded(serialized["lower_bounds"]),
        upper_bounds=encoded(serialized["upper_bounds"]),
        split_offsets=list(serialized["split_offsets"]),
        writer=writer,
    )


def _drop_nan_bounds(schema: Schema, serialized: dict[str, Any]) -> None:
    """Iceberg bounds are never NaN (readers would prune on them); parquet-java, unlike pyarrow,
    puts a NaN into a floating column's footer minimum or maximum. Such a column gets no bounds."""
    for field_id in set(serialized["lower_bounds"]) | set(serialized["upper_bounds"]):
        field_type = schema.find_type(field_id)
        if not isinstance(field_type, FloatType | DoubleType):
            continue
        bounds = [serialized[key].get(field_id) for key in ("lower_bounds", "upper_bounds")]
        if any(b is not None and math.isnan(float(from_bytes(field_type, b))) for b in bounds):
            serialized["lower_bounds"].pop(field_id, None)
            serialized["upper_bounds"].pop(field_id, None)


def _name(schema: Schema, field_id: int) -> str:
    name = schema.find_column_name(field_id)
    if name is None:  # pragma: no cover - ids come from this very schema
        raise InvalidPreCommit(f"field id {field_id} is not in the schema")
    return name


def _schema_with_new_columns(table_schema: Schema, arrow_schema: pa.Schema, path: str) -> Schema:
    """``table_schema`` plus the file's top-level columns it lacks, with provisional ids."""
    known = {field.name for field in table_schema.fields}
    extra = [field for field in arrow_schema if field.name not in known]
    if not extra:
        return table_schema
    # A throwaway name mapping gives pyarrow_to_schema the ids it needs; fresh ids then replace them.
    counter = itertools.count(1)
    mapping = NameMapping([_mapped(field, counter) for field in extra])
    try:
        converted = pyarrow_to_schema(pa.schema(extra), name_mapping=mapping)
    except (ValueError, TypeError) as exc:
        raise InvalidPreCommit(f"data file {path!r}: cannot convert new column(s) to Iceberg types: {exc}") from None
    next_id = itertools.count(table_schema.highest_field_id + 1)
    fresh = assign_fresh_schema_ids(converted, lambda: next(next_id))
    return Schema(*table_schema.fields, *fresh.fields, schema_id=table_schema.schema_id)


def _mapped(field: pa.Field, counter: itertools.count[int]) -> MappedField:
    field_id = next(counter)
    children: list[MappedField] = []
    field_type = field.type
    if pa.types.is_struct(field_type):
        children = [_mapped(field_type.field(i), counter) for i in range(field_type.num_fields)]
    elif pa.types.is_list(field_type) or pa.types.is_large_list(field_type):
        children = [_mapped(pa.field("element", field_type.value_type), counter)]
    elif pa.types.is_map(field_type):
        children = [
            _mapped(pa.field("key", field_type.key_type), counter),
            _mapped(pa.field("value", field_type.item_type), counter),
        ]
    return MappedField(field_id=field_id, names=[field.name], fields=children)
