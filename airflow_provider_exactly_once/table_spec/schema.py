"""Column types written as plain values: checked, field ids assigned, in Iceberg's JSON form.

The rules a DAG author follows are in the package's docstring (``table_spec``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig

if TYPE_CHECKING:
    from collections.abc import Iterator

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


class Column(NamedTuple):
    """A top-level column as a partition transform sees it: its field id and its type.

    This and the parse tree's nodes below are named tuples, not dataclasses: a dataclass costs about
    half a millisecond to define, and the dag-processor imports this module at every parse.
    """

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


#: Types a table of an earlier format version cannot hold (the Iceberg spec; pyiceberg refuses them
#: when it creates the table).
_FORMAT_3_TYPES = frozenset({"timestamp_ns", "timestamptz_ns"})


def check_format_version(schema: DeclaredSchema, properties: Mapping[str, str], where: str) -> None:
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


class _Field(NamedTuple):
    name: str
    type: _Type
    required: bool


class _List(NamedTuple):
    element: _Type
    element_required: bool


class _Map(NamedTuple):
    key: _Type
    value: _Type
    value_required: bool


class _Struct(NamedTuple):
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
