"""The read schema derived from a table's declaration (``table_spec.spark_types``): for every type a
declaration accepts, either the Spark type the Spark writer fits that Iceberg type to, as Spark itself
parses the DDL, or a refusal naming the column."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.table_spec import PRIMITIVE_TYPES, declare_schema
from airflow_provider_exactly_once.table_spec.spark_types import spark_read_schema

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
#: The types the Spark writer cannot write (``spark.alignment.iceberg_to_spark`` has none for them).
REFUSED = ["time", "uuid", "fixed[16]", "timestamp_ns", "timestamptz_ns"]


def test_every_primitive_type_of_a_declaration_is_read_or_refused() -> None:
    concrete = {t.replace("(P, S)", "(12, 2)").replace("[N]", "[16]") for t in PRIMITIVE_TYPES}
    assert concrete == set(READ) | set(REFUSED)
    assert not set(READ) & set(REFUSED)


@pytest.mark.spark
def test_spark_parses_the_read_schema_into_the_types_the_writer_fits_the_table_to(spark: Any) -> None:
    from pyspark.sql import types as st

    from airflow_provider_exactly_once.spark.alignment import iceberg_to_spark

    columns: dict[str, Any] = {f"c_{i}": t for i, t in enumerate(READ)}
    columns["odd `name"] = "long"
    columns["tags"] = {"type": "list", "element": "string"}
    columns["attributes"] = {"type": "map", "key": "string", "value": "decimal(5, 1)"}
    columns["address"] = {"type": "struct", "fields": {"city": "string", "at": "timestamptz"}}
    declared = declare_schema(columns, where="t")

    ddl = spark_read_schema(declared, where="t")

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
        spark_read_schema(declared, where="table x")
