"""A table declared as plain values: the same table as the pyiceberg objects it stands for, refused
at parse time with what to write instead, and a DAG file declaring one does not import pyiceberg."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
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
    UUIDType,
)

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.operators.tables import EnsureTableOperator
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.table_spec import (
    PRIMITIVE_TYPES,
    DeclaredPartitioning,
    DeclaredSchema,
    declare_schema,
)
from airflow_provider_exactly_once.tables import ensure_table

REPO = Path(__file__).resolve().parents[1]
SINK = IcebergSinkConfig("events", ("examples.events",), iceberg_conn_id="lake")


@pytest.fixture
def catalog_props(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "warehouse").mkdir()
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"file://{tmp_path / 'warehouse'}",
    }


@pytest.fixture
def catalog(catalog_props: dict[str, str]) -> Catalog:
    return load_catalog("default", **catalog_props)


def same_table(catalog: Catalog, light: tuple[Any, Any], objects: tuple[Schema, PartitionSpec]) -> None:
    """Both declarations create tables with equal schemas and specs (ids, names, types, required)."""
    declared = ensure_table(catalog, "light.t", *light)
    reference = ensure_table(catalog, "objects.t", *objects)
    assert declared.schema() == reference.schema()
    assert declared.schema().highest_field_id == reference.schema().highest_field_id
    assert declared.spec() == reference.spec()
    assert [(f.name, f.field_id, f.source_id) for f in declared.spec().fields] == [
        (f.name, f.field_id, f.source_id) for f in reference.spec().fields
    ]


# --- the same table ---------------------------------------------------------------------------------


EVENTS = Schema(
    NestedField(1, "event_id", StringType()),
    NestedField(2, "user_id", LongType()),
    NestedField(3, "event_type", StringType()),
    NestedField(4, "event_time", TimestamptzType()),
    NestedField(5, "amount", DoubleType()),
)
BY_DAY = PartitionSpec(PartitionField(4, 1000, DayTransform(), "event_day"))


@pytest.mark.parametrize(
    ("dag_file", "table", "objects"),
    [
        ("hourly_events.py", "examples.events", (EVENTS, BY_DAY)),
        ("fan_out.py", "examples.events_by_day", (EVENTS, BY_DAY)),
        (
            "fan_out.py",
            "examples.events_by_type",
            (EVENTS, PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "event_type"))),
        ),
        (
            "fan_out.py",
            "examples.purchases",
            (
                Schema(
                    NestedField(1, "event_id", StringType()),
                    NestedField(2, "user_id", LongType()),
                    NestedField(3, "event_time", TimestamptzType()),
                    NestedField(4, "amount", DoubleType()),
                ),
                PartitionSpec(PartitionField(3, 1000, DayTransform(), "event_day")),
            ),
        ),
    ],
)
def test_the_example_dags_declare_the_tables_their_pyiceberg_objects_made(
    catalog: Catalog, dag_file: str, table: str, objects: tuple[Schema, PartitionSpec]
) -> None:
    """Tables the examples created before they declared them as plain values were made from these
    objects (the examples' earlier declarations): a run now finds them, and a new one is the same."""
    task = next(
        t for t in runpy.run_path(str(REPO / "dags" / dag_file))["dag"].tasks if getattr(t, "table", None) == table
    )
    assert isinstance(task.schema, DeclaredSchema)
    same_table(catalog, (task.schema, task.partition_spec), objects)
    assert [f.name for f in catalog.load_table("light.t").spec().fields] == [f.name for f in objects[1].fields]


def test_every_primitive_type_and_required_columns(catalog: Catalog) -> None:
    written = {
        "a": ("boolean", BooleanType()),
        "b": ("int not null", IntegerType()),
        "c": ("LONG NOT NULL", LongType()),
        "d": ("float", FloatType()),
        "e": ("double", DoubleType()),
        "f": ("decimal( 12 ,2 )", DecimalType(12, 2)),
        "g": ("date", DateType()),
        "h": ("time", TimeType()),
        "i": ("timestamp", TimestampType()),
        "j": ("timestamptz not null", TimestamptzType()),
        "k": ("timestamp_ns", TimestampNanoType()),
        "l": ("timestamptz_ns", TimestamptzNanoType()),
        "m": ("String", StringType()),
        "n": ("uuid", UUIDType()),
        "o": ("fixed[16]", FixedType(16)),
        "p": ("binary  not   null", BinaryType()),
        "q": ("decimal(38, 0)", DecimalType(38, 0)),
    }
    # every type the module documents is covered
    assert {t.split("(")[0].split("[")[0] for t in PRIMITIVE_TYPES} == {
        str(t).split("(")[0].split("[")[0] for _, t in written.values()
    }
    required = {"b", "c", "j", "p"}
    objects = Schema(
        *(NestedField(100 + i, name, t, required=name in required) for i, (name, (_, t)) in enumerate(written.items()))
    )
    light = {name: text for name, (text, _) in written.items()}
    # the ids a table would get, though pyiceberg 0.12 cannot create the format-3 table the
    # nanosecond timestamps need; without them, a real table of the same schema
    assert declare_schema(light, where="t").to_pyiceberg() == assign_fresh_schema_ids(objects)
    nano = {"k", "l"}
    light = {name: text for name, text in light.items() if name not in nano}
    objects = Schema(*(f for f in objects.fields if f.name not in nano))
    same_table(catalog, (light, None), (objects, PartitionSpec()))
    assert [f.required for f in catalog.load_table("light.t").schema().fields] == [n in required for n in light]
    # the declaration's own ids are the ones the created table has
    assert declare_schema(light, where="t").to_pyiceberg() == catalog.load_table("light.t").schema()


def test_nanosecond_timestamps_without_format_version_3_are_refused_before_the_catalog_is_called() -> None:
    nested = {"events": {"type": "list", "element": {"type": "struct", "fields": {"at": "timestamptz_ns"}}}}
    with pytest.raises(
        InvalidSinkConfig,
        match=r"^task create_table: column 'events.element.at': timestamptz_ns needs Iceberg format version 3, "
        r"and the table would be created with version 2; use timestamptz \(microseconds\), or "
        r"properties=\{'format-version': '3'\} once",
    ):
        EnsureTableOperator(task_id="create_table", sink=SINK, schema=nested)
    with pytest.raises(InvalidSinkConfig, match=r"column 'at': timestamp_ns .* with version 1"):
        EnsureTableOperator(
            task_id="create_table", sink=SINK, schema={"at": "timestamp_ns"}, properties={"format-version": "1"}
        )
    operator = EnsureTableOperator(task_id="create_table", sink=SINK, schema=nested, properties={"format-version": "3"})
    assert isinstance(operator.schema, DeclaredSchema)


def test_nested_types_get_the_ids_create_table_assigns(catalog: Catalog) -> None:
    light = {
        "id": "long not null",
        "tags": {"type": "list", "element": "string"},
        "scores": {"type": "map", "key": "string", "value": "double not null", "required": True},
        "address": {
            "type": "struct",
            "fields": {
                "city": "string not null",
                "lines": {"type": "list", "element": "string not null"},
                "geo": {"type": "struct", "fields": {"lat": "double", "lon": "double"}},
            },
        },
        "events": {
            "type": "list",
            "element": {"type": "struct", "fields": {"at": "timestamptz", "kind": "string"}, "required": True},
        },
        "by_day": {"type": "map", "key": "date", "value": {"type": "list", "element": "long"}},
    }

    ids = iter(range(999, 0, -1))  # distinct, in no order create_table keeps: it assigns fresh ones

    def field(name: str, t: IcebergType, required: bool = False) -> NestedField:
        return NestedField(next(ids), name, t, required=required)

    def list_of(t: IcebergType, required: bool = False) -> ListType:
        return ListType(next(ids), t, element_required=required)

    def map_of(k: IcebergType, v: IcebergType, required: bool = False) -> MapType:
        return MapType(next(ids), k, next(ids), v, value_required=required)

    objects = Schema(
        field("id", LongType(), required=True),
        field("tags", list_of(StringType())),
        field("scores", map_of(StringType(), DoubleType(), required=True), required=True),
        field(
            "address",
            StructType(
                field("city", StringType(), required=True),
                field("lines", list_of(StringType(), required=True)),
                field("geo", StructType(field("lat", DoubleType()), field("lon", DoubleType()))),
            ),
        ),
        field(
            "events",
            list_of(StructType(field("at", TimestamptzType()), field("kind", StringType())), required=True),
        ),
        field("by_day", map_of(DateType(), list_of(LongType()))),
    )
    same_table(catalog, (light, ["id"]), (objects, _spec_over(objects, ("id", IdentityTransform(), "id"))))
    table_schema = catalog.load_table("light.t").schema()
    assert declare_schema(light, where="t").to_pyiceberg() == table_schema
    # pre-order, every field of a struct first: the six columns are 1 to 6, then what they nest
    assert [f.field_id for f in table_schema.fields] == [1, 2, 3, 4, 5, 6]
    assert table_schema.find_field("tags.element").field_id == 7
    assert table_schema.find_field("address.geo.lon").field_id > table_schema.find_field("address.city").field_id


def _spec_over(schema: Schema, *fields: tuple[str, Transform[Any, Any], str]) -> PartitionSpec:
    return PartitionSpec(
        *(
            PartitionField(schema.find_field(column).field_id, 1000 + i, transform, name)
            for i, (column, transform, name) in enumerate(fields)
        )
    )


TRANSFORM_SCHEMA = {
    "id": "long",
    "name": "string",
    "price": "decimal(10, 2)",
    "day": "date",
    "at": "timestamptz",
    "raw": "binary",
    "tags": {"type": "list", "element": "string"},
}


@pytest.mark.parametrize(
    ("written", "column", "transform", "name"),
    [
        ("name", "name", IdentityTransform(), "name"),
        ("identity(price)", "price", IdentityTransform(), "price"),
        ("year(at)", "at", YearTransform(), "at_year"),
        ("years(day)", "day", YearTransform(), "day_year"),
        ("month(day)", "day", MonthTransform(), "day_month"),
        ("day(at)", "at", DayTransform(), "at_day"),
        ("days(at)", "at", DayTransform(), "at_day"),
        ("DAY( at ) AS event_day", "at", DayTransform(), "event_day"),
        ("hour(at)", "at", HourTransform(), "at_hour"),
        ("bucket(16, id)", "id", BucketTransform(16), "id_bucket_16"),
        ("bucket(8,name) as shard", "name", BucketTransform(8), "shard"),
        ("truncate(4, name)", "name", TruncateTransform(4), "name_trunc_4"),
        ("truncate(100, price)", "price", TruncateTransform(100), "price_trunc_100"),
        ("truncate(3, raw)", "raw", TruncateTransform(3), "raw_trunc_3"),
        ("void(id)", "id", VoidTransform(), "id_null"),
    ],
)
def test_each_transform(catalog: Catalog, written: str, column: str, transform: Transform[Any, Any], name: str) -> None:
    objects = declare_schema(TRANSFORM_SCHEMA, where="t").to_pyiceberg()
    same_table(catalog, (TRANSFORM_SCHEMA, [written]), (objects, _spec_over(objects, (column, transform, name))))


def test_several_transforms_keep_their_order(catalog: Catalog) -> None:
    written = ["day(at)", "bucket(16, id)", "bucket(4, id)", "name"]
    objects = declare_schema(TRANSFORM_SCHEMA, where="t").to_pyiceberg()
    expected = _spec_over(
        objects,
        ("at", DayTransform(), "at_day"),
        ("id", BucketTransform(16), "id_bucket_16"),
        ("id", BucketTransform(4), "id_bucket_4"),
        ("name", IdentityTransform(), "name"),
    )
    same_table(catalog, (TRANSFORM_SCHEMA, written), (objects, expected))


def test_the_forms_mix_with_pyiceberg_objects(catalog: Catalog) -> None:
    objects = Schema(NestedField(7, "id", LongType()), NestedField(9, "at", TimestamptzType()))
    spec = PartitionSpec(PartitionField(9, 1000, DayTransform(), "at_day"))
    # a pyiceberg Schema with transform strings, resolved against its own ids
    same_table(catalog, (objects, ["day(at)"]), (objects, spec))
    # a declared schema with a PartitionSpec naming the ids the declaration assigns in order
    declared = {"id": "long", "at": "timestamptz"}
    by_position = PartitionSpec(PartitionField(2, 1000, DayTransform(), "at_day"))
    table = ensure_table(catalog, "mixed.t", declared, by_position)
    assert table.spec() == catalog.load_table("objects.t").spec()
    assert table.schema() == catalog.load_table("objects.t").schema()


def test_the_operator_creates_the_declared_table_when_it_runs(
    catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "iceberg", "extra": catalog_props}))
    operator = EnsureTableOperator(
        task_id="create_table",
        sink=SINK,
        schema={"id": "long not null", "at": "timestamptz"},
        partition_spec=["day(at)"],
    )
    assert isinstance(operator.schema, DeclaredSchema) and isinstance(operator.partition_spec, DeclaredPartitioning)
    location = operator.execute({})  # type: ignore[arg-type]
    table = load_catalog("lake", **catalog_props).load_table("examples.events")
    assert table.metadata_location == location
    assert table.schema() == Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestamptzType())
    )
    assert [(f.name, f.transform) for f in table.spec().fields] == [("at_day", DayTransform())]


