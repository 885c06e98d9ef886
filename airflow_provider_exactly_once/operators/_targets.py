"""The Spark write's targets, derived from the sink config when the task runs.

The sink config already names the table(s), the part of the input each table gets, the catalog
connection and the schema-evolution setting the commit uses; deriving the write's targets from it
means the two cannot disagree. The catalog properties (which may hold credentials) are read from
the Iceberg connection in ``execute`` and go only into the job spec file handed to
``spark-submit``: they are never a templated field, so they never appear in Rendered Templates.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.spark.jobspec import FileSinkTarget, IcebergTarget


def iceberg_catalog_properties(conn_id: str) -> dict[str, str]:
    """The pyiceberg catalog properties of an Iceberg connection, built as ``IcebergHook.catalog``
    builds them (extra, then the host as ``uri``, ``type`` defaulting to ``rest``, login and
    password as the REST ``credential``), so Spark's driver loads the same catalog the commit does."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    properties: dict[str, str] = {str(k): str(v) for k, v in (conn.extra_dejson or {}).items()}
    if conn.host:
        properties["uri"] = conn.host.rstrip("/")
    properties.setdefault("type", "rest")
    if properties["type"] == "rest" and conn.login and conn.password:
        properties["credential"] = f"{conn.login}:{conn.password}"
    return properties


def check_target_for(sink: SinkConfig, target: FileSinkTarget | None) -> None:
    """Refuse, when the DAG is parsed, a sink the epoch writer cannot write as configured."""
    if isinstance(sink, IcebergSinkConfig):
        if target is not None:
            raise InvalidSinkConfig(
                f"sink {sink.sink_id!r}: an Iceberg sink's target is derived from the sink; do not give target="
            )
    elif target is not None and target.root != FileSinkTarget(root=sink.root).root:
        raise InvalidSinkConfig(
            f"sink {sink.sink_id!r}: target root {target.root!r} is not the sink's root {sink.root!r}"
        )


def targets_for(sink: SinkConfig, target: FileSinkTarget | None, partition_by: list[str]) -> list[dict[str, Any]]:
    """The job spec's targets: every table of an Iceberg sink, in the sink's order, with its
    selection and the connection's catalog properties; or the sink's root (``target`` adds FileIO
    and Parquet settings for a file sink)."""
    check_target_for(sink, target)
    if isinstance(sink, IcebergSinkConfig):
        properties = iceberg_catalog_properties(sink.iceberg_conn_id)
        targets = []
        for table in sink.tables:
            selection = sink.select.get(table)
            # pyiceberg's SQL catalog keys tables by catalog name; IcebergHook names it after the connection.
            targets.append(
                IcebergTarget(
                    catalog_name=sink.iceberg_conn_id,
                    catalog_properties=properties,
                    table=table,
                    where=None if selection is None else selection.where,
                    query=None if selection is None else selection.query,
                ).model_dump(mode="json", exclude_none=True)
            )
        return targets
    assert isinstance(sink, FileSinkConfig)
    base = target or FileSinkTarget(root=sink.root)
    if partition_by:
        base = base.model_copy(update={"partition_by": list(partition_by)})
    return [base.model_dump(mode="json")]
