"""Exactly-once commits into Apache Iceberg tables through pyiceberg (design.md section 5).

``describe_parquet_file`` is resolved on first use (PEP 562): it needs pyarrow's Parquet reader and
pyiceberg's pyarrow module, which the Spark executors describing files need and a persist or commit
task does not (about 0.25 s of every such task start).
"""

from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import find_marker, marker_properties

if TYPE_CHECKING:
    from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file

__all__ = ["IcebergSinkCommitter", "describe_parquet_file", "find_marker", "marker_properties"]


def __getattr__(name: str) -> Any:
    if name == "describe_parquet_file":
        from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file

        return describe_parquet_file
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
