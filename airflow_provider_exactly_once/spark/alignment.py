"""Fitting a DataFrame to an Iceberg table's schema before a single byte is written.

Everything here decides from the two schemas alone (a Spark ``StructType`` and a pyiceberg
``Schema``), so a refusal costs no Spark job and the rules are testable without a session. Every
fault is collected and reported at once, naming the column, because a person fixing a pipeline
should not discover mismatches one ``spark-submit`` at a time.

Rules:

* columns are matched by exact name (Iceberg names are case-sensitive; a match that only ignores
  case is reported, never guessed);
* types must be equal or an Iceberg-legal promotion (``int -> long``, ``float -> double``, decimal
  precision widening) plus the lossless ``byte``/``short -> int``; anything else is refused;
* a missing optional column is written as nulls, a missing required column is refused, and a
  nullable Spark column going into a required top-level column is checked row by row on the
  executors (Spark's nullability flag is too coarse to decide it here);
* nested types must have the table's field names in the table's order: Spark casts structs by
  position, so anything else would silently swap values;
* extra columns are refused unless schema evolution is allowed; then they become optional added
  columns (primitive types only, because their type travels as a string the commit must parse),
  with the field ids the commit's ``UpdateSchema.add_column`` will assign, in the listed order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import SchemaMismatch
from airflow_provider_exactly_once.core.precommit import WrittenColumn


def iceberg_to_spark(iceberg: IcebergType) -> st.DataType | None:
    """The Spark type Spark hands to Arrow for an Iceberg type; ``None`` where Spark has none."""
    simple: dict[type[IcebergType], st.DataType] = {
        BooleanType: st.BooleanType(),
        IntegerType: st.IntegerType(),
        LongType: st.LongType(),
        FloatType: st.FloatType(),
        DoubleType: st.DoubleType(),
        DateType: st.DateType(),
        TimestampType: st.TimestampNTZType(),
        TimestamptzType: st.TimestampType(),
        StringType: st.StringType(),
        BinaryType: st.BinaryType(),
    }
    if type(iceberg) in simple:
        return simple[type(iceberg)]
    if isinstance(iceberg, DecimalType):
        return st.DecimalType(iceberg.precision, iceberg.scale)
    if isinstance(iceberg, StructType):
        fields = []
        for nested in iceberg.fields:
            inner = iceberg_to_spark(nested.field_type)
            if inner is None:
                return None
            fields.append(st.StructField(nested.name, inner, nullable=not nested.required))
        return st.StructType(fields)
    if isinstance(iceberg, ListType):
        element = iceberg_to_spark(iceberg.element_type)
        return None if element is None else st.ArrayType(element, containsNull=not iceberg.element_required)
    if isinstance(iceberg, MapType):
        key, value = iceberg_to_spark(iceberg.key_type), iceberg_to_spark(iceberg.value_type)
        if key is None or value is None:
            return None
        return st.MapType(key, value, valueContainsNull=not iceberg.value_required)
    return None


def spark_to_iceberg(spark: st.DataType, where: str) -> IcebergType:
    """An Iceberg type for a Spark type, ids numbered from 1 (callers renumber with fresh ids)."""
    counter = itertools.count(1)
    return _spark_to_iceberg(spark, where, lambda: next(counter))


def _spark_to_iceberg(spark: st.DataType, where: str, next_id: Any) -> IcebergType:
    if isinstance(spark, st.BooleanType):
        return BooleanType()
    if isinstance(spark, st.ByteType | st.ShortType | st.IntegerType):
        return IntegerType()
    if isinstance(spark, st.LongType):
        return LongType()
    if isinstance(spark, st.FloatType):
        return FloatType()
    if isinstance(spark, st.DoubleType):
        return DoubleType()
    if isinstance(spark, st.DecimalType):
        return DecimalType(spark.precision, spark.scale)
    if isinstance(spark, st.StringType | st.VarcharType | st.CharType):
        return StringType()
    if isinstance(spark, st.BinaryType):
        return BinaryType()
    if isinstance(spark, st.DateType):
        return DateType()
    if isinstance(spark, st.TimestampNTZType):
        return TimestampType()
    if isinstance(spark, st.TimestampType):
        return TimestamptzType()
    if isinstance(spark, st.StructType):
        return StructType(
            *[
                NestedField(
                    next_id(), f.name, _spark_to_iceberg(f.dataType, f"{where}.{f.name}", next_id), required=False
                )
                for f in spark.fields
            ]
        )
    if isinstance(spark, st.ArrayType):
        return ListType(
            next_id(), _spark_to_iceberg(spark.elementType, f"{where}.element", next_id), element_required=False
        )
    if isinstance(spark, st.MapType):
        return MapType(
            next_id(),
            _spark_to_iceberg(spark.keyType, f"{where}.key", next_id),
            next_id(),
            _spark_to_iceberg(spark.valueType, f"{where}.value", next_id),
            value_required=False,
        )
    raise SchemaMismatch(f"column {where!r} has Spark type {spark.simpleString()}, which Iceberg cannot store")


def spark_schema_to_iceberg(schema: st.StructType) -> Schema:
    """A schema for a file sink, which has no table: the DataFrame's own columns, all optional."""
    _refuse_duplicates([f.name for f in schema.fields])
    fields = [
        NestedField(i + 1, f.name, spark_to_iceberg(f.dataType, f.name), required=False)
        for i, f in enumerate(schema.fields)
    ]
    return assign_fresh_schema_ids(Schema(*fields))


