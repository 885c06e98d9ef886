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

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.table_spec.partitioning import (
    PARTITION_FIELD_ID_START,
    DeclaredPartitioning,
    declare_partitioning,
)
from airflow_provider_exactly_once.table_spec.schema import (
    PRIMITIVE_TYPES,
    Column,
    DeclaredSchema,
    check_format_version,
    declare_schema,
)

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

__all__ = [
    "PARTITION_FIELD_ID_START",
    "PRIMITIVE_TYPES",
    "Column",
    "DeclaredPartitioning",
    "DeclaredSchema",
    "TableSpec",
    "declare_partitioning",
    "declare_schema",
    "declare_table",
    "to_pyiceberg",
]


class TableSpec(NamedTuple):
    """An Iceberg table as ``exactly_once_epoch(table=...)`` creates it when it is missing: the
    arguments ``EnsureTableOperator`` takes, given once, and the read schema of a JSON or CSV input
    that names none (``type_mapping.spark_read_schema``).

    A named tuple, not a dataclass: DAG files import it at every parse. It is checked where the
    table's name is known, by the task group (``declare_table``).
    """

    #: Column name to Iceberg type (the rules above), or a pyiceberg ``Schema``.
    schema: Schema | Mapping[str, Any]
    #: Transforms (``["day(at)"]``) or a pyiceberg ``PartitionSpec``; unpartitioned by default.
    partitioning: PartitionSpec | Sequence[str] | None = None
    #: Table properties at creation.
    properties: Mapping[str, str] | None = None


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
        check_format_version(declared, properties or {}, where)
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


def _is_instance(value: object, module: str, name: str) -> bool:
    """``isinstance(value, module.name)`` without importing ``module``: when it was never imported,
    nothing can be an instance of its class."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))
