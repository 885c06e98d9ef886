"""Typed descriptions of a checkpoint source, validated once at construction.

They serialise to plain dicts (like the sink configs) so the deferrable trigger and the recovery
DAG can rebuild the source in another process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_provider_exactly_once.checkpoints.markers import MarkerFileCheckpointSource
from airflow_provider_exactly_once.checkpoints.metastore import CheckpointTable, MetaStoreCheckpointSource
from airflow_provider_exactly_once.checkpoints.streaming import StructuredStreamingCheckpointSource
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.ports import CheckpointSource
from airflow_provider_exactly_once.core.redact import mask_userinfo


@dataclass(frozen=True)
class MetaStoreCheckpoint:
    """The upstream marks epochs in the meta store's checkpoint table (``MarkCheckpointOperator``)."""

    name_template: str = "{sink_id}"
    kind: Literal["metastore"] = field(default="metastore", init=False)

    def __post_init__(self) -> None:
        MetaStoreCheckpointSource(_NoTable(), name_template=self.name_template)  # validates the template

    def source(self, table: CheckpointTable) -> CheckpointSource:
        return MetaStoreCheckpointSource(table, name_template=self.name_template)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name_template": self.name_template}


@dataclass(frozen=True)
class MarkerFileCheckpoint:
    """``_SUCCESS`` / ``_FAILED`` objects at a templated path (``{sink_id}``, ``{epoch}``, ``{start:%Y/%m/%d/%H}``)."""

    path_template: str
    success_marker: str = "_SUCCESS"
    failed_marker: str = "_FAILED"
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    kind: Literal["markers"] = field(default="markers", init=False)

    def __post_init__(self) -> None:
        self.source()  # validates the template and markers once, here

    def source(self, table: CheckpointTable | None = None) -> CheckpointSource:
        return MarkerFileCheckpointSource(
            self.path_template,
            success_marker=self.success_marker,
            failed_marker=self.failed_marker,
            storage_options=self.storage_options,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path_template": self.path_template,
            "success_marker": self.success_marker,
            "failed_marker": self.failed_marker,
            "storage_options": dict(self.storage_options),
        }


@dataclass(frozen=True)
class StreamingCheckpoint:
    """A Spark Structured Streaming checkpoint location; epochs map to batch ids one to one."""

    checkpoint_location: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    kind: Literal["streaming"] = field(default="streaming", init=False)

    def __post_init__(self) -> None:
        self.source()

    def source(self, table: CheckpointTable | None = None) -> CheckpointSource:
        return StructuredStreamingCheckpointSource(self.checkpoint_location, storage_options=self.storage_options)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "checkpoint_location": self.checkpoint_location,
            "storage_options": dict(self.storage_options),
        }


CheckpointConfig = MetaStoreCheckpoint | MarkerFileCheckpoint | StreamingCheckpoint


def checkpoint_config_from_dict(data: Mapping[str, Any]) -> CheckpointConfig:
    values = dict(data)
    kind = values.pop("kind", None)
    classes: dict[object, type[MetaStoreCheckpoint] | type[MarkerFileCheckpoint] | type[StreamingCheckpoint]] = {
        "metastore": MetaStoreCheckpoint,
        "markers": MarkerFileCheckpoint,
        "streaming": StreamingCheckpoint,
    }
    if kind not in classes:
        raise InvalidSinkConfig(f"checkpoint configuration has unknown kind {kind!r}; expected one of {list(classes)}")
    try:
        return classes[kind](**values)
    except TypeError as exc:
        raise InvalidSinkConfig(mask_userinfo(f"checkpoint configuration {data!r}: {exc}")) from None


class _NoTable:
    """Stands in for the store while a template is validated; never asked anything."""

    def get_checkpoint(self, name: str, epoch: int) -> Any:  # pragma: no cover - never called
        raise AssertionError("validation only")

    def set_checkpoint(self, name: str, epoch: int, status: Any, detail: str | None = None) -> None:  # pragma: no cover
        raise AssertionError("validation only")
