"""The type mapping held to Spark itself. The read schema derived from a table's declaration
(``type_mapping.spark_read_schema``): for every type a declaration accepts, either the Spark type the
Spark writer fits that Iceberg type to, as Spark itself parses the DDL, or a refusal naming the
column. The field-id schema (``type_mapping.spark_schema``): the ids Spark's Parquet writer writes and
its reader resolves columns by, whatever the columns are called."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, ListType, LongType, NestedField, StringType, StructType

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.spark.writers import session_conf
from airflow_provider_exactly_once.table_spec import PRIMITIVE_TYPES, declare_schema
from airflow_provider_exactly_once.type_mapping import spark_read_schema, spark_schema

#: Each primitive type of a declaration (``PRIMITIVE_TYPES``), parameters filled in.
READ = [
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "decimal(12, 2)",
    "date",
    "timestamp",
    "timestamptz",
    "string",
    "binary",
]
#: The types the Spark writer cannot write (``type_mapping.iceberg_to_spark`` has none for them).
REFUSED = ["time", "uuid", "fixed[16]", "timestamp_ns", "timestamptz_ns"]


def test_every_primitive_type_of_a_declaration_is_read_or_refused() -> None:
    concrete = {t.replace("(P, S)", "(12, 2)").replace("[N]", "[16]") for t in PRIMITIVE_TYPES}
    assert concrete == set(READ) | set(REFUSED)
    assert not set(READ) & set(REFUSED)


@pytest.mark.spark
def test_spark_parses_the_read_schema_into_the_types_the_writer_fits_the_table_to(spark: Any) -> None:
    from pyspark.sql import types as st

    from airflow_provider_exactly_once.type_mapping import iceberg_to_spark

    columns: dict[str, Any] = {f"c_{i}": t for i, t in enumerate(READ)}
    columns["odd `name"] = "long"
    columns["tags"] = {"type": "list", "element": "string"}
    columns["attributes"] = {"type": "map", "key": "string", "value": "decimal(5, 1)"}
    columns["address"] = {"type": "struct", "fields": {"city": "string", "at": "timestamptz"}}
    declared = declare_schema(columns, where="t")

    ddl = spark_read_schema(declared.json, where="t")

    read = spark.createDataFrame([], ddl).schema
    expected = iceberg_to_spark(declared.to_pyiceberg().as_struct())
    assert isinstance(expected, st.StructType)
    assert read == expected
    assert spark_read_schema(declared.to_pyiceberg(), where="t") == ddl  # a pyiceberg Schema reads the same


@pytest.mark.parametrize("refused", REFUSED)
def test_a_type_the_spark_write_cannot_write_is_refused_naming_the_column(refused: str) -> None:
    declared = declare_schema({"id": "long", "nested": {"type": "list", "element": refused}}, where="t")
    with pytest.raises(
        InvalidSinkConfig,
        match=rf"^table x: column 'nested.element': the Spark write cannot write an Iceberg {re.escape(refused)}",
    ):
        spark_read_schema(declared.json, where="table x")


@pytest.mark.spark
def test_spark_writes_the_field_ids_and_reads_columns_back_by_them_under_other_names(
    spark: Any, tmp_path: Path
) -> None:
    point = StructType(NestedField(4, "x", DoubleType()), NestedField(5, "y", DoubleType()))
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "where", point),
        NestedField(3, "path", ListType(6, StructType(NestedField(7, "name", StringType())))),
    )
    out = str(tmp_path / "files")
    rows = [(1, (1.5, 2.5), [("a",), ("b",)])]
    with session_conf(spark, {"spark.sql.parquet.fieldId.write.enabled": "true"}):
        spark.createDataFrame(rows, spark_schema(schema)).coalesce(1).write.parquet(out)

    [footer] = [pq.read_schema(p) for p in Path(out).glob("*.parquet")]

    def ids(field: Any) -> Any:
        own = int(field.metadata[b"PARQUET:field_id"]) if field.metadata else None
        inner = field.type.value_type if hasattr(field.type, "value_type") else field.type
        return (field.name, own, [ids(f) for f in inner] if hasattr(inner, "names") else [])

    assert [ids(f) for f in footer] == [
        ("id", 1, []),
        ("where", 2, [("x", 4, []), ("y", 5, [])]),
        ("path", 3, [("name", 7, [])]),  # the element has no id of its own
    ]
    # Every column and struct field renamed, in another order: read by id, the values follow the ids.
    renamed = Schema(
        NestedField(
            2, "place", StructType(NestedField(5, "north", DoubleType()), NestedField(4, "east", DoubleType()))
        ),
        NestedField(1, "key", LongType(), required=True),
        NestedField(3, "route", ListType(6, StructType(NestedField(7, "stop", StringType())))),
    )
    with session_conf(spark, {"spark.sql.parquet.fieldId.read.enabled": "true"}):
        [row] = spark.read.schema(spark_schema(renamed)).parquet(out).collect()
    assert row.asDict(recursive=True) == {
        "place": {"north": 2.5, "east": 1.5},
        "key": 1,
        "route": [{"stop": "a"}, {"stop": "b"}],
    }
