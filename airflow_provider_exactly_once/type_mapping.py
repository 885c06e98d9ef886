"""Iceberg's types as Spark's and back, as text, and which goes into which: the one type mapping.

Built on pyiceberg's ``schema_to_pyarrow`` and type model and pyspark's ``from_arrow_type``, each
imported inside the function that uses it, so a DAG parse pays for neither. Where the project's
rules depart from them: design.md, "Layers" (column types).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, SchemaMismatch

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType, NestedField
    from pyspark.sql import types as st

#: Iceberg's primitive types Spark writes as the table has them, by Iceberg's name, and the Spark SQL
#: type of each (a decimal is ``DECIMAL(P, S)``); Spark has no type for the other primitives.
SPARK_TYPES = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "date": "DATE",
    "timestamp": "TIMESTAMP_NTZ",
    "timestamptz": "TIMESTAMP",
    "string": "STRING",
    "binary": "BINARY",
}
#: The metadata key of a Spark field whose value Spark's Parquet writer writes as the field id.
FIELD_ID = "parquet.field.id"
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _spark_name(primitive: str) -> str | None:
    """The Spark SQL type of an Iceberg primitive type named as Iceberg's JSON names it."""
    decimal = _DECIMAL.fullmatch(primitive)
    return f"DECIMAL({decimal[1]}, {decimal[2]})" if decimal else SPARK_TYPES.get(primitive)


def spark_read_schema(schema: Mapping[str, Any] | Schema, *, where: str) -> str:
    """The Spark DDL (``"id BIGINT, at TIMESTAMP"``) of a pyiceberg schema or of its JSON form (what
    a declaration holds). Nullability is left out: Spark reads every file source as nullable.

    :raises InvalidSinkConfig: naming the column whose type the Spark writer cannot write.
    """
    schema_json = schema if isinstance(schema, Mapping) else json.loads(schema.model_dump_json())
    return _ddl_fields(schema_json["fields"], "", where, " ")


def _ddl_fields(fields: Sequence[Mapping[str, Any]], parent: str, where: str, colon: str) -> str:
    return ", ".join(_ddl_name(f["name"]) + colon + _ddl_type(f["type"], parent + f["name"], where) for f in fields)


def _ddl_type(type_json: Any, path: str, where: str) -> str:
    if isinstance(type_json, str):
        if spark := _spark_name(type_json):
            return spark
        raise InvalidSinkConfig(
            f"{where}: column {path!r}: the Spark write cannot write an Iceberg {type_json} column, so no "
            "read schema follows from the table's; give the input its own schema_ddl, or write the column "
            "with another operator"
        )
    if type_json["type"] == "list":
        return f"ARRAY<{_ddl_type(type_json['element'], f'{path}.element', where)}>"
    if type_json["type"] == "map":
        key = _ddl_type(type_json["key"], f"{path}.key", where)
        return f"MAP<{key}, {_ddl_type(type_json['value'], f'{path}.value', where)}>"
    return f"STRUCT<{_ddl_fields(type_json['fields'], f'{path}.', where, ': ')}>"


def _ddl_name(name: str) -> str:
    """A column name as Spark DDL takes it: plain, or between backticks (a backtick doubled)."""
    return name if _PLAIN_NAME.fullmatch(name) else "`" + name.replace("`", "``") + "`"


def type_text(iceberg: IcebergType) -> str:
    """A written column's type as the commit parses it back: the name of a primitive type, the
    JSON form of a nested one (its ``str`` form is for people and cannot be parsed)."""
    return str(iceberg) if iceberg.is_primitive else iceberg.model_dump_json()


def parse_type(text: str, *, table: str, column: str) -> IcebergType:
    """An Iceberg type from ``type_text`` (the spelling of ``decimal(10,2)`` does not matter)."""
    from pydantic import ValidationError
    from pyiceberg.types import NestedField

    raw: Any = text
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            raise InvalidPreCommit(f"table {table!r}: column {column!r} has a type that is not valid JSON") from None
    try:
        field = NestedField.model_validate({"id": 1, "name": column, "type": raw, "required": False})
    except ValidationError:
        raise InvalidPreCommit(f"table {table!r}: column {column!r} has an unknown Iceberg type {text!r}") from None
    return field.field_type


