"""Exactly-once commits into Apache Iceberg tables through pyiceberg (design.md section 5).

``committer`` is the sink's ``SinkCommitter``; ``write_check`` says whether a write can be committed;
``epoch_snapshot``, ``prepared_manifests``, ``overwrites`` and ``table_transactions`` stage and commit
its snapshots, ``transaction`` adapts pyiceberg's ``Transaction`` for them; ``markers`` reads back
what a table's snapshots prove; ``descriptors`` and ``data_files`` describe written files on the
executors and turn the descriptions into ``DataFile`` objects; ``catalog_access`` loads tables and
touches their files.

Every name is resolved on first use (PEP 562). The Spark executors' Python workers import
``descriptors`` through this package, and each worker is a new process (on Spark Connect, every
session starts its own): they need pyarrow's Parquet reader and pyiceberg's pyarrow module, not the
committer's catalog access and SQLAlchemy (about 0.2 s of each worker's start). A persist or commit
task, the other way round, needs the committer and not the descriptions (about 0.25 s).
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
