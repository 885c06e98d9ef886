"""Typed descriptions of a sink, validated once at construction (as cosmos's config classes are).

A DAG author writes one of these per sink; the Airflow layer resolves its connections and calls
``committer(...)``. Both serialise to plain dicts, so a sink's configuration can be recorded next to
its state and rebuilt by a process that never imported the DAG (the recovery DAG).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pyiceberg.catalog import Catalog

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.identifiers import check_sink_id
from airflow_provider_exactly_once.core.redact import has_userinfo, mask_userinfo
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter


def _sink_id(sink_id: str) -> None:
    try:
        check_sink_id(sink_id)
    except InvalidPreCommit as exc:
        raise InvalidSinkConfig(str(exc)) from None


@dataclass(frozen=True)
class IcebergSinkConfig:
    """One or more Iceberg tables written together (fan-out), reached through an Iceberg connection."""

    sink_id: str
    tables: tuple[str, ...]
    iceberg_conn_id: str = "iceberg_default"
    branch: str = "main"
    allow_schema_evolution: bool = False
    clock_skew: timedelta = timedelta(minutes=10)
    max_commit_attempts: int = 8
    kind: Literal["iceberg"] = field(default="iceberg", init=False)

    def __post_init__(self) -> None:
        _sink_id(self.sink_id)
        if isinstance(self.tables, str):
            object.__setattr__(self, "tables", (self.tables,))
        object.__setattr__(self, "tables", tuple(self.tables))
        if not self.tables:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: name at least one table")
        for table in self.tables:
            if not isinstance(table, str) or "." not in table.strip(".") or table != table.strip():
                raise InvalidSinkConfig(f"sink {self.sink_id!r}: table {table!r} is not 'namespace.table'")
        if len(set(self.tables)) != len(self.tables):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: a table is listed twice in {list(self.tables)}")
        if not self.iceberg_conn_id:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: iceberg_conn_id is empty")
        if not self.branch:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: branch is empty")
        if self.clock_skew < timedelta(0):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: clock_skew {self.clock_skew} is negative")
        if self.max_commit_attempts < 1:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: max_commit_attempts must be at least 1")

    def committer(self, catalog: Catalog, *, fault: FaultHook = no_faults) -> IcebergSinkCommitter:
        return IcebergSinkCommitter(
            catalog,
            branch=self.branch,
            clock_skew=self.clock_skew,
            max_attempts=self.max_commit_attempts,
            allow_schema_evolution=self.allow_schema_evolution,
            fault=fault,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sink_id": self.sink_id,
            "tables": list(self.tables),
            "iceberg_conn_id": self.iceberg_conn_id,
            "branch": self.branch,
            "allow_schema_evolution": self.allow_schema_evolution,
            "clock_skew_s": self.clock_skew.total_seconds(),
            "max_commit_attempts": self.max_commit_attempts,
        }


@dataclass(frozen=True)
class FileSinkConfig:
    """A directory of Parquet files (local path or fsspec URL) with deterministic final names."""

    sink_id: str
    root: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    kind: Literal["files"] = field(default="files", init=False)

    def __post_init__(self) -> None:
        _sink_id(self.sink_id)
        if not isinstance(self.root, str) or not self.root.strip():
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: root is empty")
        if has_userinfo(self.root):
            # The root is recorded in the sink registry and shown by the UI, eo-sink and the logs.
            raise InvalidSinkConfig(
                f"sink {self.sink_id!r}: root {mask_userinfo(self.root)!r} holds credentials (user:password@); "
                "pass them in storage_options (e.g. {'key': ..., 'secret': ...}) or through the filesystem's "
                "Airflow connection, and keep the root a plain location"
            )

    def committer(self, *, fault: FaultHook = no_faults) -> FileSinkCommitter:
        return FileSinkCommitter(self.root, storage_options=self.storage_options, fault=fault)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sink_id": self.sink_id,
            "root": self.root,
            "storage_options": dict(self.storage_options),
        }


SinkConfig = IcebergSinkConfig | FileSinkConfig


def sink_config_from_dict(data: Mapping[str, Any]) -> SinkConfig:
    """The inverse of ``to_dict``, refusing unknown kinds and fields by name."""
    values = dict(data)
    kind = values.pop("kind", None)
    try:
        if kind == "iceberg":
            if "clock_skew_s" in values:
                values["clock_skew"] = timedelta(seconds=float(values.pop("clock_skew_s")))
            values["tables"] = tuple(values.get("tables", ()))
            return IcebergSinkConfig(**values)
        if kind == "files":
            return FileSinkConfig(**values)
    except TypeError as exc:
        raise InvalidSinkConfig(mask_userinfo(f"sink configuration {data!r}: {exc}")) from None
    raise InvalidSinkConfig(f"sink configuration has unknown kind {kind!r}; expected 'iceberg' or 'files'")