def test_the_operator_keeps_pyiceberg_objects_as_they_are() -> None:
    schema = Schema(NestedField(1, "id", LongType()))
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "id"))
    operator = EnsureTableOperator(task_id="create_table", sink=SINK, schema=schema, partition_spec=spec)
    assert operator.schema is schema and operator.partition_spec is spec
    bare = EnsureTableOperator(task_id="bare", sink=SINK, schema=schema)
    assert bare.partition_spec is None


# --- refused when the DAG is parsed ------------------------------------------------------------------

GOOD = {
    "id": "long",
    "name": "string",
    "at": "timestamptz",
    "amount": "double",
    "tags": {"type": "list", "element": "string"},
}


@pytest.mark.parametrize(
    ("schema", "refusal"),
    [
        ({}, r"no column; give at least one"),
        ({"id": "str"}, r"column 'id': unknown type 'str'; write string \(followed by ' not null'"),
        ({"id": "bigint not null"}, r"column 'id': unknown type 'bigint not null'; write long"),
        ({"id": "varchar(10)"}, r"unknown type 'varchar\(10\)'; write string"),
        ({"id": "decimal"}, r"write decimal\(P, S\)"),
        ({"id": "wibble"}, r"unknown type 'wibble'; write one of boolean, int, long, .*binary"),
        ({"id": "decimal(40, 2)"}, r"column 'id': 'decimal\(40, 2\)' is not a decimal Iceberg allows; .*from 1 to 38"),
        ({"id": "decimal(4, 6)"}, r"scale S no greater than P"),
        ({"id": "fixed[0]"}, r"column 'id': 'fixed\[0\]' has no length; write fixed\[N\] with N >= 1"),
        ({"id": "array<string>"}, r"write \{\"type\": \"list\", \"element\": \.\.\.\}"),
        ({"id": 5}, r"column 'id': its type must be a type string such as 'long' or a dict"),
        ({"": "long"}, r"a column name must be a non-empty string"),
        (
            {"tags": {"element": "string"}},
            r"column 'tags': a dict type needs 'type' 'list', 'map' or 'struct', not None",
        ),
        ({"tags": {"type": "list"}}, r"column 'tags': its list type has no 'element'"),
        ({"tags": {"type": "list", "element": "strin"}}, r"column 'tags.element': unknown type 'strin'"),
        (
            {"tags": {"type": "list", "element-id": 3, "element": "string"}},
            r"unknown key 'element-id' in its list type; leave the ids out",
        ),
        (
            {"tags": {"type": "list", "element": "string", "element-required": True}},
            r"write the element's type as 'T not null'",
        ),
        ({"m": {"type": "map", "key": "string"}}, r"column 'm': its map type has no 'value'"),
        ({"m": {"type": "map", "key": "string", "value": "lng"}}, r"column 'm.value': unknown type 'lng'"),
        ({"s": {"type": "struct", "fields": {}}}, r"column 's': a struct's 'fields' must be a non-empty mapping"),
        ({"s": {"type": "struct", "fields": {"a": {"type": "struct", "fields": {"b": "x"}}}}}, r"column 's.a.b'"),
        ({"s": {"type": "struct", "fields": {"a": "long"}, "required": "yes"}}, r"'required' must be True or False"),
        (
            {"s": {"type": "struct", "fields": {"a": "long"}, "doc": "x"}},
            r"unknown key 'doc'.*takes 'fields', 'required', 'type'",
        ),
        (["id", "long"], r"schema must be a mapping of column name to Iceberg type .* not list"),
    ],
)
def test_a_schema_error_names_the_task_the_column_and_what_to_write(schema: Any, refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=r"^task create_table: .*" + refusal):
        EnsureTableOperator(task_id="create_table", sink=SINK, schema=schema)


