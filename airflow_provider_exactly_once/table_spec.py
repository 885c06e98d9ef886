"""A table's schema and partitioning written as plain values, checked without pyiceberg.

The dag-processor runs a DAG file at every parse, and importing pyiceberg to build a ``Schema``
costs that parse about half a second, more than the rest of a DAG file. So a table may be
declared with plain values instead: checked here, when the DAG is parsed, with nothing but the
standard library, and turned into pyiceberg objects only when the task that creates the table
runs (:func:`to_pyiceberg` imports pyiceberg inside).

**Schema**: a mapping of column name to type, in column order::

    {
        "event_id": "string not null",  # ' not null': a required column
        "amount": "decimal(12, 2)",
        "tags": {"type": "list", "element": "string"},
        "attributes": {"type": "map", "key": "string", "value": "string"},
        "address": {"type": "struct", "fields": {"city": "string", "zip": "string"}, "required": True},
    }

- A primitive type is written as Iceberg's JSON schema writes it (and pyiceberg parses it):
  ``boolean``, ``int``, ``long``, ``float``, ``double``, ``decimal(P, S)``, ``date``, ``time``,
  ``timestamp``, ``timestamptz``, ``timestamp_ns``, ``timestamptz_ns``, ``string``, ``uuid``,
  ``fixed[N]``, ``binary``. Case and spaces inside the parentheses do not matter. The nanosecond
  timestamps need format version 3 (``properties={"format-version": "3"}``), which pyiceberg 0.12
  cannot create yet; they are refused for a table of version 1 or 2.
- A nested type is a dict: ``{"type": "list", "element": T}``, ``{"type": "map", "key": T,
  "value": T}``, ``{"type": "struct", "fields": {name: T, ...}}``, where each ``T`` is again a type.
  It is Iceberg's JSON form without the ids (they are assigned in order, see below) and with the
  ``*-required`` flags written as for any other value.
- Whatever may be null (a column, a struct field, a list element, a map value) is optional unless
  its type string ends in ``not null`` or its dict has ``"required": True``. A map's keys are
  always required (the Iceberg spec says so).
- Field ids are assigned as pyiceberg's ``create_table`` assigns them (``assign_fresh_schema_ids``):
  from 1, every field of a struct before the fields nested in them, a list's element and a map's
  key and value when their parent is reached. A table created from a declaration has these ids, so
  a pyiceberg ``PartitionSpec`` may name its source columns by them.

**Partitioning**: a sequence of transforms over top-level columns, in partition order:
``"col"`` or ``"identity(col)"``, ``"year(col)"``, ``"month(col)"``, ``"day(col)"``,
``"hour(col)"``, ``"bucket(N, col)"``, ``"truncate(W, col)"``, ``"void(col)"``; Spark's plural
spellings (``days(col)``...) are taken too. A partition field is named as pyiceberg names one
(``table.update_spec().add_field``): ``col`` for identity, ``col_year``, ``col_month``,
``col_day``, ``col_hour``, ``col_bucket_N``, ``col_trunc_W``, ``col_null``. Iceberg's Spark DDL
names bucket and truncate fields ``col_bucket`` and ``col_trunc`` instead; ``" as name"`` after a
transform (Iceberg's own ``ADD PARTITION FIELD ... AS name``) gives the field any name.
A column whose name has commas or parentheses needs a pyiceberg ``PartitionSpec``; one with spaces
is written inside a transform (``identity(my column)``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any, TypeAlias

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

#: Iceberg's primitive types as its JSON schema names them; decimal and fixed take parameters.
PRIMITIVE_TYPES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "decimal(P, S)",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "timestamp_ns",
    "timestamptz_ns",
    "string",
    "uuid",
    "fixed[N]",
    "binary",
)
_PLAIN = frozenset(t for t in PRIMITIVE_TYPES if not t.endswith((")", "]")))
_DECIMAL = re.compile(r"decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_FIXED = re.compile(r"fixed\s*\[\s*(\d+)\s*\]")
_NOT_NULL = re.compile(r"\s+not\s+null$", re.IGNORECASE)
_MAX_DECIMAL_PRECISION = 38  # the Iceberg spec's bound

#: What people write for a type, from SQL, Spark or Python, and its Iceberg name.
_INSTEAD = {
    "bool": "boolean",
    "integer": "int",
    "tinyint": "int",
    "smallint": "int",
    "bigint": "long",
    "int64": "long",
    "int32": "int",
    "real": "float",
    "float32": "float",
    "float64": "double",
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "bytes": "binary",
    "datetime": "timestamp (no time zone) or timestamptz (an instant, Spark's TIMESTAMP)",
    "timestamp_ntz": "timestamp",
    "timestamp_ltz": "timestamptz",
    "decimal": "decimal(P, S), e.g. decimal(12, 2)",
    "numeric": "decimal(P, S), e.g. decimal(12, 2)",
    "fixed": "fixed[N], e.g. fixed[16]",
    "array": '{"type": "list", "element": ...}',
    "list": '{"type": "list", "element": ...}',
    "map": '{"type": "map", "key": ..., "value": ...}',
    "struct": '{"type": "struct", "fields": {...}}',
}

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
class Column:
    """A top-level column as a partition transform sees it: its field id and its type."""

    field_id: int
    #: The primitive type (``"long"``, ``"decimal(12, 2)"``) or the kind of a nested one
    #: (``"list"``, ``"map"``, ``"struct"``).
    type: str

    @property
    def primitive(self) -> str | None:
        """The primitive type without its parameters (``"decimal"``), or ``None`` for a nested type."""
        if self.type in ("list", "map", "struct"):
            return None
        return self.type.split("(")[0].split("[")[0]


@dataclass(frozen=True)
class DeclaredSchema:
    """A schema declared as column name to type, checked, field ids assigned, in Iceberg's JSON form."""

    json: Mapping[str, Any]

    @property
    def columns(self) -> dict[str, Column]:
        return {f["name"]: Column(f["id"], _kind(f["type"])) for f in self.json["fields"]}

    def to_pyiceberg(self) -> Schema:
        from pyiceberg.schema import Schema

        return Schema.model_validate(self.json)


