"""Checkpoint sources: the upstream's word on whether an epoch's input is final (design.md, 'Checkpoint sources').

``sources`` holds the sources, each a ``core.ports.CheckpointSource`` (``status`` and the async
``astatus`` the deferrable trigger awaits; ``COMPLETED`` and ``FAILED`` are final); ``config`` the
typed checkpoint configs a DAG author writes. Users may plug their own source.

The sources are resolved on first use (PEP 562): the sink and checkpoint configs a DAG file imports
at every parse need this package's light helpers, not every source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_exactly_once.extras import lazy_exports

if TYPE_CHECKING:
    from airflow_provider_exactly_once.checkpoints.sources import (
        CheckpointTable,
        MarkerFileCheckpointSource,
        MetaStoreCheckpointSource,
        SnapshotRangeCheckpointSource,
        StructuredStreamingCheckpointSource,
    )

_WHERE = dict.fromkeys(
    (
        "CheckpointTable",
        "MarkerFileCheckpointSource",
        "MetaStoreCheckpointSource",
        "SnapshotRangeCheckpointSource",
        "StructuredStreamingCheckpointSource",
    ),
    "sources",
)

__all__ = [
    "CheckpointTable",
    "MarkerFileCheckpointSource",
    "MetaStoreCheckpointSource",
    "SnapshotRangeCheckpointSource",
    "StructuredStreamingCheckpointSource",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