@pytest.mark.parametrize(
    ("partitioning", "refusal"),
    [
        (["day(at"], r"partition 'day\(at' is not a transform; write 'col', 'identity\(col\)'"),
        (["day()"], r"partition 'day\(\)' is not a transform"),
        (["day at"], r"partition 'day at' is not a transform"),
        ([7], r"partition 7 is not a string"),
        (["week(at)"], r"partition 'week\(at\)': unknown transform 'week'"),
        (
            ["day(when)"],
            r"partition 'day\(when\)' is over 'when', which is not a top-level column; the columns are 'id', 'name'",
        ),
        (["day(AT)"], r"over 'AT', which is not a top-level column; did you mean 'at'\?"),
        (["identity(tags.element)"], r"over 'tags.element', which is not a top-level column"),
        (["bucket(id)"], r"partition 'bucket\(id\)': bucket takes a number first; write 'bucket\(N, id\)'"),
        (["bucket(id, 16)"], r"the number comes first; write 'bucket\(16, id\)'"),
        (["bucket(0, id)"], r"N must be a whole number of at least 1; write 'bucket\(N, id\)'"),
        (["truncate(x, name)"], r"W must be a whole number of at least 1; write 'truncate\(W, name\)'"),
        (["day(1, at)"], r"partition 'day\(1, at\)': day takes one column; write 'day\(at\)'"),
        (["day(name)"], r"day does not apply to column 'name' of type string; it applies to date, timestamp"),
        (["hour(at) as h", "bucket(4, amount)"], r"bucket does not apply to column 'amount' of type double"),
        (["truncate(4, at)"], r"truncate does not apply to column 'at' of type timestamptz"),
        (["tags"], r"partition 'tags': column 'tags' is a list; a partition needs a primitive column"),
        (["void(tags)"], r"partition 'void\(tags\)': column 'tags' is a list; a partition needs a primitive"),
        (["day(at) as id"], r"its name 'id' is a column's; only an identity or void partition"),
        (
            ["day(at) as p", "bucket(4, id) as p"],
            r"partition 'bucket\(4, id\) as p': another partition field is named 'p'",
        ),
        (["day(at)", "hour(at)"], r"partition 'hour\(at\)' is redundant with 'day\(at\)' on the same column"),
        (
            ["bucket(4, id)", "bucket(4, id) as b"],
            r"partition 'bucket\(4, id\) as b' is redundant with 'bucket\(4, id\)'",
        ),
        ("day(at)", r"partition_spec='day\(at\)' is one string; give a list of transforms, e.g. \['day\(at\)'\]"),
        (5, r"partition_spec must be a list of transforms .* not int"),
    ],
)
def test_a_partition_error_names_the_task_the_transform_and_what_to_write(partitioning: Any, refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=r"^task create_table: .*" + refusal):
        EnsureTableOperator(task_id="create_table", sink=SINK, schema=GOOD, partition_spec=partitioning)


