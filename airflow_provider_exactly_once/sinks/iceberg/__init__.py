"""Exactly-once commits into Apache Iceberg tables through pyiceberg (design.md, "The Iceberg commit").

``committer`` is the sink's ``SinkCommitter``; ``write_check``, ``epoch_snapshot``,
``prepared_manifests``, ``overwrites``, ``table_transactions`` and ``transaction`` check, stage and
commit; ``markers`` reads back; ``descriptors`` and ``data_files`` describe written files;
``catalog_access`` loads tables. Names resolve on first use (PEP 562): a Spark executor's worker
needs ``descriptors`` without the committer's catalog and SQLAlchemy (about 0.2 s of its start), a
commit task the committer without the descriptions (about 0.25 s).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
    from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
    from airflow_provider_exactly_once.sinks.iceberg.markers import find_marker, marker_properties

_HOMES = {
    "IcebergSinkCommitter": "committer",
    "describe_parquet_file": "descriptors",
    "find_marker": "markers",
    "marker_properties": "markers",
}

__all__ = ["IcebergSinkCommitter", "describe_parquet_file", "find_marker", "marker_properties"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