@dataclass(frozen=True)
class DeclaredPartitioning:
    """A partitioning declared as transform strings, checked against its schema, in Iceberg's JSON form."""

    json: Mapping[str, Any]

    def to_pyiceberg(self) -> PartitionSpec:
        from pyiceberg.partitioning import PartitionSpec

        return PartitionSpec.model_validate(self.json)


def declare_schema(columns: Mapping[str, Any], *, where: str) -> DeclaredSchema:
    """Check a mapping of column name to type and assign its field ids.

    :param where: what the error names first (``"task create_table"``, ``"table ns.events"``).
    :raises InvalidSinkConfig: naming the column at fault and what to write instead.
    """
    if not columns:
        raise InvalidSinkConfig(f"{where}: the schema has no column; give at least one, e.g. {{'id': 'long'}}")
    fields = [_field(name, value, "", where) for name, value in columns.items()]
    ids = count(1)
    return DeclaredSchema({"type": "struct", "schema-id": 0, "fields": _struct_json(fields, ids)})


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


def declare_table(
    schema: Schema | DeclaredSchema | Mapping[str, Any],
    partition_spec: PartitionSpec | DeclaredPartitioning | Sequence[str] | None,
    *,
    where: str,
    properties: Mapping[str, str] | None = None,
) -> tuple[Schema | DeclaredSchema, PartitionSpec | DeclaredPartitioning | None]:
    """Check a table's declaration, whichever form each part is in; pyiceberg objects and what was
    declared already (an ``EnsureTableOperator``'s ``schema``, say) pass as they are.

    The light forms are checked here, without importing pyiceberg; a pyiceberg ``Schema`` can only
    have been built by a caller that imported pyiceberg already, so reading it costs nothing more.
    ``properties`` (the table's, at creation) tell the format version: nanosecond timestamps need 3.
    """
    declared: Schema | DeclaredSchema
    if isinstance(schema, Mapping):
        declared = declare_schema(schema, where=where)
        _check_format_version(declared, properties or {}, where)
    elif isinstance(schema, DeclaredSchema) or _is_instance(schema, "pyiceberg.schema", "Schema"):
        declared = schema
    else:
        raise InvalidSinkConfig(
            f"{where}: schema must be a mapping of column name to Iceberg type (e.g. {{'id': 'long not null'}}) "
            f"or a pyiceberg Schema, not {type(schema).__name__}"
        )
    spec: PartitionSpec | DeclaredPartitioning | None
    if partition_spec is None or isinstance(partition_spec, DeclaredPartitioning):
        spec = partition_spec
    elif isinstance(partition_spec, Sequence):  # a string too: refused there, with what to write instead
        spec = declare_partitioning(partition_spec, declared, where=where)
    elif _is_instance(partition_spec, "pyiceberg.partitioning", "PartitionSpec"):
        spec = partition_spec
    else:
        raise InvalidSinkConfig(
            f"{where}: partition_spec must be a list of transforms (e.g. ['day(event_time)']) or a pyiceberg "
            f"PartitionSpec, not {type(partition_spec).__name__}"
        )
    return declared, spec


