"""The meta store on SQLite or PostgreSQL, cut around its tables (design.md, "The meta store" and
"Layers"): the tables (``models``), the database with its migrations (``database``), the rows and
their compare-and-swap (``rows``), the store port with every transition (``sql``), the history and
revisions (``history``), the registry and runs (``registry``), where an epoch's input stands
(``epoch_inputs``) and the views' reads (``queries``).
"""

from airflow_provider_exactly_once.store.rows import EpochRowMissing
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

__all__ = ["EpochRowMissing", "SqlSinkStateStore"]