def iceberg_to_spark(iceberg: IcebergType) -> st.DataType | None:
    """The Spark type an Iceberg type is written from; ``None`` where Spark has none."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import index_by_id
    from pyspark.sql.pandas.types import from_arrow_type

    nested = [] if iceberg.is_primitive else [f.field_type for f in index_by_id(iceberg).values()]
    if any(t.is_primitive and _spark_name(str(t)) is None for t in [iceberg, *nested]):
        return None
    return from_arrow_type(schema_to_pyarrow(iceberg), prefer_timestamp_ntz=True)


def spark_schema(schema: Schema) -> st.StructType:
    """The Spark schema of an Iceberg schema, each struct field (at any depth) with its field id as
    ``FIELD_ID`` metadata: what Spark's Parquet writer writes ids from and its reader
    (``spark.sql.parquet.fieldId.read.enabled``) resolves columns by. List elements and map keys
    and values have no Spark field to carry theirs.

    :raises SchemaMismatch: naming a column whose type Spark has none for.
    """
    spark = iceberg_to_spark(schema.as_struct())
    if spark is None:
        unwritable = [f"{f.name} ({f.field_type})" for f in schema.fields if iceberg_to_spark(f.field_type) is None]
        raise SchemaMismatch(f"column(s) {unwritable} have Iceberg types Spark cannot produce")
    return cast("st.StructType", _with_ids(schema.as_struct(), spark))


def _with_ids(iceberg: IcebergType, spark: st.DataType) -> st.DataType:
    from pyiceberg.types import ListType, MapType, StructType
    from pyspark.sql import types as st

    if isinstance(iceberg, StructType) and isinstance(spark, st.StructType):
        return st.StructType(
            [
                st.StructField(s.name, _with_ids(i.field_type, s.dataType), s.nullable, {FIELD_ID: i.field_id})
                for i, s in zip(iceberg.fields, spark.fields, strict=True)
            ]
        )
    if isinstance(iceberg, ListType) and isinstance(spark, st.ArrayType):
        return st.ArrayType(_with_ids(iceberg.element_type, spark.elementType), spark.containsNull)
    if isinstance(iceberg, MapType) and isinstance(spark, st.MapType):
        key = _with_ids(iceberg.key_type, spark.keyType)
        return st.MapType(key, _with_ids(iceberg.value_type, spark.valueType), spark.valueContainsNull)
    return spark


def spark_to_iceberg(spark: st.DataType, where: str, next_id: Callable[[], int] | None = None) -> IcebergType:
    """An Iceberg type for a Spark type, every field optional, ids from ``next_id`` (from 1 unless
    given; callers renumber with fresh ids).

    :raises SchemaMismatch: naming the (nested) column of a type Iceberg cannot store.
    """
    from pyiceberg import types as it
    from pyspark.sql import types as st

    next_id = next_id or itertools.count(1).__next__
    primitives: list[tuple[type[st.DataType] | tuple[type[st.DataType], ...], it.PrimitiveType]] = [
        (st.BooleanType, it.BooleanType()),
        ((st.ByteType, st.ShortType, st.IntegerType), it.IntegerType()),
        (st.LongType, it.LongType()),
        (st.FloatType, it.FloatType()),
        (st.DoubleType, it.DoubleType()),
        ((st.StringType, st.VarcharType, st.CharType), it.StringType()),
        (st.BinaryType, it.BinaryType()),
        (st.DateType, it.DateType()),
        (st.TimestampNTZType, it.TimestampType()),
        (st.TimestampType, it.TimestamptzType()),
    ]
    for spark_types, iceberg in primitives:
        if isinstance(spark, spark_types):
            return iceberg
    if isinstance(spark, st.DecimalType):
        return it.DecimalType(spark.precision, spark.scale)
    if isinstance(spark, st.StructType):
        return it.StructType(
            *[
                it.NestedField(
                    next_id(),
                    f.name,
                    spark_to_iceberg(f.dataType, f"{where}.{f.name}" if where else f.name, next_id),
                    required=False,
                )
                for f in spark.fields
            ]
        )
    if isinstance(spark, st.ArrayType):
        element_id, element = next_id(), spark_to_iceberg(spark.elementType, f"{where}.element", next_id)
        return it.ListType(element_id, element, element_required=False)
    if isinstance(spark, st.MapType):
        key_id, key = next_id(), spark_to_iceberg(spark.keyType, f"{where}.key", next_id)
        value_id, value = next_id(), spark_to_iceberg(spark.valueType, f"{where}.value", next_id)
        return it.MapType(key_id, key, value_id, value, value_required=False)
    raise SchemaMismatch(f"column {where!r} has Spark type {spark.simpleString()}, which Iceberg cannot store")


def spark_schema_to_iceberg(schema: st.StructType) -> Schema:
    """A schema for a file sink, which has no table: the DataFrame's own columns, all optional."""
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.types import StructType

    refuse_duplicates([f.name for f in schema.fields])
    struct = spark_to_iceberg(schema, "")
    assert isinstance(struct, StructType)
    return assign_fresh_schema_ids(Schema(*struct.fields))


