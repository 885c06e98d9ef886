"""Typed descriptions of a checkpoint source, validated once at construction.

Registered as ``model_dump(mode="json")`` (like the sink configs) so the deferrable trigger and the
recovery DAG can rebuild the source in another process (``checkpoint_config_from_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from airflow_provider_exactly_once.checkpoints.sources import (
    CheckpointTable,
    MarkerFileCheckpointSource,
    MetaStoreCheckpointSource,
    SnapshotRangeCheckpointSource,
    StructuredStreamingCheckpointSource,
)
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.filesystems import (
    ConfigModel,
    check_storage_conn_id,
    config_refusal,
    given_storage_options,
    refuse_secret_options,
)

if TYPE_CHECKING:
    from airflow_provider_exactly_once.core.ports import CheckpointSource


class MetaStoreCheckpoint(ConfigModel):
    """The upstream marks epochs in the meta store's checkpoint table (``MarkCheckpointOperator``)."""

    positional: ClassVar[tuple[str, ...]] = ("name_template",)
    what = "checkpoint configuration"

    kind: Literal["metastore"] = "metastore"
    name_template: str = "{sink_id}"

    @field_validator("name_template")
    @classmethod
    def _valid_template(cls, name_template: str) -> str:
        MetaStoreCheckpointSource(_NoTable(), name_template=name_template)
        return name_template

    def source(self, table: CheckpointTable) -> CheckpointSource:
        return MetaStoreCheckpointSource(table, name_template=self.name_template)


class SnapshotRangeCheckpoint(MetaStoreCheckpoint):
    """For an incremental input (``IcebergTableInput``): the epoch's reserved snapshot range is its
    checkpoint, complete once reserved (``checkpoints.sources`` says why that is sound).
    Read from the meta store, as a ``MetaStoreCheckpoint`` is; nothing marks it."""

    positional = ()

    kind: Literal["snapshot_range"] = "snapshot_range"  # type: ignore[assignment]
    name_template: str = Field(default="{sink_id}", exclude=True)

    def source(self, table: CheckpointTable) -> CheckpointSource:
        return SnapshotRangeCheckpointSource(table)


def _storage_what(info: ValidationInfo) -> str:
    return "marker checkpoint" if info.data.get("kind") == "markers" else "streaming checkpoint"


def _no_secrets(options: Any, info: ValidationInfo) -> dict[str, Any]:
    return refuse_secret_options(options, what=_storage_what(info))


def _valid_conn_id(conn_id: Any, info: ValidationInfo) -> Any:
    check_storage_conn_id(conn_id, what=_storage_what(info))
    return conn_id


class MarkerFileCheckpoint(ConfigModel):
    """``_SUCCESS`` / ``_FAILED`` objects at a templated path (``{sink_id}``, ``{epoch}``, ``{start:%Y/%m/%d/%H}``).

    ``storage_conn_id`` (an Airflow connection of type ``aws``) is resolved only where the source is
    built to be read (the sensor's task, the triggerer, the recovery run), by the storage hook
    (``hooks.storage.resolved_storage_options``), which hands the result to ``source``; validation
    builds a source with the non-secret ``storage_options`` alone, so parsing a DAG never reads a
    connection. The same holds for ``StreamingCheckpoint``.
    """

    positional = ("path_template",)
    what = "checkpoint configuration"

    kind: Literal["markers"] = "markers"
    path_template: str
    success_marker: str = "_SUCCESS"
    failed_marker: str = "_FAILED"
    storage_options: dict[str, Any] = Field(default_factory=dict)
    #: Left out of the registered form when unset, so the registration of one without it is unchanged.
    storage_conn_id: str | None = Field(default=None, exclude_if=lambda value: value is None)

    _no_secrets = field_validator("storage_options", mode="before")(_no_secrets)
    _valid_conn_id = field_validator("storage_conn_id", mode="before")(_valid_conn_id)

    @model_validator(mode="after")
    def _valid(self) -> MarkerFileCheckpoint:
        self.source(storage_options=self.storage_options)  # validates the template and markers once, here
        return self

    def source(
        self, table: CheckpointTable | None = None, *, storage_options: Mapping[str, Any] | None = None
    ) -> CheckpointSource:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        return MarkerFileCheckpointSource(
            self.path_template,
            success_marker=self.success_marker,
            failed_marker=self.failed_marker,
            storage_options=given_storage_options(
                self.storage_options, self.storage_conn_id, storage_options, what="markers checkpoint"
            ),
        )


class StreamingCheckpoint(ConfigModel):
    """A Spark Structured Streaming checkpoint location; epochs map to batch ids one to one."""

    positional = ("checkpoint_location",)
    what = "checkpoint configuration"

    kind: Literal["streaming"] = "streaming"
    checkpoint_location: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    storage_conn_id: str | None = Field(default=None, exclude_if=lambda value: value is None)

    _no_secrets = field_validator("storage_options", mode="before")(_no_secrets)
    _valid_conn_id = field_validator("storage_conn_id", mode="before")(_valid_conn_id)

    @model_validator(mode="after")
    def _valid(self) -> StreamingCheckpoint:
        self.source(storage_options=self.storage_options)
        return self

    def source(
        self, table: CheckpointTable | None = None, *, storage_options: Mapping[str, Any] | None = None
    ) -> CheckpointSource:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        return StructuredStreamingCheckpointSource(
            self.checkpoint_location,
            storage_options=given_storage_options(
                self.storage_options, self.storage_conn_id, storage_options, what="streaming checkpoint"
            ),
        )


CheckpointConfig = MetaStoreCheckpoint | SnapshotRangeCheckpoint | MarkerFileCheckpoint | StreamingCheckpoint
_KINDS: dict[object, type[CheckpointConfig]] = {
    "metastore": MetaStoreCheckpoint,
    "snapshot_range": SnapshotRangeCheckpoint,
    "markers": MarkerFileCheckpoint,
    "streaming": StreamingCheckpoint,
}


def checkpoint_config_from_dict(data: Mapping[str, Any]) -> CheckpointConfig:
    """A registered checkpoint config (its ``model_dump(mode="json")``) read back, refusing unknown
    kinds and fields by name."""
    kind = data.get("kind")
    if kind not in _KINDS:
        raise InvalidSinkConfig(f"checkpoint configuration has unknown kind {kind!r}; expected one of {list(_KINDS)}")
    try:
        return _KINDS[kind].model_validate(data)
    except ValidationError as exc:
        raise config_refusal(exc, f"checkpoint configuration {dict(data)!r}") from None


class _NoTable:
    """Stands in for the store while a template is validated; never asked anything."""

    def get_checkpoint(self, name: str, epoch: int) -> Any:  # pragma: no cover - never called
        raise AssertionError("validation only")

    def set_checkpoint(self, name: str, epoch: int, status: Any, detail: str | None = None) -> None:  # pragma: no cover
        raise AssertionError("validation only")