@dataclass(frozen=True)
class ColumnPlan:
    """One column of the aligned DataFrame: where it comes from and what it is cast to."""

    source: str
    target: str
    cast_to: st.DataType | None


@dataclass
class AlignmentPlan:
    #: Columns the aligned DataFrame selects, in the file's order (missing optional columns are
    #: absent here: the executors fill them with typed nulls, which also covers types Spark lacks).
    columns: list[ColumnPlan]
    #: The schema the files are written with: the table's, then the added columns.
    write_schema: Schema
    added_columns: list[WrittenColumn] = field(default_factory=list)
    #: Top-level required columns Spark calls nullable: checked for nulls on the executors.
    checked_required: list[str] = field(default_factory=list)

    def written_columns(self) -> list[WrittenColumn]:
        return [
            WrittenColumn(
                name=f.name, type=type_text(f.field_type), required=f.required, doc=f.doc, field_id=f.field_id
            )
            for f in self.write_schema.fields
        ]


def type_text(iceberg: IcebergType) -> str:
    """A written column's type as the commit parses it back: the name of a primitive type, the
    JSON form of a nested one (its ``str`` form is for people and cannot be parsed)."""
    return str(iceberg) if isinstance(iceberg, PrimitiveType) else iceberg.model_dump_json()


def plan_alignment(
    frame: st.StructType,
    table_schema: Schema,
    *,
    table: str,
    last_column_id: int,
    allow_schema_evolution: bool,
) -> AlignmentPlan:
    """Decide how ``frame`` goes into ``table_schema``, or raise ``SchemaMismatch`` naming every fault."""
    faults: list[str] = []
    names = [f.name for f in frame.fields]
    try:
        _refuse_duplicates(names)
    except SchemaMismatch as exc:
        faults.append(str(exc))
    by_name = {f.name: f for f in frame.fields}
    table_names = {f.name for f in table_schema.fields}
    columns: list[ColumnPlan] = []
    checked_required: list[str] = []

    for target in table_schema.fields:
        source = by_name.get(target.name)
        if source is None:
            near = [n for n in names if n.lower() == target.name.lower()]
            if near:
                faults.append(
                    f"table column {target.name!r} is missing; input column {near[0]!r} matches it only "
                    "ignoring case (Iceberg names are case-sensitive): rename it"
                )
            elif target.required:
                faults.append(f"required table column {target.name!r} ({target.field_type}) is missing from the input")
            continue
        column_faults: list[str] = []
        needs_cast = _compatible(source.dataType, target.field_type, target.name, column_faults, top_level=True)
        if target.required and isinstance(source.dataType, st.NullType):
            column_faults.append(f"column {target.name!r} is required but the input holds only nulls")
        faults.extend(column_faults)
        if column_faults:
            continue
        cast_to = iceberg_to_spark(target.field_type) if needs_cast else None
        columns.append(ColumnPlan(source=source.name, target=target.name, cast_to=cast_to))
        if target.required and source.nullable:
            checked_required.append(target.name)

    extra = [
        f for f in frame.fields if f.name not in table_names and f.name.lower() not in {n.lower() for n in table_names}
    ]
    added: list[NestedField] = []
    if extra and not allow_schema_evolution:
        faults.append(
            f"input column(s) {[f.name for f in extra]} are not in table {table!r}; "
            "drop them, or allow schema evolution to add them"
        )
    elif extra:
        counter = itertools.count(last_column_id + 1)
        for f in extra:
            try:
                iceberg = spark_to_iceberg(f.dataType, f.name)
            except SchemaMismatch as exc:
                faults.append(str(exc))
                continue
            if not isinstance(iceberg, PrimitiveType):
                faults.append(
                    f"input column {f.name!r} ({f.dataType.simpleString()}) would be added to {table!r}, "
                    "but only primitive columns can be added by a write; add it to the table first"
                )
                continue
            added.append(NestedField(next(counter), f.name, iceberg, required=False))
            columns.append(ColumnPlan(source=f.name, target=f.name, cast_to=iceberg_to_spark(iceberg)))

    if faults:
        raise SchemaMismatch(f"input does not fit table {table!r}: " + "; ".join(faults))
    write_schema = Schema(
        *table_schema.fields,
        *added,
        schema_id=table_schema.schema_id,
        identifier_field_ids=table_schema.identifier_field_ids,
    )
    return AlignmentPlan(
        columns=columns,
        write_schema=write_schema,
        added_columns=[
            WrittenColumn(name=f.name, type=str(f.field_type), required=False, field_id=f.field_id) for f in added
        ],
        checked_required=checked_required,
    )


