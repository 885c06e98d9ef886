"""pyiceberg ``DataFile`` objects built straight from the writers' descriptors.

The commit path never re-reads a Parquet footer (design.md, 'The Iceberg commit', step 3): thousands of files
would mean thousands of round trips to the object store inside the commit window. Everything Iceberg
keeps per file was computed by the writer (``descriptors.describe_parquet_file``); this module is its
exact inverse: column names back to the field ids of the schema being committed (after any columns
the same commit adds), base64 bounds back to bytes, partition values into a ``Record`` in the spec's
field order.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, SchemaMismatch
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue

_INTEGRAL = (
    IntegerType,
    LongType,
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)


def partition_field_names(spec: PartitionSpec) -> list[str]:
    return [field.name for field in spec.fields]


def partition_record(descriptor: DataFileDescriptor, *, spec: PartitionSpec, schema: Schema, table: str) -> Record:
    """The file's partition tuple, in the spec's field order, typed as the spec's result types."""
    expected = partition_field_names(spec)
    given = descriptor.partition
    if set(given) != set(expected):
        raise InvalidPreCommit(
            f"table {table!r}: data file {descriptor.path!r} has partition keys {sorted(given)}, "
            f"but partition spec {spec.spec_id} has {expected}"
        )
    values = []
    for field in spec.fields:
        result_type = field.transform.result_type(schema.find_field(field.source_id).field_type)
        values.append(_internal_value(given[field.name], result_type, table, descriptor.path, field.name))
    return Record(*values)


def _internal_value(value: PartitionValue, result_type: IcebergType, table: str, path: str, name: str) -> object:
    """Check (and for decimals and UUIDs, convert) one partition value in Iceberg's internal form."""
    if value is None:
        return None

    def wrong() -> InvalidPreCommit:
        return InvalidPreCommit(
            f"table {table!r}: data file {path!r}: partition value {value!r} of {name!r} does not fit the "
            f"partition type {result_type}"
        )

    if isinstance(result_type, _INTEGRAL):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong()
        return value
    if isinstance(result_type, BooleanType):
        if not isinstance(value, bool):
            raise wrong()
        return value
    if isinstance(result_type, FloatType | DoubleType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong()
        return float(value)
    if isinstance(result_type, StringType):
        if not isinstance(value, str):
            raise wrong()
        return value
    if isinstance(result_type, DecimalType):
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise wrong()  # a float would already have lost the decimal's exactness
        try:
            return Decimal(str(value))
        except InvalidOperation:
            raise wrong() from None
    if isinstance(result_type, UUIDType):
        try:
            return uuid.UUID(str(value))
        except ValueError:
            raise wrong() from None
    raise InvalidPreCommit(
        f"table {table!r}: partition field {name!r} has type {result_type}, which descriptors cannot carry"
    )


def _by_field_id(
    values: Mapping[str, int], field_ids: Mapping[str, int], table: str, path: str, what: str
) -> dict[int, int]:
    return {_field_id(field_ids, name, table, path, what): value for name, value in values.items()}


def _field_id(field_ids: Mapping[str, int], name: str, table: str, path: str, what: str) -> int:
    try:
        return field_ids[name]
    except KeyError:
        raise SchemaMismatch(
            f"table {table!r}: data file {path!r} has {what} for column {name!r}, which is not in the table"
        ) from None


def build_data_files(
    descriptors: Sequence[DataFileDescriptor],
    *,
    schema: Schema,
    spec: PartitionSpec,
    spec_id: int,
    table: str,
) -> list[DataFile]:
    """The manifest entries' data files for a whole write: the name index is built once, not per file."""
    field_ids = index_by_name(schema)
    return [
        build_data_file(
            descriptor,
            schema=schema,
            spec=spec,
            spec_id=spec_id,
            table=table,
            field_ids=field_ids,
        )
        for descriptor in descriptors
    ]


def build_data_file(
    descriptor: DataFileDescriptor,
    *,
    schema: Schema,
    spec: PartitionSpec,
    spec_id: int,
    table: str,
    field_ids: Mapping[str, int] | None = None,
) -> DataFile:
    """The manifest entry's data file for ``descriptor``, against the schema being committed. It is
    built in pyiceberg's read layout, whatever the table's format version: the manifest writers
    convert it to theirs (one built in format 1's layout fails the version 1 writer)."""
    path = descriptor.path
    if field_ids is None:
        field_ids = index_by_name(schema)

    def bounds(which: str, raw: Mapping[str, bytes]) -> dict[int, bytes]:
        return {_field_id(field_ids, name, table, path, which): value for name, value in raw.items()}

    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat(descriptor.format.upper()),
        partition=partition_record(descriptor, spec=spec, schema=schema, table=table),
        record_count=descriptor.record_count,
        file_size_in_bytes=descriptor.file_size_in_bytes,
        column_sizes=_by_field_id(descriptor.column_sizes, field_ids, table, path, "column sizes"),
        value_counts=_by_field_id(descriptor.value_counts, field_ids, table, path, "value counts"),
        null_value_counts=_by_field_id(descriptor.null_value_counts, field_ids, table, path, "null counts"),
        nan_value_counts=_by_field_id(descriptor.nan_value_counts, field_ids, table, path, "NaN counts"),
        lower_bounds=bounds("lower bounds", descriptor.bound_bytes("lower")),
        upper_bounds=bounds("upper bounds", descriptor.bound_bytes("upper")),
        split_offsets=list(descriptor.split_offsets) if descriptor.split_offsets is not None else None,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    # Not a manifest field, so from_args would drop it; the append files the entry under this spec.
    data_file.spec_id = spec_id
    return data_file