def refuse_duplicates(names: list[str]) -> None:
    """Refuse a DataFrame whose columns repeat a name: Iceberg names each column once."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaMismatch(f"input has duplicate column name(s) {duplicates}")


def casts_to(source: st.DataType, target: IcebergType, where: str, faults: list[str]) -> bool:
    """Whether a Spark column of ``source`` can be cast into an Iceberg column of ``target``; appends
    each fault naming the (nested) column; returns whether a cast is needed. Spark casts structs by
    position, so a struct's fields must be the table's names in the table's order."""
    from pyiceberg.types import ListType, MapType, StructType
    from pyspark.sql import types as st

    if isinstance(source, st.NullType):
        if iceberg_to_spark(target) is None:
            faults.append(f"column {where!r}: Spark cannot produce Iceberg type {target}")
        return True
    mismatch = _mismatch(where, source, target)
    if isinstance(target, StructType):
        if not isinstance(source, st.StructType):
            faults.append(mismatch)
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
            cast |= casts_to(s.dataType, t.field_type, f"{where}.{t.name}", faults)
        return cast
    if isinstance(target, ListType):
        if not isinstance(source, st.ArrayType):
            faults.append(mismatch)
            return False
        if target.element_required and source.containsNull:
            faults.append(f"list column {where!r} has required elements in the table but nullable ones in the input")
        return casts_to(source.elementType, target.element_type, f"{where}.element", faults)
    if isinstance(target, MapType):
        if not isinstance(source, st.MapType):
            faults.append(mismatch)
            return False
        if target.value_required and source.valueContainsNull:
            faults.append(f"map column {where!r} has required values in the table but nullable ones in the input")
        key = casts_to(source.keyType, target.key_type, f"{where}.key", faults)
        value = casts_to(source.valueType, target.value_type, f"{where}.value", faults)
        return key or value
    return _primitive_casts_to(source, target, where, faults)


def _primitive_casts_to(source: st.DataType, target: IcebergType, where: str, faults: list[str]) -> bool:
    from pyiceberg import types as it
    from pyspark.sql import types as st

    exact = iceberg_to_spark(target)
    if exact is None:
        faults.append(f"column {where!r} has Iceberg type {target}, which Spark cannot produce")
        return False
    if source == exact or (isinstance(target, it.StringType) and isinstance(source, st.VarcharType | st.CharType)):
        return False
    promotions: dict[type[IcebergType], tuple[type[st.DataType], ...]] = {
        it.IntegerType: (st.ByteType, st.ShortType),
        it.LongType: (st.ByteType, st.ShortType, st.IntegerType),
        it.DoubleType: (st.FloatType,),
    }
    if isinstance(source, promotions.get(type(target), ())):
        return True
    if (
        isinstance(target, it.DecimalType)
        and isinstance(source, st.DecimalType)
        and source.scale == target.scale
        and source.precision <= target.precision
    ):
        return True
    faults.append(f"{_mismatch(where, source, target)} (only lossless promotions are cast)")
    return False


def _mismatch(where: str, source: st.DataType, target: IcebergType) -> str:
    return f"column {where!r} is {source.simpleString()} in the input but {target} in the table"


def reads_as(written: IcebergType, target: IcebergType, where: str) -> str | None:
    """``None`` when data written as ``written`` reads as ``target``; otherwise what is wrong, and
    where. A Parquet file carries no ids for the commit to match, so nested fields match by name."""
    from pyiceberg import types as it

    if isinstance(target, it.StructType):
        if not isinstance(written, it.StructType):
            return f"{where}: {written} cannot be written into {target}"
        written_fields = {f.name: f for f in written.fields}
        for target_field in target.fields:
            sub = f"{where}.{target_field.name}"
            written_field = written_fields.pop(target_field.name, None)
            if written_field is None:
                if target_field.required:
                    return f"{sub}: required in the table but not written"
                continue
            if problem := field_reads_as(written_field, target_field, sub):
                return problem
        return f"{where}: fields {sorted(written_fields)} are not in the table" if written_fields else None
    if isinstance(target, it.ListType):
        if not isinstance(written, it.ListType):
            return f"{where}: {written} cannot be written into {target}"
        return field_reads_as(written.element_field, target.element_field, f"{where}.element")
    if isinstance(target, it.MapType):
        if not isinstance(written, it.MapType):
            return f"{where}: {written} cannot be written into {target}"
        return field_reads_as(written.key_field, target.key_field, f"{where}.key") or field_reads_as(
            written.value_field, target.value_field, f"{where}.value"
        )
    if written == target or (str(written), str(target)) in {("int", "long"), ("float", "double")}:
        return None
    return f"{where}: written as {written}, the table has {target}"


def field_reads_as(written: NestedField, target: NestedField, where: str) -> str | None:
    """``reads_as`` for a field, which also may not be optional where the table's is required."""
    if target.required and not written.required:
        return f"{where}: written as optional (may hold nulls), required in the table"
    return reads_as(written.field_type, target.field_type, where)