def _refuse_duplicates(names: list[str]) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaMismatch(f"input has duplicate column name(s) {duplicates}")


def _compatible(source: st.DataType, target: IcebergType, where: str, faults: list[str], *, top_level: bool) -> bool:
    """Whether ``source`` can go into ``target``; appends faults; returns whether a cast is needed."""
    if isinstance(source, st.NullType):
        if iceberg_to_spark(target) is None:
            faults.append(f"column {where!r}: Spark cannot produce Iceberg type {target}")
        return True
    if isinstance(target, StructType):
        if not isinstance(source, st.StructType):
            faults.append(f"column {where!r} is {source.simpleString()} in the input but {target} in the table")
            return False
        source_names = [f.name for f in source.fields]
        target_names = [f.name for f in target.fields]
        if source_names != target_names:
            faults.append(
                f"struct column {where!r} has fields {source_names} in the input but {target_names} in the table "
                "(same names in the same order are needed)"
            )
            return False
        cast = False
        for s, t in zip(source.fields, target.fields, strict=True):
            if t.required and s.nullable:
                faults.append(f"nested field '{where}.{t.name}' is required in the table but nullable in the input")
            cast |= _compatible(s.dataType, t.field_type, f"{where}.{t.name}", faults, top_level=False)
        return cast
    if isinstance(target, ListType):
        if not isinstance(source, st.ArrayType):
            faults.append(f"column {where!r} is {source.simpleString()} in the input but {target} in the table")
            return False
        if target.element_required and source.containsNull:
            faults.append(f"list column {where!r} has required elements in the table but nullable ones in the input")
        return _compatible(source.elementType, target.element_type, f"{where}.element", faults, top_level=False)
    if isinstance(target, MapType):
        if not isinstance(source, st.MapType):
            faults.append(f"column {where!r} is {source.simpleString()} in the input but {target} in the table")
            return False
        if target.value_required and source.valueContainsNull:
            faults.append(f"map column {where!r} has required values in the table but nullable ones in the input")
        key = _compatible(source.keyType, target.key_type, f"{where}.key", faults, top_level=False)
        value = _compatible(source.valueType, target.value_type, f"{where}.value", faults, top_level=False)
        return key or value
    return _primitive(source, target, where, faults)


def _primitive(source: st.DataType, target: IcebergType, where: str, faults: list[str]) -> bool:
    exact = iceberg_to_spark(target)
    if exact is None:
        faults.append(f"column {where!r} has Iceberg type {target}, which Spark cannot produce")
        return False
    if source == exact or (isinstance(target, StringType) and isinstance(source, st.VarcharType | st.CharType)):
        return False
    promotions: dict[type[IcebergType], tuple[type[st.DataType], ...]] = {
        IntegerType: (st.ByteType, st.ShortType),
        LongType: (st.ByteType, st.ShortType, st.IntegerType),
        DoubleType: (st.FloatType,),
    }
    if isinstance(source, promotions.get(type(target), ())):
        return True
    if (
        isinstance(target, DecimalType)
        and isinstance(source, st.DecimalType)
        and source.scale == target.scale
        and source.precision <= target.precision
    ):
        return True
    faults.append(
        f"column {where!r} is {source.simpleString()} in the input but {target} in the table "
        "(only lossless promotions are cast)"
    )
    return False
