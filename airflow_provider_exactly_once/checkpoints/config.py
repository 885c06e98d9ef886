"""Typed descriptions of a checkpoint source, validated once at construction.

They serialise to plain dicts (like the sink configs) so the deferrable trigger and the recovery
DAG can rebuild the source in another process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_exactly_once.checkpoints.sources import (
    CheckpointTable,
    MarkerFileCheckpointSource,
    MetaStoreCheckpointSource,
    SnapshotRangeCheckpointSource,
    StructuredStreamingCheckpointSource,
)
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, mask_userinfo
from airflow_provider_exactly_once.filesystems import (
    check_storage_conn_id,
    given_storage_options,
    refuse_secret_options,
)

if TYPE_CHECKING:
    from airflow_provider_exactly_once.core.ports import CheckpointSource


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
class SnapshotRangeCheckpoint(MetaStoreCheckpoint):
    """For an incremental input (``IcebergTableInput``): the epoch's reserved snapshot range is its
    checkpoint, complete once reserved (``checkpoints.snapshot_ranges`` says why that is sound).
    Read from the meta store, as a ``MetaStoreCheckpoint`` is; nothing marks it."""

    kind: Literal["snapshot_range"] = field(default="snapshot_range", init=False)  # type: ignore[assignment]

    def source(self, table: CheckpointTable) -> CheckpointSource:
        return SnapshotRangeCheckpointSource(table)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


class _StoredOnObjectStorage:
    """What the file-based checkpoints share: credentials named by a connection, read late.

    ``storage_conn_id`` (an Airflow connection of type ``aws``) is resolved only where the source is
    built to be read (the sensor's task, the triggerer, the recovery run), by the storage hook
    (``hooks.storage.resolved_storage_options``), which hands the result to ``source``. ``__post_init__`` builds a
    source too, to validate, but with the non-secret ``storage_options`` alone, so parsing a DAG
    never reads a connection.
    """

    storage_options: Mapping[str, Any]
    storage_conn_id: str | None
    kind: str

    def _check_storage(self, what: str) -> None:
        object.__setattr__(self, "storage_options", refuse_secret_options(self.storage_options, what=what))
        check_storage_conn_id(self.storage_conn_id, what=what)

    def _options(self, storage_options: Mapping[str, Any] | None) -> Mapping[str, Any]:
        return given_storage_options(
            self.storage_options, self.storage_conn_id, storage_options, what=f"{self.kind} checkpoint"
        )

    def _storage_dict(self) -> dict[str, Any]:
        return {
            "storage_options": dict(self.storage_options),
            # Left out when unset, so the registered form of a checkpoint without one is unchanged.
            **({"storage_conn_id": self.storage_conn_id} if self.storage_conn_id is not None else {}),
        }


@dataclass(frozen=True)
class MarkerFileCheckpoint(_StoredOnObjectStorage):
    """``_SUCCESS`` / ``_FAILED`` objects at a templated path (``{sink_id}``, ``{epoch}``, ``{start:%Y/%m/%d/%H}``)."""

    path_template: str
    success_marker: str = "_SUCCESS"
    failed_marker: str = "_FAILED"
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    storage_conn_id: str | None = None
    kind: Literal["markers"] = field(default="markers", init=False)

    def __post_init__(self) -> None:
        self._check_storage("marker checkpoint")
        self.source(storage_options=self.storage_options)  # validates the template and markers once, here

    def source(
        self, table: CheckpointTable | None = None, *, storage_options: Mapping[str, Any] | None = None
    ) -> CheckpointSource:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        return MarkerFileCheckpointSource(
            self.path_template,
            success_marker=self.success_marker,
            failed_marker=self.failed_marker,
            storage_options=self._options(storage_options),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path_template": self.path_template,
            "success_marker": self.success_marker,
            "failed_marker": self.failed_marker,
            **self._storage_dict(),
        }


@dataclass(frozen=True)
class StreamingCheckpoint(_StoredOnObjectStorage):
    """A Spark Structured Streaming checkpoint location; epochs map to batch ids one to one."""

    checkpoint_location: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    storage_conn_id: str | None = None
    kind: Literal["streaming"] = field(default="streaming", init=False)

    def __post_init__(self) -> None:
        self._check_storage("streaming checkpoint")
        self.source(storage_options=self.storage_options)

    def source(
        self, table: CheckpointTable | None = None, *, storage_options: Mapping[str, Any] | None = None
    ) -> CheckpointSource:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        return StructuredStreamingCheckpointSource(
            self.checkpoint_location, storage_options=self._options(storage_options)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "checkpoint_location": self.checkpoint_location, **self._storage_dict()}


CheckpointConfig = MetaStoreCheckpoint | SnapshotRangeCheckpoint | MarkerFileCheckpoint | StreamingCheckpoint


def checkpoint_config_from_dict(data: Mapping[str, Any]) -> CheckpointConfig:
    values = dict(data)
    kind = values.pop("kind", None)
    classes: dict[object, type[MetaStoreCheckpoint] | type[MarkerFileCheckpoint] | type[StreamingCheckpoint]] = {
        "metastore": MetaStoreCheckpoint,
        "snapshot_range": SnapshotRangeCheckpoint,
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
