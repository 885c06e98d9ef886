"""Airflow operators: thin, they resolve settings and call into ``spark/``, ``sinks/`` and ``core/``."""

from airflow_provider_exactly_once.operators.checkpoint import MarkCheckpointOperator
from airflow_provider_exactly_once.operators.epoch import (
    AbortEpochOperator,
    CommitEpochOperator,
    PersistPendingOperator,
)
from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
from airflow_provider_exactly_once.operators.tables import EnsureTableOperator

__all__ = [
    "AbortEpochOperator",
    "CommitEpochOperator",
    "EnsureTableOperator",
    "MarkCheckpointOperator",
    "PersistPendingOperator",
    "SparkPreCommitOperator",
]
