"""Airflow operators: thin, they resolve settings and call into ``spark/``, ``sinks/`` and ``core/``.

Resolved on first use (PEP 562), as the package root's names are: a DAG that uses one operator must
not pay at every parse for the imports of the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