def test_transform_strings_over_a_pyiceberg_schema_see_its_types(catalog: Catalog) -> None:
    schema = Schema(
        NestedField(3, "id", LongType()),
        NestedField(5, "price", DecimalType(10, 2)),
        NestedField(8, "tags", ListType(9, StringType())),
    )
    written = ["truncate(4, price)", "void(price)", "bucket(4, id) as shard"]
    expected = _spec_over(
        schema,
        ("price", TruncateTransform(4), "price_trunc_4"),
        ("price", VoidTransform(), "price_null"),
        ("id", BucketTransform(4), "shard"),
    )
    same_table(catalog, (schema, written), (schema, expected))
    for refused, because in [
        ("tags", r"column 'tags' is a list; a partition needs a primitive column"),
        ("day(price)", r"day does not apply to column 'price' of type decimal\(10, 2\)"),
    ]:
        with pytest.raises(InvalidSinkConfig, match=because):
            EnsureTableOperator(task_id="create_table", sink=SINK, schema=schema, partition_spec=[refused])


def test_a_partition_error_against_a_pyiceberg_schema() -> None:
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType()))
    with pytest.raises(
        InvalidSinkConfig, match=r"^task create_table: .*day does not apply to column 'name' of type string"
    ):
        EnsureTableOperator(task_id="create_table", sink=SINK, schema=schema, partition_spec=["day(name)"])


