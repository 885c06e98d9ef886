"""Partition transforms written as strings: checked against the schema, named, in Iceberg's JSON form.

The rules a DAG author follows are in the package's docstring (``table_spec``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.table_spec.schema import Column, DeclaredSchema

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

_TIME_SOURCES = frozenset({"timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"})
#: Which primitive columns each transform applies to (the Iceberg spec's table, as pyiceberg's
#: ``can_transform`` implements it); ``None``: every primitive column.
_TRANSFORM_SOURCES: dict[str, frozenset[str] | None] = {
    "identity": None,
    "year": _TIME_SOURCES | {"date"},
    "month": _TIME_SOURCES | {"date"},
    "day": _TIME_SOURCES | {"date"},
    "hour": _TIME_SOURCES,
    "bucket": _TIME_SOURCES | {"int", "long", "date", "time", "decimal", "string", "fixed", "binary", "uuid"},
    "truncate": frozenset({"int", "long", "decimal", "string", "binary"}),
    "void": None,
}
_SPARK_SPELLINGS = {"years": "year", "months": "month", "days": "day", "hours": "hour"}
_DEFAULT_NAME = {
    "identity": "{col}",
    "year": "{col}_year",
    "month": "{col}_month",
    "day": "{col}_day",
    "hour": "{col}_hour",
    "bucket": "{col}_bucket_{arg}",
    "truncate": "{col}_trunc_{arg}",
    "void": "{col}_null",
}
_TRANSFORMS_HELP = (
    "write 'col', 'identity(col)', 'year(col)', 'month(col)', 'day(col)', 'hour(col)', "
    "'bucket(N, col)', 'truncate(W, col)' or 'void(col)', optionally followed by ' as name'"
)
_TRANSFORM = re.compile(
    r"""^\s*(?:
        (?P<fn>[A-Za-z_]+)\s*\(\s*(?:(?P<arg>[^,()]*?)\s*,\s*)?(?P<col>[^,()]*?)\s*\)
        |(?P<bare>[^\s(),]+)
    )(?:\s+[Aa][Ss]\s+(?P<name>[^\s(),]+))?\s*$""",
    re.VERBOSE,
)
#: The first id of a partition field, as in every Iceberg implementation.
PARTITION_FIELD_ID_START = 1000


@dataclass(frozen=True)
class DeclaredPartitioning:
    """A partitioning declared as transform strings, checked against its schema, in Iceberg's JSON form."""

    json: Mapping[str, Any]

    def to_pyiceberg(self) -> PartitionSpec:
        from pyiceberg.partitioning import PartitionSpec

        return PartitionSpec.model_validate(self.json)


def declare_partitioning(
    transforms: Sequence[str], schema: DeclaredSchema | Schema, *, where: str
) -> DeclaredPartitioning:
    """Check transform strings against the schema's top-level columns; name the partition fields.

    :raises InvalidSinkConfig: naming the transform at fault and what to write instead.
    """
    if isinstance(transforms, str):
        raise InvalidSinkConfig(
            f"{where}: partition_spec={transforms!r} is one string; give a list of transforms, e.g. [{transforms!r}]"
        )
    columns = schema.columns if isinstance(schema, DeclaredSchema) else _pyiceberg_columns(schema)
    fields: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], str] = {}
    for position, text in enumerate(transforms):
        transform, column, name = _transform(text, columns, where)
        if name in (f["name"] for f in fields):
            raise InvalidSinkConfig(
                f"{where}: partition {text!r}: another partition field is named {name!r} already; "
                "name this one with ' as other_name'"
            )
        if name in columns and not (name == column and transform in ("identity", "void")):
            raise InvalidSinkConfig(
                f"{where}: partition {text!r}: its name {name!r} is a column's; only an identity or void "
                "partition of that column may share its name: add ' as other_name'"
            )
        # As Iceberg's PartitionSpec.Builder refuses: one time transform per column, any other once.
        family = "time" if transform in ("year", "month", "day", "hour") else transform
        earlier = seen.get((family, column))
        if earlier is not None:
            raise InvalidSinkConfig(
                f"{where}: partition {text!r} is redundant with {earlier!r} on the same column "
                "(Iceberg allows one time transform per column, and any other transform once): drop one"
            )
        if family != "void":
            seen[(family, column)] = text
        fields.append(
            {
                "source-id": columns[column].field_id,
                "field-id": PARTITION_FIELD_ID_START + position,
                "name": name,
                "transform": transform,
            }
        )
    return DeclaredPartitioning({"spec-id": 0, "fields": fields})