def to_pyiceberg(
    schema: Schema | DeclaredSchema, partition_spec: PartitionSpec | DeclaredPartitioning | None
) -> tuple[Schema, PartitionSpec]:
    """The pyiceberg objects a declaration stands for (unpartitioned when ``partition_spec`` is ``None``)."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

    pyiceberg_schema = schema.to_pyiceberg() if isinstance(schema, DeclaredSchema) else schema
    if partition_spec is None:
        return pyiceberg_schema, UNPARTITIONED_PARTITION_SPEC
    if isinstance(partition_spec, DeclaredPartitioning):
        return pyiceberg_schema, partition_spec.to_pyiceberg()
    return pyiceberg_schema, partition_spec


# --- the schema ------------------------------------------------------------------------------------

#: Types a table of an earlier format version cannot hold (the Iceberg spec; pyiceberg refuses them
#: when it creates the table).
_FORMAT_3_TYPES = frozenset({"timestamp_ns", "timestamptz_ns"})


def _check_format_version(schema: DeclaredSchema, properties: Mapping[str, str], where: str) -> None:
    version = str(properties.get("format-version", "2")).strip()
    if version not in ("1", "2"):
        return
    for path, type_name in _primitives(schema.json["fields"], ""):
        if type_name in _FORMAT_3_TYPES:
            raise InvalidSinkConfig(
                f"{where}: column {path!r}: {type_name} needs Iceberg format version 3, and the table would be "
                f"created with version {version}; use {type_name.removesuffix('_ns')} (microseconds), or "
                "properties={'format-version': '3'} once the installed pyiceberg can create such tables "
                "(0.12 cannot)"
            )


def _primitives(fields: Sequence[Mapping[str, Any]], parent: str) -> Iterator[tuple[str, str]]:
    """``(path, type)`` of every primitive in Iceberg JSON fields, nested ones included."""
    for f in fields:
        yield from _primitives_of(f["type"], f"{parent}{f['name']}")


def _primitives_of(type_json: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(type_json, str):
        yield path, type_json
    elif type_json["type"] == "list":
        yield from _primitives_of(type_json["element"], f"{path}.element")
    elif type_json["type"] == "map":
        yield from _primitives_of(type_json["key"], f"{path}.key")
        yield from _primitives_of(type_json["value"], f"{path}.value")
    else:
        yield from _primitives(type_json["fields"], f"{path}.")


@dataclass(frozen=True)
class _Field:
    name: str
    type: _Type
    required: bool


@dataclass(frozen=True)
class _List:
    element: _Type
    element_required: bool


@dataclass(frozen=True)
class _Map:
    key: _Type
    value: _Type
    value_required: bool


@dataclass(frozen=True)
class _Struct:
    fields: tuple[_Field, ...]


_Type: TypeAlias = str | _List | _Map | _Struct


def _field(name: object, value: object, parent: str, where: str) -> _Field:
    if not isinstance(name, str) or not name.strip():
        raise InvalidSinkConfig(f"{where}: a column name must be a non-empty string, not {name!r}")
    path = f"{parent}{name}"
    field_type, required = _type(value, path, where)
    return _Field(name, field_type, required)


def _type(value: object, path: str, where: str) -> tuple[_Type, bool]:
    """A type and whether its value is required, from a type string or a nested type's dict."""
    if isinstance(value, str):
        return _primitive(value, path, where)
    if isinstance(value, Mapping):
        return _nested(value, path, where)
    raise InvalidSinkConfig(
        f"{where}: column {path!r}: its type must be a type string such as 'long' or a dict such as "
        f"{{'type': 'list', 'element': 'string'}}, not {type(value).__name__} {value!r}"
    )