def test_ensure_table_refuses_a_wrong_declaration_naming_the_table_even_when_the_table_exists(catalog: Catalog) -> None:
    ensure_table(catalog, "ns.t", {"id": "long"})
    with pytest.raises(InvalidSinkConfig, match=r"^table ns\.t: column 'id': unknown type 'lonk'"):
        ensure_table(catalog, "ns.t", {"id": "lonk"})
    with pytest.raises(InvalidSinkConfig, match=r"^table ns\.t: partition 'day\(id\)': day does not apply"):
        ensure_table(catalog, "ns.t", {"id": "long"}, ["day(id)"])


# --- what a DAG file's parse imports -------------------------------------------------------------

#: Run a DAG file as the dag-processor does, after ``airflow.sdk``; print what it added of the
#: libraries a table declaration could bring, and each ``EnsureTableOperator``'s schema type.
PARSE = """
import json, runpy, sys
import airflow.sdk  # noqa: F401  the parsing process has the SDK already
before = {m.split('.')[0] for m in sys.modules}
namespace = runpy.run_path(sys.argv[1])
added = sorted({m.split('.')[0] for m in sys.modules} - before & {'pyiceberg', 'pyarrow', 'pyspark'})
tables = {t.task_id: type(t.schema).__name__ for t in namespace['dag'].tasks if type(t).__name__ == 'EnsureTableOperator'}
print(json.dumps([added, tables]))
"""


