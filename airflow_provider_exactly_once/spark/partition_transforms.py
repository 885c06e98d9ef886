"""The Iceberg partition transforms the epoch writer writes, in the two forms its writers compute.

Identity, void, year, month, day and hour: ``check_spec`` refuses any other transform when the
table is loaded, before the input is read. The pyarrow writer computes a batch's partition values
with ``arrow_values``; Spark's Parquet writer computes them as a column with ``spark_value``, which
is also the key rows are grouped by before the pyarrow writer sees them (``spark_sort_keys``). Both
give the value pyiceberg's own transform gives (the tests hold them to it), independent of any
session time zone.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.spark.changes import quote

#: Source types whose identity partition value fits the pre-commit's JSON scalars.
IDENTITY_SOURCES = (
    BooleanType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    StringType,
    DateType,
    TimestampType,
    TimestamptzType,
)
TEMPORAL = (YearTransform, MonthTransform, DayTransform, HourTransform)
_DAY_MICROS = 86_400_000_000
_HOUR_MICROS = 3_600_000_000


def check_spec(table: str, spec: PartitionSpec, schema: Schema) -> None:
    """Refuse a partition spec with a transform the writer cannot compute, naming every fault."""
    faults = []
    for partition_field in spec.fields:
        transform: Transform[Any, Any] = partition_field.transform
        source = schema.find_field(partition_field.source_id)
        if isinstance(transform, IdentityTransform):
            if not isinstance(source.field_type, IDENTITY_SOURCES):
                faults.append(
                    f"identity partition field {partition_field.name!r} on {source.field_type} column "
                    f"{source.name!r} (supported: boolean, int, long, float, double, string, date, timestamp)"
                )
        elif not isinstance(transform, (*TEMPORAL, VoidTransform)):
            faults.append(f"partition field {partition_field.name!r} uses transform {transform}")
    if faults:
        raise InvalidSinkConfig(
            f"table {table!r} is partitioned in a way the epoch writer cannot write: {'; '.join(faults)}; "
            "it writes identity, year, month, day and hour partitions"
        )


def arrow_values(transform: Transform[Any, Any], array: pa.Array) -> pa.Array:
    """Partition values of a column, computed with pyarrow alone.

    pyiceberg 0.12 needs the optional ``pyiceberg-core`` (Rust) for its temporal ``pyarrow_transform``;
    these four are simple enough to compute exactly here: floor to the unit in UTC, then count units
    since 1970 (day and hour by exact division of the floored microseconds, which is also right for
    instants before 1970).
    """
    if isinstance(transform, IdentityTransform):
        return array
    if isinstance(transform, VoidTransform):
        return pa.nulls(len(array), type=pa.int32())
    if pa.types.is_timestamp(array.type):
        naive = array.cast(pa.int64()).cast(pa.timestamp("us"))
    elif pa.types.is_date(array.type):
        naive = array.cast(pa.date32()).cast(pa.timestamp("us"))
    else:
        raise TypeError(f"transform {transform} needs a date or timestamp column, not {array.type}")
    if isinstance(transform, YearTransform):
        return pc.subtract(pc.year(naive), 1970).cast(pa.int32())
    if isinstance(transform, MonthTransform):
        months = pc.add(pc.multiply(pc.subtract(pc.year(naive), 1970), 12), pc.subtract(pc.month(naive), 1))
        return months.cast(pa.int32())
    unit, micros = ("day", _DAY_MICROS) if isinstance(transform, DayTransform) else ("hour", _HOUR_MICROS)
    floored = pc.floor_temporal(naive, unit=unit).cast(pa.int64())
    return pc.divide(floored, micros).cast(pa.int32())


def spark_value(transform: Transform[Any, Any], source_type: IcebergType, source: Column) -> Column:
    """A Spark expression for the Iceberg partition value of ``source``: the value itself for an
    identity transform, the days of a date and the microseconds of a timestamp (their Iceberg
    representation), the unit ordinal of a temporal one."""
    if isinstance(transform, IdentityTransform):
        if isinstance(source_type, DateType):
            return F.unix_date(source)
        if isinstance(source_type, TimestampType | TimestamptzType):
            return _micros(source_type, source)
        return source
    if isinstance(source_type, DateType):
        days = F.unix_date(source)
        date = source
    else:
        micros = _micros(source_type, source)
        if isinstance(transform, HourTransform):
            return _floor_div(micros, _HOUR_MICROS)
        days = _floor_div(micros, _DAY_MICROS)
        date = F.date_from_unix_date(days)
    if isinstance(transform, DayTransform):
        return days.cast("int")
    if isinstance(transform, MonthTransform):
        return ((F.year(date) - 1970) * 12 + F.month(date) - 1).cast("int")
    if isinstance(transform, YearTransform):
        return (F.year(date) - 1970).cast("int")
    raise TypeError(f"transform {transform} is not written by the epoch writer")  # pragma: no cover - refused


def spark_sort_keys(spec: PartitionSpec, write_schema: Schema, present: set[str]) -> list[Column]:
    """Spark expressions that group rows exactly as the partition transforms do, to shuffle and sort
    by before the pyarrow writer, which closes its file whenever the value changes; a transform
    whose source column is not in the input (all nulls) needs no key, nor does void."""
    keys = []
    for partition_field in spec.fields:
        name = write_schema.find_column_name(partition_field.source_id)
        if name is None or name.split(".")[0] not in present or isinstance(partition_field.transform, VoidTransform):
            continue
        column = F.col(".".join(quote(part) for part in name.split(".")))
        source_type = write_schema.find_field(partition_field.source_id).field_type
        keys.append(spark_value(partition_field.transform, source_type, column))
    return keys


def _micros(source_type: IcebergType, source: Column) -> Column:
    if isinstance(source_type, TimestamptzType):
        return F.unix_micros(source)
    # timestamp without zone: microseconds of its wall-clock time since 1970-01-01 00:00, which is
    # what Iceberg stores; no session time zone is involved.
    return F.timestamp_diff("MICROSECOND", F.lit("1970-01-01 00:00:00").cast("timestamp_ntz"), source)


def _floor_div(micros: Column, unit: int) -> Column:
    """Exact floor division of a 64-bit count: the difference is a multiple of ``unit``, and the
    quotient (below 2^31) survives the double division within far less than 0.5."""
    return F.round((micros - F.pmod(micros, F.lit(unit))) / F.lit(unit)).cast("int")
