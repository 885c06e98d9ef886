"""Schema alignment and job specs decided without a Spark session."""

from __future__ import annotations

import datetime as dt

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    UUIDType,
)
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, SchemaMismatch
from airflow_provider_exactly_once.spark.alignment import plan_alignment
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec, FilesInput

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "price", DecimalType(12, 2)),
    NestedField(3, "ratio", DoubleType()),
    NestedField(4, "tags", ListType(5, StringType(), element_required=False)),
    NestedField(6, "address", StructType(NestedField(7, "city", StringType()), NestedField(8, "zip", IntegerType()))),
    NestedField(9, "note", StringType()),
)


def frame(*fields: st.StructField) -> st.StructType:
    return st.StructType(list(fields))


def plan(schema: st.StructType, evolve: bool = False):  # type: ignore[no-untyped-def]
    return plan_alignment(schema, TABLE, table="ns.t", last_column_id=9, allow_schema_evolution=evolve)


def test_lossless_promotions_are_cast_and_missing_optional_columns_are_left_to_nulls() -> None:
    result = plan(
        frame(
            st.StructField("ratio", st.FloatType()),
            st.StructField("id", st.IntegerType(), nullable=False),
            st.StructField("price", st.DecimalType(10, 2)),
            st.StructField("tags", st.ArrayType(st.StringType())),
        )
    )
    assert [(c.source, c.cast_to) for c in result.columns] == [
        ("id", st.LongType()),
        ("price", st.DecimalType(12, 2)),
        ("ratio", st.DoubleType()),
        ("tags", None),
    ]
    assert result.checked_required == []  # Spark proves id is not null
    assert [c.name for c in result.written_columns()] == ["id", "price", "ratio", "tags", "address", "note"]


def test_nullable_input_for_a_required_column_is_checked_on_the_executors() -> None:
    assert plan(frame(st.StructField("id", st.LongType()))).checked_required == ["id"]


def test_every_fault_is_named_at_once() -> None:
    with pytest.raises(SchemaMismatch) as caught:
        plan(
            frame(
                st.StructField("ratio", st.StringType()),
                st.StructField("price", st.DecimalType(12, 3)),
                st.StructField("Note", st.StringType()),
                st.StructField(
                    "address",
                    st.StructType([st.StructField("zip", st.IntegerType()), st.StructField("city", st.StringType())]),
                ),
                st.StructField("surprise", st.LongType()),
            )
        )
    message = str(caught.value)
    assert "required table column 'id' (long) is missing" in message
    assert "column 'ratio' is string in the input but double" in message
    assert "column 'price' is decimal(12,3) in the input but decimal(12, 2)" in message
    assert "input column 'Note' matches it only ignoring case" in message
    assert "struct column 'address' has fields ['zip', 'city']" in message
    assert "['surprise'] are not in table 'ns.t'" in message


def test_narrowing_is_refused() -> None:
    with pytest.raises(SchemaMismatch, match="'ratio' is double in the input but float"):
        plan_alignment(
            frame(st.StructField("ratio", st.DoubleType())),
            Schema(NestedField(1, "ratio", pytest.importorskip("pyiceberg.types").FloatType())),
            table="t",
            last_column_id=1,
            allow_schema_evolution=False,
        )


def test_added_columns_get_the_ids_add_column_will_assign() -> None:
    result = plan(
        frame(
            st.StructField("id", st.LongType()), st.StructField("b", st.ShortType()), st.StructField("a", st.DateType())
        ),
        evolve=True,
    )
    assert [(c.name, c.type) for c in result.added_columns] == [("b", "int"), ("a", "date")]
    assert [(f.name, f.field_id) for f in result.write_schema.fields[-2:]] == [("b", 10), ("a", 11)]
    with pytest.raises(SchemaMismatch, match="only primitive columns can be added"):
        plan(
            frame(st.StructField("id", st.LongType()), st.StructField("m", st.MapType(st.StringType(), st.LongType()))),
            evolve=True,
        )


def test_types_spark_cannot_produce_are_refused_but_may_be_missing() -> None:
    schema = Schema(NestedField(1, "u", UUIDType()), NestedField(2, "id", LongType()))
    with pytest.raises(SchemaMismatch, match="Iceberg type uuid, which Spark cannot produce"):
        plan_alignment(
            frame(st.StructField("u", st.StringType())),
            schema,
            table="t",
            last_column_id=2,
            allow_schema_evolution=False,
        )
    ok = plan_alignment(
        frame(st.StructField("id", st.LongType())), schema, table="t", last_column_id=2, allow_schema_evolution=False
    )
    assert [c.target for c in ok.columns] == ["id"]


def test_path_template_expansion() -> None:
    source = FilesInput(format="csv", path="/landing/{start:%Y/%m/%d/%H}", step_seconds=3600 * 6)
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert source.expanded_paths(start, start + dt.timedelta(days=1), 0) == [
        "/landing/2024/01/01/00",
        "/landing/2024/01/01/06",
        "/landing/2024/01/01/12",
        "/landing/2024/01/01/18",
    ]
    with pytest.raises(InvalidSinkConfig, match=r"\{nope\}"):
        FilesInput(format="csv", path="/landing/{nope}").expanded_paths(start, start, 0)


def test_job_spec_names_its_faults() -> None:
    with pytest.raises(InvalidSinkConfig) as caught:
        EpochJobSpec.load('{"sink_id": "a/b", "epoch": -1, "write_id": "x"}')
    message = str(caught.value)
    assert "sink_id" in message and "epoch" in message and "write_id" in message and "targets" in message
    assert "output_path" not in message  # optional: a job of one's own leaves its pre-commit in the write location
