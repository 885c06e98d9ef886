"""Declare a sink's table as a task of the DAG, through the sink's own Iceberg connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.operators._common import airflow_errors
from airflow_provider_exactly_once.runtime.assembly import as_sink
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.table_spec import (
    DeclaredPartitioning,
    DeclaredSchema,
    declare_table,
    to_pyiceberg,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema


class EnsureTableOperator(BaseOperator):
    """Create the sink's table when it is missing; leave it (and its metadata folder) alone when it exists.

    :param sink: an Iceberg sink (config or dict); its connection reaches the catalog.
    :param schema: the table's schema when it has to be created: a mapping of column name to
        Iceberg type (``{"id": "long not null", "at": "timestamptz"}``, see
        :mod:`~airflow_provider_exactly_once.table_spec`) or a pyiceberg ``Schema`` (or one the
        epoch group declared already).
    :param partition_spec: its partitioning (unpartitioned by default): a list of transforms
        (``["day(at)"]``, ``["bucket(16, id) as shard"]``) or a pyiceberg ``PartitionSpec``.
        The light forms are checked when the DAG is parsed, without importing pyiceberg (whose
        import would cost every parse more than the rest of a DAG file), and become pyiceberg
        objects only when the task runs.
    :param table: which of the sink's tables (default: its only one).
    :param properties: table properties at creation.
    :return: the table's metadata location.
    """

    ui_color = "#e7eef8"

    def __init__(
        self,
        *,
        sink: SinkConfig | Mapping[str, Any],
        schema: Schema | DeclaredSchema | Mapping[str, Any],
        partition_spec: PartitionSpec | DeclaredPartitioning | Sequence[str] | None = None,
        table: str | None = None,
        properties: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        config = as_sink(sink)
        if not isinstance(config, IcebergSinkConfig):
            raise InvalidSinkConfig(f"task {self.task_id}: sink {config.sink_id!r} is not an Iceberg sink")
        if table is None and len(config.tables) != 1:
            raise InvalidSinkConfig(f"task {self.task_id}: sink {config.sink_id!r} has several tables; name one")
        if table is not None and table not in config.tables:
            raise InvalidSinkConfig(f"task {self.task_id}: {table!r} is not a table of sink {config.sink_id!r}")
        self.sink = config
        self.table = table or config.tables[0]
        self.properties = dict(properties or {})
        self.schema, self.partition_spec = declare_table(
            schema, partition_spec, where=f"task {self.task_id}", properties=self.properties
        )

    def execute(self, context: Context) -> str:
        from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

        from airflow_provider_exactly_once.tables import ensure_table

        with airflow_errors():
            catalog = IcebergHook(self.sink.iceberg_conn_id).catalog
            schema, spec = to_pyiceberg(self.schema, self.partition_spec)
            table = ensure_table(catalog, self.table, schema, spec, self.properties)
        self.log.info("Table %r of sink %r: %s", self.table, self.sink.sink_id, table.metadata_location)
        return str(table.metadata_location)
