"""Checkpoint sources: the upstream's word on whether an epoch's input is final (design.md section 7).

Each implements ``core.ports.CheckpointSource`` (``status`` and the async ``astatus`` the deferrable
trigger awaits); ``COMPLETED`` and ``FAILED`` are final. Users may plug their own.
"""

from airflow_provider_exactly_once.checkpoints.markers import MarkerFileCheckpointSource
from airflow_provider_exactly_once.checkpoints.metastore import CheckpointTable, MetaStoreCheckpointSource
from airflow_provider_exactly_once.checkpoints.streaming import StructuredStreamingCheckpointSource

__all__ = [
    "CheckpointTable",
    "MarkerFileCheckpointSource",
    "MetaStoreCheckpointSource",
    "StructuredStreamingCheckpointSource",
]
