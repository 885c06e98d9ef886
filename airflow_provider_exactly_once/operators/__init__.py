"""Airflow operators: thin, they resolve settings and call into ``spark/``, ``sinks/`` and ``core/``.

Resolved on first use (PEP 562), as the package root's names are: a DAG that uses one operator must
not pay at every parse for the imports of the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_exactly_once.extras import lazy_exports

if TYPE_CHECKING:
    from airflow_provider_exactly_once.operators.checkpoint import MarkCheckpointOperator
    from airflow_provider_exactly_once.operators.epoch import (
        AbortEpochOperator,
        CommitEpochOperator,
        PersistPendingOperator,
    )
    from airflow_provider_exactly_once.operators.rewrite import RewriteEpochOperator
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.operators.tables import EnsureTableOperator

_WHERE = {
    "AbortEpochOperator": "epoch",
    "CommitEpochOperator": "epoch",
    "EnsureTableOperator": "tables",
    "MarkCheckpointOperator": "checkpoint",
    "PersistPendingOperator": "epoch",
    "RewriteEpochOperator": "rewrite",
    "SparkPreCommitOperator": "spark_precommit",
}

__all__ = [
    "AbortEpochOperator",
    "CommitEpochOperator",
    "EnsureTableOperator",
    "MarkCheckpointOperator",
    "PersistPendingOperator",
    "RewriteEpochOperator",
    "SparkPreCommitOperator",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