def _primitive(text: str, path: str, where: str) -> tuple[str, bool]:
    stripped = text.strip()
    required = _NOT_NULL.search(stripped) is not None
    name = _NOT_NULL.sub("", stripped).strip().lower()
    if name in _PLAIN:
        return name, required
    if decimal := _DECIMAL.fullmatch(name):
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 1 <= precision <= _MAX_DECIMAL_PRECISION or scale > precision:
            raise InvalidSinkConfig(
                f"{where}: column {path!r}: {text!r} is not a decimal Iceberg allows; write decimal(P, S) "
                f"with a precision P from 1 to {_MAX_DECIMAL_PRECISION} and a scale S no greater than P"
            )
        return f"decimal({precision}, {scale})", required
    if fixed := _FIXED.fullmatch(name):
        if int(fixed[1]) < 1:
            raise InvalidSinkConfig(f"{where}: column {path!r}: {text!r} has no length; write fixed[N] with N >= 1")
        return f"fixed[{int(fixed[1])}]", required
    base = re.split(r"[\s(\[<]", name, maxsplit=1)[0]
    hint = _INSTEAD.get(name) or _INSTEAD.get(base)
    instead = f"write {hint}" if hint else "write one of " + ", ".join(PRIMITIVE_TYPES)
    raise InvalidSinkConfig(
        f"{where}: column {path!r}: unknown type {text!r}; {instead} (followed by ' not null' when it is required)"
    )


_NESTED_KEYS = {"list": ("element",), "map": ("key", "value"), "struct": ("fields",)}


def _nested(spec: Mapping[Any, Any], path: str, where: str) -> tuple[_Type, bool]:
    kind = spec.get("type")
    if kind not in _NESTED_KEYS:
        raise InvalidSinkConfig(
            f"{where}: column {path!r}: a dict type needs 'type' 'list', 'map' or 'struct', not {kind!r}; "
            "a primitive type is a string such as 'long'"
        )
    allowed = {"type", "required", *_NESTED_KEYS[kind]}
    for key in spec:
        if key in allowed:
            continue
        if str(key) in ("id", "element-id", "key-id", "value-id"):
            instead = "leave the ids out: they are assigned in order"
        elif str(key) in ("element-required", "value-required"):
            instead = f"write the {str(key).split('-')[0]}'s type as 'T not null' (a dict: 'required': True)"
        else:
            instead = f"a {kind} takes " + ", ".join(repr(k) for k in sorted(allowed))
        raise InvalidSinkConfig(f"{where}: column {path!r}: unknown key {key!r} in its {kind} type; {instead}")
    for key in _NESTED_KEYS[kind]:
        if key not in spec:
            raise InvalidSinkConfig(f"{where}: column {path!r}: its {kind} type has no {key!r}")
    required = spec.get("required", False)
    if not isinstance(required, bool):
        raise InvalidSinkConfig(f"{where}: column {path!r}: 'required' must be True or False, not {required!r}")
    if kind == "list":
        element, element_required = _type(spec["element"], f"{path}.element", where)
        return _List(element, element_required), required
    if kind == "map":
        key_type, _ = _type(spec["key"], f"{path}.key", where)  # a map's keys are always required
        value, value_required = _type(spec["value"], f"{path}.value", where)
        return _Map(key_type, value, value_required), required
    fields = spec["fields"]
    if not isinstance(fields, Mapping) or not fields:
        raise InvalidSinkConfig(
            f"{where}: column {path!r}: a struct's 'fields' must be a non-empty mapping of field name to type, "
            f"e.g. {{'city': 'string'}}, not {fields!r}"
        )
    return _Struct(tuple(_field(name, value, f"{path}.", where) for name, value in fields.items())), required


def _struct_json(fields: Sequence[_Field], ids: Iterator[int]) -> list[dict[str, Any]]:
    """The fields as Iceberg JSON; ids in the order of pyiceberg's ``assign_fresh_schema_ids``: every
    field of a struct first, then what each of them nests, field by field."""
    field_ids = [next(ids) for _ in fields]
    return [
        {"id": field_id, "name": f.name, "required": f.required, "type": _type_json(f.type, ids)}
        for field_id, f in zip(field_ids, fields, strict=True)
    ]


def _type_json(value: _Type, ids: Iterator[int]) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, _List):
        element_id = next(ids)
        return {
            "type": "list",
            "element-id": element_id,
            "element": _type_json(value.element, ids),
            "element-required": value.element_required,
        }
    if isinstance(value, _Map):
        key_id, value_id = next(ids), next(ids)
        return {
            "type": "map",
            "key-id": key_id,
            "key": _type_json(value.key, ids),
            "value-id": value_id,
            "value": _type_json(value.value, ids),
            "value-required": value.value_required,
        }
    return {"type": "struct", "fields": _struct_json(value.fields, ids)}


def _kind(type_json: Any) -> str:
    return type_json if isinstance(type_json, str) else str(type_json["type"])


# --- the partitioning ------------------------------------------------------------------------------


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


def _is_instance(value: object, module: str, name: str) -> bool:
    """``isinstance(value, module.name)`` without importing ``module``: when it was never imported,
    nothing can be an instance of its class."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))