def _transform(text: object, columns: Mapping[str, Column], where: str) -> tuple[str, str, str]:
    """``(Iceberg transform string, source column, partition field name)`` of one transform string."""
    if not isinstance(text, str):
        raise InvalidSinkConfig(f"{where}: partition {text!r} is not a string; {_TRANSFORMS_HELP}")
    match = _TRANSFORM.fullmatch(text)
    if match is None or (match["fn"] is not None and not match["col"]):
        raise InvalidSinkConfig(f"{where}: partition {text!r} is not a transform; {_TRANSFORMS_HELP}")
    if match["bare"] is not None:
        fn, arg, column = "identity", None, match["bare"]
    else:
        fn, arg, column = match["fn"].lower(), match["arg"], match["col"]
        fn = _SPARK_SPELLINGS.get(fn, fn)
    if fn not in _TRANSFORM_SOURCES:
        raise InvalidSinkConfig(f"{where}: partition {text!r}: unknown transform {match['fn']!r}; {_TRANSFORMS_HELP}")
    if fn in ("bucket", "truncate"):
        width = "N" if fn == "bucket" else "W"
        if arg is None:
            raise InvalidSinkConfig(
                f"{where}: partition {text!r}: {fn} takes a number first; write '{fn}({width}, {column})'"
            )
        if not arg.isdigit() and column.isdigit():  # bucket(col, 16): Iceberg's order is number first
            raise InvalidSinkConfig(
                f"{where}: partition {text!r}: the number comes first; write '{fn}({column}, {arg})'"
            )
        if not arg.isdigit() or int(arg) < 1:
            raise InvalidSinkConfig(
                f"{where}: partition {text!r}: {width} must be a whole number of at least 1; write '{fn}({width}, {column})'"
            )
        arg = str(int(arg))
    elif arg is not None:
        raise InvalidSinkConfig(f"{where}: partition {text!r}: {fn} takes one column; write '{fn}({column})'")
    source = columns.get(column)
    if source is None:
        near = [c for c in columns if c.lower() == column.lower()]
        instead = f"did you mean {near[0]!r}?" if near else "the columns are " + ", ".join(repr(c) for c in columns)
        raise InvalidSinkConfig(
            f"{where}: partition {text!r} is over {column!r}, which is not a top-level column; {instead}"
        )
    applies_to = _TRANSFORM_SOURCES[fn]
    if source.primitive is None:  # even for void: Iceberg's Java builder checks every source column
        raise InvalidSinkConfig(
            f"{where}: partition {text!r}: column {column!r} is a {source.type}; a partition needs a primitive column"
        )
    if applies_to is not None and source.primitive not in applies_to:
        raise InvalidSinkConfig(
            f"{where}: partition {text!r}: {fn} does not apply to column {column!r} of type {source.type}; "
            f"it applies to {', '.join(sorted(applies_to))}"
        )
    iceberg = f"{fn}[{arg}]" if arg is not None else fn
    name = match["name"] or _DEFAULT_NAME[fn].format(col=column, arg=arg)
    return iceberg, column, name


def _pyiceberg_columns(schema: Schema) -> dict[str, Column]:
    """The top-level columns of a pyiceberg ``Schema``: a primitive type's ``str`` is its JSON name
    (``decimal(12, 2)``), a nested type's ``type`` is ``list``, ``map`` or ``struct``."""
    return {
        f.name: Column(f.field_id, str(f.field_type) if f.field_type.is_primitive else str(f.field_type.type))  # type: ignore[attr-defined]
        for f in schema.fields
    }
