"""Declare a sink's Iceberg table from a schema: load it, create it only when it is missing.

Loading first, unlike pyiceberg's ``create_table_if_not_exists``, which creates first and so writes a
stray ``00000-*.metadata.json`` per run before the catalog refuses the name; only two runs racing to
create a missing table can leave the loser's one file. What the operator does: docs/operators.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.table_spec import declare_table, to_pyiceberg


def ensure_table(
    catalog: Catalog,
    name: str,
    schema: Schema | Mapping[str, Any],
    partition_spec: PartitionSpec | Sequence[str] = UNPARTITIONED_PARTITION_SPEC,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """The table ``namespace.table``, created with ``schema`` and ``partition_spec`` when missing.

    ``schema`` and ``partition_spec`` take the forms ``EnsureTableOperator`` takes: pyiceberg
    objects, or a mapping of column name to type and a list of transforms
    (:mod:`~airflow_provider_exactly_once.table_spec`), checked before the catalog is called, so
    a wrong declaration is refused whether or not the table exists yet.

    An existing table is returned as it is, even when its schema differs from ``schema``: the
    table's schema is what the writer and the commit check every epoch against, and changing it
    is a decision (``allow_schema_evolution``, or a migration), not a side effect of a DAG run.
    Spark's ``TIMESTAMP`` is an instant and maps to Iceberg's ``timestamptz``
    (``TimestamptzType``); ``TimestampType`` is Spark's ``TIMESTAMP_NTZ``.
    """
    namespace, _, table = name.rpartition(".")
    if not namespace or not table:
        raise InvalidSinkConfig(f"table {name!r} is not 'namespace.table'")
    iceberg_schema, spec = to_pyiceberg(
        *declare_table(schema, partition_spec, where=f"table {name}", properties=properties)
    )
    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        pass
    with suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    try:
        return catalog.create_table(name, iceberg_schema, partition_spec=spec, properties=dict(properties or {}))
    except TableAlreadyExistsError:
        return catalog.load_table(name)  # another run created it between our load and create
