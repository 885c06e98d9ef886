"""Exactly-once commits into Apache Iceberg tables through pyiceberg (design.md section 5)."""

from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.sinks.iceberg.markers import find_marker, marker_properties

__all__ = ["IcebergSinkCommitter", "describe_parquet_file", "find_marker", "marker_properties"]
