"""Exactly-once delivery into Iceberg and file sinks, driven by Airflow.

Everything a DAG author uses is importable from here, in one line::

    from airflow_provider_exactly_once import IcebergSinkConfig, SparkPreCommitOperator, exactly_once_epoch

Names resolve on first use (PEP 562), so the Spark driver, ``eo-sink`` and Airflow's provider
discovery import the package without Airflow, Spark or pyiceberg.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from airflow_provider_exactly_once.extras import lazy_exports
from airflow_provider_exactly_once.version import SUPPORTED_PYTHON, __version__

if not SUPPORTED_PYTHON[0] <= sys.version_info[:2] <= SUPPORTED_PYTHON[1]:
    raise ImportError(
        f"airflow-provider-exactly-once {__version__} supports Python 3.11 to 3.13, not "
        f"{sys.version_info[0]}.{sys.version_info[1]}: install it into a Python 3.11, 3.12 or 3.13 environment"
    )

if TYPE_CHECKING:
    from airflow_provider_exactly_once.checkpoints.config import (
        MarkerFileCheckpoint,
        MetaStoreCheckpoint,
        SnapshotRangeCheckpoint,
        StreamingCheckpoint,
    )
    from airflow_provider_exactly_once.core.upserts import UpsertSpec
    from airflow_provider_exactly_once.operators.checkpoint import MarkCheckpointOperator
    from airflow_provider_exactly_once.operators.epoch import (
        AbortEpochOperator,
        CommitEpochOperator,
        PersistPendingOperator,
    )
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.operators.tables import EnsureTableOperator
    from airflow_provider_exactly_once.recovery.dag import recovery_dag
    from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor, CheckpointSettledSensor
    from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SqlCheck
    from airflow_provider_exactly_once.spark.author_specs import (
        FileSinkTarget,
        FilesInput,
        FunctionInput,
        IcebergTableInput,
        SqlInput,
        TableInput,
    )
    from airflow_provider_exactly_once.table_spec import TableSpec
    from airflow_provider_exactly_once.tables import ensure_table
    from airflow_provider_exactly_once.task_groups import SparkWrite, exactly_once_epoch

#: Each public name and the module that defines it.
_WHERE = {
    "exactly_once_epoch": "task_groups",
    "SparkWrite": "task_groups",
    "TableSpec": "table_spec",
    "SparkPreCommitOperator": "operators.spark_precommit",
    "EnsureTableOperator": "operators.tables",
    "MarkCheckpointOperator": "operators.checkpoint",
    "PersistPendingOperator": "operators.epoch",
    "CommitEpochOperator": "operators.epoch",
    "AbortEpochOperator": "operators.epoch",
    "CheckpointSensor": "sensors.checkpoint",
    "CheckpointSettledSensor": "sensors.checkpoint",
    "IcebergSinkConfig": "sinks.config",
    "FileSinkConfig": "sinks.config",
    "TableSelect": "sinks.config",
    "UpsertSpec": "core.upserts",
    "SqlCheck": "sinks.config",
    "MetaStoreCheckpoint": "checkpoints.config",
    "MarkerFileCheckpoint": "checkpoints.config",
    "StreamingCheckpoint": "checkpoints.config",
    "SnapshotRangeCheckpoint": "checkpoints.config",
    "FilesInput": "spark.author_specs",
    "TableInput": "spark.author_specs",
    "SqlInput": "spark.author_specs",
    "FunctionInput": "spark.author_specs",
    "IcebergTableInput": "spark.author_specs",
    "FileSinkTarget": "spark.author_specs",
    "ensure_table": "tables",
    "recovery_dag": "recovery.dag",
}

__all__ = [
    "AbortEpochOperator",
    "CheckpointSensor",
    "CheckpointSettledSensor",
    "CommitEpochOperator",
    "EnsureTableOperator",
    "FileSinkConfig",
    "FileSinkTarget",
    "FilesInput",
    "FunctionInput",
    "IcebergSinkConfig",
    "IcebergTableInput",
    "MarkCheckpointOperator",
    "MarkerFileCheckpoint",
    "MetaStoreCheckpoint",
    "PersistPendingOperator",
    "SnapshotRangeCheckpoint",
    "SparkPreCommitOperator",
    "SparkWrite",
    "SqlCheck",
    "SqlInput",
    "StreamingCheckpoint",
    "TableInput",
    "TableSelect",
    "TableSpec",
    "UpsertSpec",
    "ensure_table",
    "exactly_once_epoch",
    "recovery_dag",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
