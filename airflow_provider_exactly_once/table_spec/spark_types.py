"""A table's declared schema as the Spark DDL its input is read with.

A JSON or CSV landing directory read without a schema is inferred per run, so an hour that lacks a
field is read with other types than the table's. The table's own schema, declared once for
``EnsureTableOperator``, is the read schema instead: the task group derives one from the other, so
a DAG file does not state its columns twice in two languages.

The mapping is the one the Spark writer fits a DataFrame to (``spark.alignment.iceberg_to_spark``):
the types that writer cannot write (``time``, ``uuid``, ``fixed[N]``, the nanosecond timestamps)
are refused here, naming the column, rather than at the first run. Nullability is left out: Spark
reads every file source as nullable whatever the schema says, and the writer checks required
columns row by row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.table_spec.schema import DeclaredSchema

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

#: Iceberg's primitive types and the Spark SQL type a column of each is read as.
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
_DECIMAL = re.compile(r"decimal\((\d+), (\d+)\)")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def spark_read_schema(schema: DeclaredSchema | Schema, *, where: str) -> str:
    """The Spark DDL (``"id BIGINT, at TIMESTAMP"``) of a declared or a pyiceberg schema.

    :raises InvalidSinkConfig: naming the column whose type the Spark writer cannot write.
    """
    # A pyiceberg Schema's JSON is the form a declaration holds (Iceberg's table metadata).
    schema_json = schema.json if isinstance(schema, DeclaredSchema) else json.loads(schema.model_dump_json())
    return _fields(schema_json["fields"], "", where, ", ", " ")


def _fields(fields: Sequence[Mapping[str, Any]], parent: str, where: str, sep: str, colon: str) -> str:
    return sep.join(_name(f["name"]) + colon + _type(f["type"], parent + f["name"], where) for f in fields)


def _type(type_json: Any, path: str, where: str) -> str:
    if isinstance(type_json, str):
        if type_json in SPARK_TYPES:
            return SPARK_TYPES[type_json]
        if decimal := _DECIMAL.fullmatch(type_json):
            return f"DECIMAL({decimal[1]}, {decimal[2]})"
        raise InvalidSinkConfig(
            f"{where}: column {path!r}: the Spark write cannot write an Iceberg {type_json} column, so no "
            "read schema follows from the table's; give the input its own schema_ddl, or write the column "
            "with another operator"
        )
    if type_json["type"] == "list":
        return f"ARRAY<{_type(type_json['element'], f'{path}.element', where)}>"
    if type_json["type"] == "map":
        key = _type(type_json["key"], f"{path}.key", where)
        return f"MAP<{key}, {_type(type_json['value'], f'{path}.value', where)}>"
    return f"STRUCT<{_fields(type_json['fields'], f'{path}.', where, ', ', ': ')}>"


def _name(name: str) -> str:
    """A column name as Spark DDL takes it: plain, or between backticks (a backtick doubled)."""
    return name if _PLAIN_NAME.fullmatch(name) else "`" + name.replace("`", "``") + "`"
