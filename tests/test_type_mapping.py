"""The one type mapping (``type_mapping``) held type by type, without a Spark session: every Iceberg
primitive as Spark's and back, nested types with their nullability, the field-id schema, the text a
written type travels as, and which type goes into which. Spark itself parses the DDL and writes and
reads the field ids in ``tests/spark/test_type_mapping_in_spark.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, SchemaMismatch
from airflow_provider_exactly_once.type_mapping import (
    FIELD_ID,
    SPARK_TYPES,
    casts_to,
    field_reads_as,
    iceberg_to_spark,
    parse_type,
    reads_as,
    spark_read_schema,
    spark_schema,
    spark_schema_to_iceberg,
    spark_to_iceberg,
    type_text,
)

REPO = Path(__file__).resolve().parents[1]

#: Each Iceberg primitive Spark has, its Spark type and its Spark DDL.
BOTH_WAYS: list[tuple[IcebergType, st.DataType, str]] = [
    (BooleanType(), st.BooleanType(), "BOOLEAN"),
    (IntegerType(), st.IntegerType(), "INT"),
    (LongType(), st.LongType(), "BIGINT"),
    (FloatType(), st.FloatType(), "FLOAT"),
    (DoubleType(), st.DoubleType(), "DOUBLE"),
    (DecimalType(9, 2), st.DecimalType(9, 2), "DECIMAL(9, 2)"),
    (DecimalType(38, 10), st.DecimalType(38, 10), "DECIMAL(38, 10)"),
    (DateType(), st.DateType(), "DATE"),
    (TimestampType(), st.TimestampNTZType(), "TIMESTAMP_NTZ"),  # without zone
    (TimestamptzType(), st.TimestampType(), "TIMESTAMP"),  # with zone: Spark's instant
    (StringType(), st.StringType(), "STRING"),
    (BinaryType(), st.BinaryType(), "BINARY"),
]
#: The Iceberg primitives Spark has no type for: pyspark would read some as other types.
NO_SPARK_TYPE: list[IcebergType] = [
    TimeType(),
    UUIDType(),
    FixedType(16),
    TimestampNanoType(),
    TimestamptzNanoType(),
    UnknownType(),
]


def test_the_cases_cover_every_primitive_of_the_table() -> None:
    assert {str(i) for i, _, _ in BOTH_WAYS if not isinstance(i, DecimalType)} == set(SPARK_TYPES)


@pytest.mark.parametrize(("iceberg", "spark", "ddl"), BOTH_WAYS, ids=lambda v: str(v))
def test_every_primitive_spark_has_maps_both_ways_and_to_its_ddl(
    iceberg: IcebergType, spark: st.DataType, ddl: str
) -> None:
    assert iceberg_to_spark(iceberg) == spark
    assert spark_to_iceberg(spark, "c") == iceberg
    schema = Schema(NestedField(1, "c", iceberg))
    assert spark_read_schema(schema, where="t") == f"c {ddl}"
    assert spark_read_schema(json.loads(schema.model_dump_json()), where="t") == f"c {ddl}"


@pytest.mark.parametrize("iceberg", NO_SPARK_TYPE, ids=str)
def test_a_primitive_spark_has_no_type_for_has_none_at_any_depth(iceberg: IcebergType) -> None:
    nested = [
        iceberg,
        StructType(NestedField(1, "a", LongType()), NestedField(2, "b", iceberg)),
        ListType(1, iceberg),
        MapType(1, StringType(), 2, iceberg),
        ListType(1, StructType(NestedField(2, "m", MapType(3, StringType(), 4, iceberg)))),
    ]
    assert [iceberg_to_spark(t) for t in nested] == [None] * len(nested)
    with pytest.raises(
        InvalidSinkConfig, match=rf"^t: column 'x.element.m.value': .* Iceberg {re.escape(str(iceberg))} column"
    ):
        spark_read_schema(Schema(NestedField(5, "x", nested[-1])), where="t")
    with pytest.raises(
        SchemaMismatch, match=rf"\['x \(list<.*{re.escape(str(iceberg))}>>>\)'\] have Iceberg types Spark cannot"
    ):
        spark_schema(Schema(NestedField(1, "id", LongType()), NestedField(5, "x", nested[-1])))


def test_spark_types_iceberg_lacks_are_stored_losslessly_or_refused_naming_the_nested_column() -> None:
    assert [spark_to_iceberg(t, "c") for t in (st.ByteType(), st.ShortType())] == [IntegerType(), IntegerType()]
    assert [spark_to_iceberg(t, "c") for t in (st.VarcharType(3), st.CharType(2))] == [StringType(), StringType()]
    for refused in (st.NullType(), st.DayTimeIntervalType(), st.CalendarIntervalType(), st.VariantType()):
        nested = st.StructType([st.StructField("x", st.ArrayType(st.MapType(st.StringType(), refused)))])
        with pytest.raises(
            SchemaMismatch, match=rf"^column 'c.x.element.value' has Spark type {refused.simpleString()}, which Iceberg"
        ):
            spark_to_iceberg(nested, "c")


def test_nested_types_carry_their_nullability_to_spark_and_come_back_optional() -> None:
    iceberg = StructType(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "tags", ListType(3, StringType(), element_required=True)),
        NestedField(4, "scores", MapType(5, StringType(), 6, DoubleType(), value_required=False), required=True),
        NestedField(7, "inner", StructType(NestedField(8, "at", TimestamptzType(), required=True))),
    )
    spark = st.StructType(
        [
            st.StructField("id", st.LongType(), nullable=False),
            st.StructField("tags", st.ArrayType(st.StringType(), containsNull=False)),
            st.StructField("scores", st.MapType(st.StringType(), st.DoubleType(), True), nullable=False),
            st.StructField("inner", st.StructType([st.StructField("at", st.TimestampType(), nullable=False)])),
        ]
    )
    assert iceberg_to_spark(iceberg) == spark
    assert iceberg_to_spark(iceberg.fields[1].field_type) == spark["tags"].dataType  # a list alone
    assert iceberg_to_spark(iceberg.fields[2].field_type) == spark["scores"].dataType  # a map alone
    # Back: every field, element and value optional; ids in the order a field's parent reaches it.
    assert spark_to_iceberg(spark, "") == StructType(
        NestedField(1, "id", LongType()),
        NestedField(2, "tags", ListType(3, StringType(), element_required=False)),
        NestedField(4, "scores", MapType(5, StringType(), 6, DoubleType(), value_required=False)),
        NestedField(7, "inner", StructType(NestedField(8, "at", TimestamptzType()))),
    )


def test_a_dataframe_schema_becomes_an_iceberg_schema_with_fresh_ids() -> None:
    frame = st.StructType(
        [
            st.StructField("id", st.LongType(), nullable=False),
            st.StructField("where", st.StructType([st.StructField("city", st.StringType())])),
            st.StructField("n", st.ShortType()),
        ]
    )
    schema = spark_schema_to_iceberg(frame)
    assert schema == Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "where", StructType(NestedField(4, "city", StringType()))),
        NestedField(3, "n", IntegerType()),
    )
    with pytest.raises(SchemaMismatch, match=r"duplicate column name\(s\) \['id'\]"):
        spark_schema_to_iceberg(st.StructType([*frame.fields, st.StructField("id", st.StringType())]))


def test_the_field_id_schema_puts_each_struct_fields_id_at_any_depth() -> None:
    point = StructType(NestedField(11, "x", DoubleType(), required=True), NestedField(12, "y", DoubleType()))
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "at", TimestampType()),
        NestedField(3, "where", StructType(NestedField(4, "point", point), NestedField(5, "name", StringType()))),
        NestedField(6, "path", ListType(7, point, element_required=True)),
        NestedField(8, "named", MapType(9, StringType(), 10, point)),
    )
    spark = spark_schema(schema)

    def ids(data_type: st.DataType) -> list[object]:
        if isinstance(data_type, st.StructType):
            return [(f.name, f.metadata[FIELD_ID], ids(f.dataType)) for f in data_type.fields]
        if isinstance(data_type, st.ArrayType):
            return ids(data_type.elementType)
        if isinstance(data_type, st.MapType):
            return ids(data_type.valueType)
        return []

    point_ids = [("x", 11, []), ("y", 12, [])]
    assert ids(spark) == [
        ("id", 1, []),
        ("at", 2, []),
        ("where", 3, [("point", 4, point_ids), ("name", 5, [])]),
        ("path", 6, point_ids),
        ("named", 8, point_ids),
    ]
    without_ids = iceberg_to_spark(schema.as_struct())
    assert isinstance(without_ids, st.StructType)
    # The same types and nullability as the mapping's; only the metadata differs.
    assert spark.simpleString() == without_ids.simpleString()
    assert [f.nullable for f in spark.fields] == [False, True, True, True, True]
    assert spark["path"].dataType == st.ArrayType(spark["where"].dataType["point"].dataType, containsNull=False)


@pytest.mark.parametrize(
    "iceberg",
    [
        *(i for i, _, _ in BOTH_WAYS),
        *NO_SPARK_TYPE,
        StructType(NestedField(1, "a", DecimalType(10, 2), required=True, doc="money")),
        ListType(1, TimestamptzType(), element_required=True),
        MapType(1, StringType(), 2, ListType(3, UUIDType())),
    ],
    ids=str,
)
def test_a_written_type_reads_back_from_its_text(iceberg: IcebergType) -> None:
    text = type_text(iceberg)
    assert parse_type(text, table="t", column="c") == iceberg
    assert (text == str(iceberg)) is iceberg.is_primitive  # nested types travel as JSON


def test_type_text_spellings_and_faults() -> None:
    assert parse_type("decimal(10,2)", table="t", column="c") == DecimalType(10, 2)
    with pytest.raises(InvalidPreCommit, match=r"^table 't': column 'c' has an unknown Iceberg type 'bigint'"):
        parse_type("bigint", table="t", column="c")
    with pytest.raises(InvalidPreCommit, match=r"^table 't': column 'c' has a type that is not valid JSON"):
        parse_type('{"type": "list"', table="t", column="c")


@pytest.mark.parametrize(
    ("source", "target", "cast"),
    [
        (st.LongType(), LongType(), False),
        (st.VarcharType(5), StringType(), False),  # a string already
        (st.ByteType(), IntegerType(), True),
        (st.ShortType(), LongType(), True),
        (st.IntegerType(), LongType(), True),
        (st.FloatType(), DoubleType(), True),
        (st.DecimalType(10, 2), DecimalType(12, 2), True),
        (st.NullType(), DateType(), True),  # typed nulls
        (st.ArrayType(st.IntegerType()), ListType(1, LongType(), element_required=False), True),
    ],
)
def test_lossless_casts_into_the_table(source: st.DataType, target: IcebergType, cast: bool) -> None:
    faults: list[str] = []
    assert casts_to(source, target, "c", faults) is cast
    assert faults == []


@pytest.mark.parametrize(
    ("source", "target", "fault"),
    [
        (st.LongType(), IntegerType(), "column 'c' is bigint in the input but int in the table (only lossless"),
        (st.DoubleType(), FloatType(), "column 'c' is double in the input but float"),
        (st.DecimalType(12, 3), DecimalType(12, 2), "column 'c' is decimal(12,3) in the input but decimal(12, 2)"),
        (st.DecimalType(14, 2), DecimalType(12, 2), "column 'c' is decimal(14,2) in the input but decimal(12, 2)"),
        (st.TimestampType(), TimestampType(), "column 'c' is timestamp in the input but timestamp in the table"),
        (st.StringType(), UUIDType(), "column 'c' has Iceberg type uuid, which Spark cannot produce"),
        (st.NullType(), UUIDType(), "column 'c': Spark cannot produce Iceberg type uuid"),
        (
            st.StructType([st.StructField("b", st.LongType()), st.StructField("a", st.LongType())]),
            StructType(NestedField(1, "a", LongType()), NestedField(2, "b", LongType())),
            "struct column 'c' has fields ['b', 'a'] in the input but ['a', 'b'] in the table",
        ),
        (
            st.StructType([st.StructField("a", st.LongType())]),
            StructType(NestedField(1, "a", LongType(), required=True)),
            "nested field 'c.a' is required in the table but nullable in the input",
        ),
        (
            st.ArrayType(st.LongType()),
            ListType(1, LongType(), element_required=True),
            "list column 'c' has required elements in the table but nullable ones in the input",
        ),
        (
            st.MapType(st.StringType(), st.LongType()),
            MapType(1, StringType(), 2, LongType(), value_required=True),
            "map column 'c' has required values in the table but nullable ones in the input",
        ),
        (st.ArrayType(st.LongType()), MapType(1, StringType(), 2, LongType()), "column 'c' is array<bigint> in the"),
    ],
)
def test_what_does_not_cast_into_the_table_is_named(source: st.DataType, target: IcebergType, fault: str) -> None:
    faults: list[str] = []
    casts_to(source, target, "c", faults)
    assert len(faults) == 1 and faults[0].startswith(fault), faults


def test_a_written_type_reads_as_the_tables_by_name_widened_only_as_readers_widen() -> None:
    assert reads_as(IntegerType(), LongType(), "c") is None
    assert reads_as(FloatType(), DoubleType(), "c") is None
    assert (
        reads_as(DecimalType(10, 2), DecimalType(12, 2), "c")
        == "c: written as decimal(10, 2), the table has decimal(12, 2)"
    )
    assert reads_as(LongType(), IntegerType(), "c") == "c: written as long, the table has int"
    assert (
        reads_as(StringType(), BinaryType(), "c") == "c: written as string, the table has binary"
    )  # pyiceberg's promote would
    table = StructType(
        NestedField(1, "a", LongType(), required=True),
        NestedField(2, "b", StringType()),
        NestedField(3, "z", DateType()),
    )
    # by name, in any order; an optional field may be absent
    assert (
        reads_as(
            StructType(NestedField(9, "b", StringType()), NestedField(8, "a", IntegerType(), required=True)), table, "c"
        )
        is None
    )
    assert (
        reads_as(StructType(NestedField(9, "b", StringType())), table, "c")
        == "c.a: required in the table but not written"
    )
    written = StructType(NestedField(8, "a", LongType()), NestedField(9, "q", LongType()))
    assert reads_as(written, table, "c") == "c.a: written as optional (may hold nulls), required in the table"
    written = StructType(NestedField(8, "a", LongType(), required=True), NestedField(9, "q", LongType()))
    assert reads_as(written, table, "c") == "c: fields ['q'] are not in the table"
    assert reads_as(ListType(1, LongType(), element_required=False), ListType(1, LongType()), "c") == (
        "c.element: written as optional (may hold nulls), required in the table"
    )
    assert reads_as(MapType(1, StringType(), 2, IntegerType()), MapType(1, StringType(), 2, StringType()), "c") == (
        "c.value: written as int, the table has string"
    )
    assert reads_as(LongType(), ListType(1, LongType()), "c") == "c: long cannot be written into list<long>"
    required, optional = NestedField(1, "c", IntegerType(), required=True), NestedField(1, "c", LongType())
    assert field_reads_as(required, optional, "c") is None
    assert field_reads_as(optional, required, "c") == "c: written as optional (may hold nulls), required in the table"


def test_the_read_schema_is_made_without_importing_pyiceberg_pyarrow_or_pyspark() -> None:
    """A DAG's parse makes it (``task_groups``), where either library would cost more than the package."""
    code = (
        "import json, sys\n"
        "from airflow_provider_exactly_once.table_spec import declare_schema\n"
        "from airflow_provider_exactly_once.type_mapping import spark_read_schema\n"
        "schema = declare_schema({'id': 'long', 'tags': {'type': 'list', 'element': 'decimal(5, 1)'}}, where='t')\n"
        "ddl = spark_read_schema(schema.json, where='t')\n"
        "print(json.dumps([ddl, sorted({m.split('.')[0] for m in sys.modules} & {'pyiceberg', 'pyarrow', 'pyspark'})]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert json.loads(done.stdout) == ["id BIGINT, tags ARRAY<DECIMAL(5, 1)>", []]