def parse(dag_file: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_EXAMPLES"))}
    env.update(
        {"AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO)}
    )
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(dag_file)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    added, tables = json.loads(done.stdout.strip().splitlines()[-1])
    return added, tables


@pytest.mark.parametrize(
    ("dag_file", "tables"),
    [
        ("hourly_events.py", {"events.create_table"}),
        ("fan_out.py", {"events.create_events_by_day", "events.create_events_by_type", "events.create_purchases"}),
    ],
)
def test_parsing_an_example_dag_imports_neither_pyiceberg_nor_pyarrow_nor_pyspark(
    tmp_path: Path, dag_file: str, tables: set[str]
) -> None:
    added, declared = parse(REPO / "dags" / dag_file, tmp_path)
    assert declared == dict.fromkeys(tables, "DeclaredSchema")
    assert added == []


def test_the_parse_check_sees_a_dag_that_imports_pyiceberg(tmp_path: Path) -> None:
    """The check above can fail: the same DAG with its table as pyiceberg objects brings pyiceberg."""
    source = (REPO / "dags" / "hourly_events.py").read_text(encoding="utf-8")
    declaration = 'TABLE = TableSpec(\n    schema={\n        "event_id": "string",'
    assert declaration in source
    with_objects = source.replace(
        declaration,
        "from pyiceberg.schema import Schema\n"
        "from pyiceberg.types import NestedField, StringType\n"
        'TABLE = TableSpec(Schema(NestedField(1, "event_id", StringType())))\n'
        'UNUSED = dict(\n    schema={\n        "event_id": "string",',
    )
    dag_file = tmp_path / "hourly_events_objects.py"
    dag_file.write_text(with_objects, encoding="utf-8")
    added, declared = parse(dag_file, tmp_path)
    assert declared == {"events.create_table": "Schema"}
    assert "pyiceberg" in added
