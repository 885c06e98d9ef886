"""The meta store: ``pending_sink_state`` and its companions on SQLite or PostgreSQL (design.md section 4)."""

from airflow_provider_exactly_once.store.cas import EpochRowMissing
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

__all__ = ["EpochRowMissing", "SqlSinkStateStore"]
