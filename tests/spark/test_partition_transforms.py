"""Both forms of the partition transforms, held to pyiceberg's own transforms value by value."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec, partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.spark.writers import (
    arrow_values,
    check_spec,
    spark_sort_keys,
    spark_value,
)

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
INSTANTS = [
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2024, 2, 29, 23, 30, tzinfo=dt.UTC),
    dt.datetime(1900, 3, 1, 1, tzinfo=dt.UTC),
    dt.datetime(1960, 6, 15, 12, 34, 56, 789012, tzinfo=dt.UTC),
    dt.datetime(1582, 10, 10, 5, tzinfo=dt.UTC),
    dt.datetime(2262, 4, 11, 23, 47, 16, tzinfo=dt.UTC),
    None,
]
DATES: list[dt.date | None] = [dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 2, 29), dt.date(1900, 3, 1)]
DATES += [dt.date(1, 1, 1), dt.date(1582, 10, 10), dt.date(9999, 12, 31), None]
#: Each Iceberg source type: its Arrow and Spark types, and values to partition (every edge kind).
SOURCES: dict[str, tuple[IcebergType, pa.DataType, st.DataType, list[Any]]] = {
    "boolean": (BooleanType(), pa.bool_(), st.BooleanType(), [True, False, None]),
    "int": (IntegerType(), pa.int32(), st.IntegerType(), [-(2**31), -1, 0, 7, 2**31 - 1, None]),
    "long": (LongType(), pa.int64(), st.LongType(), [-(2**63), -1, 0, 2**40, 2**63 - 1, None]),
    "float": (FloatType(), pa.float32(), st.FloatType(), [-1.5, 0.0, 3.25, None]),
    "double": (DoubleType(), pa.float64(), st.DoubleType(), [-1e300, -0.5, 0.0, 2.5, None]),
    "string": (StringType(), pa.string(), st.StringType(), ["", "a/b=c", "é", "日本語", "🙂x", None]),
    "date": (DateType(), pa.date32(), st.DateType(), DATES),
    "timestamp": (
        TimestampType(),
        pa.timestamp("us"),
        st.TimestampNTZType(),
        [None if t is None else t.replace(tzinfo=None) for t in INSTANTS],
    ),
    "timestamptz": (TimestamptzType(), pa.timestamp("us", tz="UTC"), st.TimestampType(), INSTANTS),
}
TEMPORAL_SOURCES = ("date", "timestamp", "timestamptz")
TEMPORAL: list[Transform[Any, Any]] = [YearTransform(), MonthTransform(), DayTransform()]
CASES: list[tuple[Transform[Any, Any], str]] = [
    *[(IdentityTransform(), source) for source in SOURCES],
    *[(t, s) for t in TEMPORAL for s in TEMPORAL_SOURCES],
    *[(HourTransform(), s) for s in ("timestamp", "timestamptz")],
]


def _internal(value: Any) -> Any:
    """A Python value as pyiceberg's transforms take it: days of a date, microseconds of a timestamp."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return (aware - EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - EPOCH.date()).days
    return value


def _expected(transform: Transform[Any, Any], source: str) -> list[Any]:
    iceberg, _, _, values = SOURCES[source]
    apply = transform.transform(iceberg)
    return [apply(_internal(v)) for v in values]


def _id(case: tuple[Transform[Any, Any], str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("case", [*CASES, (VoidTransform(), "long"), (VoidTransform(), "date")], ids=_id)
def test_the_pyarrow_form_gives_pyiceberg_s_values(case: tuple[Transform[Any, Any], str]) -> None:
    transform, source = case
    iceberg, arrow_type, _, values = SOURCES[source]
    schema = Schema(NestedField(1, "c", iceberg))
    partition_field = PartitionField(1, 1000, transform, "p")
    got = arrow_values(transform, pa.array(values, arrow_type))
    # the pyarrow writer records a value as pyiceberg's partition record holds it (``_partition_key``)
    recorded = [partition_record_value(partition_field, v.as_py(), schema) for v in got]
    assert recorded == _expected(transform, source)


@pytest.mark.parametrize("zone", ["UTC", "America/Sao_Paulo"])
def test_the_spark_form_gives_pyiceberg_s_values_in_any_session_time_zone(spark: Any, zone: str) -> None:
    # every source a column of one frame (the shorter ones padded with nulls), every case one select
    height = max(len(values) for _, _, _, values in SOURCES.values())
    padded = {name: values + [None] * (height - len(values)) for name, (_, _, _, values) in SOURCES.items()}
    columns = ", ".join(f"{name} {spark_type.simpleString()}" for name, (_, _, spark_type, _) in SOURCES.items())
    rows = spark.createDataFrame(
        [(i, *row) for i, row in enumerate(zip(*padded.values(), strict=True))], f"i int, {columns}"
    )
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        cases = [spark_value(t, SOURCES[s][0], F.col(s)).alias(_id((t, s))) for t, s in CASES]
        got = rows.orderBy("i").select(*cases).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    for transform, source in CASES:
        expected = [transform.transform(SOURCES[source][0])(_internal(v)) for v in padded[source]]
        assert [r[_id((transform, source))] for r in got] == expected, _id((transform, source))


def test_sort_keys_are_the_partition_values_of_the_columns_present(spark: Any) -> None:
    schema = Schema(
        NestedField(1, "ts", TimestamptzType()),
        NestedField(2, "region", StringType()),
        NestedField(3, "absent", DateType()),
    )
    spec = PartitionSpec(
        PartitionField(1, 1000, HourTransform(), "ts_hour"),
        PartitionField(2, 1001, IdentityTransform(), "region"),
        PartitionField(1, 1002, VoidTransform(), "ts_null"),
        PartitionField(3, 1003, DayTransform(), "absent_day"),
    )
    keys = spark_sort_keys(spec, schema, {"ts", "region"})
    rows = spark.createDataFrame([(INSTANTS[0], "eu")], "ts timestamp, region string")
    assert list(rows.select(*keys).first()) == [-1, "eu"]


ACCEPTED = {
    "bucket": ("int", "long", "decimal", "date", "timestamp", "timestamptz", "string", "binary"),
    "truncate": ("int", "long", "decimal", "string", "binary"),
}
TYPES: dict[str, IcebergType] = {
    **{name: iceberg for name, (iceberg, _, _, _) in SOURCES.items()},
    "decimal": DecimalType(10, 2),
    "binary": BinaryType(),
}


def test_the_writer_accepts_exactly_the_transforms_it_computes() -> None:
    for transform, source in CASES:
        check_spec(
            "t", PartitionSpec(PartitionField(1, 1000, transform, "p")), Schema(NestedField(1, "c", TYPES[source]))
        )
    check_spec(
        "t", PartitionSpec(PartitionField(1, 1000, VoidTransform(), "p")), Schema(NestedField(1, "c", TYPES["decimal"]))
    )
    refused: list[tuple[Transform[Any, Any], str]] = [(IdentityTransform(), "decimal"), (IdentityTransform(), "binary")]
    refused += [(BucketTransform(16), s) for s in ACCEPTED["bucket"]]
    refused += [(TruncateTransform(4), s) for s in ACCEPTED["truncate"]]
    for transform, source in refused:
        spec = PartitionSpec(PartitionField(1, 1000, transform, "p"))
        with pytest.raises(InvalidSinkConfig, match=r"table 't' is partitioned in a way the epoch writer cannot write"):
            check_spec("t", spec, Schema(NestedField(1, "c", TYPES[source])))
