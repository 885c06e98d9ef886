"""The job spec: everything one run of the epoch writer needs, as one JSON document.

The only thing the operator and the Spark application share, so both validate it: the operator before
paying for a ``spark-submit``, the application against a spec from anyone else. It imports neither
Spark nor pyiceberg, and only a running task imports it (the parts a DAG names are ``author_specs``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from airflow_provider_exactly_once.core.epochs import Epoch, SinkId, WriteId
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.upserts import RevisionBasis, UpsertSpec
from airflow_provider_exactly_once.spark.author_specs import (
    FileSinkTarget,
    FilesInput,
    FrozenSpec,
    FunctionInput,
    IcebergTableInput,
    InputSpec,
    SqlInput,
    TableInput,
    spec_faults,
)

__all__ = [
    "INPUT_VIEW",
    "EpochJobSpec",
    "FileSinkTarget",
    "FilesInput",
    "FunctionInput",
    "IcebergTableInput",
    "IcebergTarget",
    "InputSpec",
    "SqlInput",
    "TableInput",
    "TargetSpec",
    "check_selection",
    "dump_spec",
]

#: The temporary view a target's ``query`` reads the epoch's input from.
INPUT_VIEW = "epoch_input"


def check_selection(table: str, where: str | None, query: str | None) -> None:
    """Refuse a selection that cannot mean what its author meant, before any Spark job runs."""
    if where is not None and query is not None:
        raise ValueError(f"table {table!r}: give where or query, not both")
    if where is not None and not where.strip():
        raise ValueError(f"table {table!r}: where is blank")
    if query is not None and INPUT_VIEW not in query.lower():
        # A query that never reads the view writes the same rows whatever the epoch read.
        raise ValueError(f"table {table!r}: query does not read the epoch's input, the view {INPUT_VIEW!r}")


class IcebergTarget(FrozenSpec):
    """One Iceberg table, loaded with pyiceberg from the given catalog properties.

    ``where`` and ``query`` let the tables of a fan-out take different parts of one input read:
    without either, the table gets every row of the epoch's input.
    """

    kind: Literal["iceberg"] = "iceberg"
    catalog_name: str = "default"
    #: What ``pyiceberg.catalog.load_catalog(name, **properties)`` needs (type, uri, warehouse, io).
    catalog_properties: dict[str, str] = Field(default_factory=dict)
    table: str = Field(min_length=1)
    #: A Spark SQL condition over the input's columns: only the rows it holds for go to the table.
    where: str | None = None
    #: A Spark SQL query over the epoch's input, read as the temporary view ``INPUT_VIEW``; the
    #: table gets its result (a projection, a filter, an aggregate of the epoch).
    query: str | None = None
    #: The sink's branch: an upsert reads the table's files as this branch's head shows them.
    branch: str = Field(default="main", min_length=1)
    #: Set for an upsert sink: the epoch's rows are changes by key, applied copy-on-write.
    upsert: UpsertSpec | None = None
    #: Set when the write revises the epoch's committed changes (``core.decisions``): the
    #: write they were and the table state the revision is planned at.
    revision: RevisionBasis | None = None

    @model_validator(mode="after")
    def _one_selection(self) -> Self:
        check_selection(self.table, self.where, self.query)
        if self.revision is not None and self.upsert is None:
            raise ValueError(f"table {self.table!r}: a revision of changes by key needs upsert settings")
        return self


TargetSpec = Annotated[IcebergTarget | FileSinkTarget, Field(discriminator="kind")]


class EpochJobSpec(FrozenSpec):
    sink_id: SinkId
    epoch: Epoch
    write_id: WriteId
    data_interval_start: datetime
    data_interval_end: datetime
    input: InputSpec
    #: Every table the input is written into, in this order, each from the same read of the input
    #: (fan-out); a file sink is one target alone. A spec with a single ``target`` loads as one.
    targets: list[TargetSpec] = Field(min_length=1)
    #: Where the driver also writes the pre-commit JSON (local path or fsspec URL), for a task that
    #: shares the driver's files; ``None``: only in the write location (``sinks/layout.py``).
    output_path: str | None = Field(default=None, min_length=1)
    #: FileIO properties for a landing directory on an object store, resolved from the operator's
    #: ``input_storage_conn_id`` when the task runs: they replace the first target's storage
    #: properties (another store, another principal). Unlike ``FilesInput.io_properties`` they may
    #: hold credentials: the spec file is private to the task and never rendered.
    input_io_properties: dict[str, str] = Field(default_factory=dict)
    #: For an ``IcebergTableInput``: the range the operator reserved for this epoch, the only
    #: snapshots the write reads, and the upstream catalog's properties (``load_catalog``'s; they
    #: may hold credentials, as ``input_io_properties`` may).
    input_range: SnapshotRange | None = None
    #: pyiceberg's SQL catalog keys tables by catalog name: the name the upstream's tables are under.
    input_catalog_name: str = "default"
    input_catalog_properties: dict[str, str] = Field(default_factory=dict)
    allow_schema_evolution: bool = False
    #: Number of parallel write tasks, rows shuffled by partition value; ``None`` keeps the input's
    #: parallelism (Spark's Parquet writer, unless the table's ``write.distribution-mode`` is ``hash``
    #: or ``range``) or ``spark.sql.shuffle.partitions`` (the pyarrow writer, partitioned); an upsert
    #: sizes its tasks by the rows it rewrites and writes (``upsert.RewriteWriter``).
    writers: int | None = Field(default=None, gt=0)
    #: Roll to a new file after this many uncompressed bytes (Arrow's count in the pyarrow writer;
    #: in Spark's, which rolls by rows, that many rows of Spark's estimated size); ``None``: the
    #: table's ``write.target-file-size-bytes`` (512 MiB by default).
    target_file_size_bytes: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _single_target(cls, data: Any) -> Any:
        if isinstance(data, dict) and "target" in data:
            if "targets" in data:
                raise ValueError("give target or targets, not both")
            data = {**{k: v for k, v in data.items() if k != "target"}, "targets": [data["target"]]}
        return data

    @field_validator("data_interval_start", "data_interval_end")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{value.isoformat()} has no time zone")
        return value.astimezone(UTC)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.data_interval_end < self.data_interval_start:
            raise ValueError(
                f"data interval ends ({self.data_interval_end.isoformat()}) before it starts "
                f"({self.data_interval_start.isoformat()})"
            )
        return self

    @model_validator(mode="after")
    def _range(self) -> Self:
        incremental = isinstance(self.input, IcebergTableInput)
        if incremental and self.input_range is None:
            raise ValueError("an iceberg_table input is read over the range reserved for the epoch: input_range")
        if self.input_range is not None and not incremental:
            raise ValueError(f"input_range is for an iceberg_table input, not a {self.input.kind!r} one")
        if (
            self.input_range is not None
            and isinstance(self.input, IcebergTableInput)
            and self.input_range.table != self.input.table
        ):
            raise ValueError(f"input_range is of {self.input_range.table}, the input reads {self.input.table}")
        return self

    @model_validator(mode="after")
    def _fan_out(self) -> Self:
        """Several targets are one sink's tables, committed by one committer from one catalog."""
        if len(self.targets) == 1:
            return self
        iceberg = [t for t in self.targets if isinstance(t, IcebergTarget)]
        if len(iceberg) != len(self.targets):
            raise ValueError("a file sink is one target; only Iceberg tables are written together")
        names = [t.table for t in iceberg]
        if len(set(names)) != len(names):
            raise ValueError(f"a table is listed twice: {sorted(names)}")
        first = iceberg[0]
        if any(
            (t.catalog_name, t.catalog_properties) != (first.catalog_name, first.catalog_properties) for t in iceberg
        ):
            raise ValueError("the tables of one write must be in one catalog, the one their commit uses")
        return self

    @classmethod
    def load(cls, source: str) -> EpochJobSpec:
        """A spec from JSON text, or from the path of a file holding it (spark-submit argument)."""
        text = source
        if not source.lstrip().startswith("{"):
            try:
                text = Path(source).read_text(encoding="utf-8")
            except OSError as exc:
                raise InvalidSinkConfig(f"job spec file {source!r} cannot be read: {exc}") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise InvalidSinkConfig(f"invalid epoch job spec: {spec_faults(exc)}") from None

    def to_json(self) -> str:
        return self.model_dump_json()


def dump_spec(spec: EpochJobSpec, path: str | Path) -> None:
    """Write the spec readable by its owner alone: it holds the storage and catalog credentials."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that existed keeps its mode otherwise
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(spec.to_json())
