"""The parts of an epoch's job spec a DAG author writes: where the epoch's rows come from
(``FilesInput``, ``TableInput``, ``SqlInput``, ``FunctionInput``, ``IcebergTableInput``) and a file
sink's target, apart from ``jobspec`` because every DAG file that names one imports them at parse.

``FilesInput`` (docs/operators.md) beyond what the author reads: each expansion is a Hadoop path or
glob (an fsspec glob on an object store, where ``{a,b}`` is not understood), a directory gives the
files directly inside it, and modification times are never used: a copy or a restore changes them,
so a rerun would select other files.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

from airflow_provider_exactly_once.core.epochs import SNAPSHOT_ID_MAX, table_name_fault
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.sinks.layout import file_write_location


class FrozenSpec(BaseModel):
    """A part of the job spec: immutable, and refusing a misspelt field rather than ignoring it.

    Built by a DAG file (``IcebergTableInput(table=...)``), a bad argument is one line naming the
    spec and the argument (``InvalidSinkConfig``), where the DAG's parse error shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidSinkConfig(f"{type(self).__name__}: {spec_faults(exc)}") from None


def spec_faults(exc: ValidationError) -> str:
    """A validation error's faults on one line, each named by its field."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors(include_url=False)
    )


class FilesInput(FrozenSpec):
    """A landing directory of Parquet, JSON (lines) or CSV files selected by the data interval."""

    kind: Literal["files"] = "files"
    format: Literal["parquet", "json", "csv"]
    path: str = Field(min_length=1)
    #: Expand ``path`` at every step inside the interval (hourly directories under a daily epoch).
    step_seconds: int | None = Field(default=None, gt=0)
    #: Spark reader options (``header``, ``multiLine``...).
    options: dict[str, str] = Field(default_factory=dict)
    #: Schema as a Spark DDL string; without it JSON and CSV are inferred, which costs a pass.
    schema_ddl: str | None = None
    #: FileIO properties for a landing directory on an object store (``s3.endpoint``,
    #: ``s3.region``...), over the storage properties of the first target, which reach it when the
    #: landing bucket is in the tables' store. The operator keeps credentials out of this field:
    #: the input is a templated field, shown in the UI once rendered.
    io_properties: dict[str, str] = Field(default_factory=dict)

    def expanded_paths(self, start: datetime, end: datetime, epoch: int) -> list[str]:
        instants = [start]
        if self.step_seconds is not None:
            instants = []
            at = start
            while at < end:
                instants.append(at)
                at += timedelta(seconds=self.step_seconds)
        seen: dict[str, None] = {}
        for at in instants:
            try:
                expanded = self.path.format(start=at, interval_start=start, interval_end=end, epoch=epoch)
            except (KeyError, IndexError, ValueError) as exc:
                raise InvalidSinkConfig(
                    f"input path template {self.path!r} cannot be expanded: {type(exc).__name__}: {exc}; "
                    "it may use {start}, {interval_start}, {interval_end} and {epoch}"
                ) from None
            seen.setdefault(expanded, None)
        return list(seen)


class TableInput(FrozenSpec):
    """A table the Spark session knows; filtered to the interval when ``time_column`` is given."""

    kind: Literal["table"] = "table"
    table: str = Field(min_length=1)
    #: Rows with ``interval_start <= time_column < interval_end`` are the epoch's.
    time_column: str | None = None


class SqlInput(FrozenSpec):
    """A Spark SQL query; ``:interval_start``, ``:interval_end`` (timestamps) and ``:epoch`` are bound
    as named parameters, never spliced into the text."""

    kind: Literal["sql"] = "sql"
    query: str = Field(min_length=1)


class FunctionInput(FrozenSpec):
    """A user function ``module:function(spark, epoch_context) -> DataFrame``."""

    kind: Literal["function"] = "function"
    callable: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    #: Passed through as ``epoch_context.options``.
    options: dict[str, Any] = Field(default_factory=dict)


#: An upstream table's name: ``namespace.table``, dot-separated, no empty part and no whitespace.
_NAMESPACED = re.compile(r"[^.\s]+(\.[^.\s]+)+")


class IcebergTableInput(FrozenSpec):
    """An upstream Iceberg table read incrementally: each epoch reads the data the table's appends
    added after the snapshot its sink last committed, up to the snapshot current when the epoch is
    first written (``core.input_ranges``). The range is reserved in the meta store before the
    write, so a retry, a clear or a reprocess reads the same rows again."""

    kind: Literal["iceberg_table"] = "iceberg_table"
    #: ``namespace.table`` in the catalog.
    table: str = Field(min_length=1)
    #: The Airflow connection of the upstream's catalog (an ``iceberg`` connection, read as a
    #: sink's is); ``None``: the sink's own catalog.
    catalog_conn_id: str | None = Field(default=None, min_length=1)
    #: The sink's first epoch reads the snapshots after this one; ``None``: from the table's first.
    start_after_snapshot_id: int | None = None

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        """The name a reservation row keeps and every listing prints (``core.epochs``)."""
        if (fault := table_name_fault(table)) is None and not _NAMESPACED.fullmatch(table):
            fault = f"{table!r} is not namespace.table (dot-separated names, no spaces)"
        if fault is not None:
            raise ValueError(fault)
        return table

    @field_validator("start_after_snapshot_id", mode="wrap")
    @classmethod
    def _snapshot_id(cls, value: object, handler: ValidatorFunctionWrapHandler) -> int | None:
        """A real snapshot's id: a bool is not one (``True`` would read as 1), nor a negative number
        (Iceberg's ids are positive), nor one past a signed 64-bit column."""
        parsed = None if value is None or isinstance(value, bool) else handler(value)
        if isinstance(value, bool) or (parsed is not None and not 0 <= parsed <= SNAPSHOT_ID_MAX):
            raise ValueError(
                f"{str(value)[:40]!r} is not a snapshot id: give the id of a snapshot of the upstream table "
                f"(an integer from 0 to {SNAPSHOT_ID_MAX}), or None to read from its first snapshot"
            )
        return parsed if isinstance(parsed, int) else None


InputSpec = Annotated[
    FilesInput | TableInput | SqlInput | FunctionInput | IcebergTableInput, Field(discriminator="kind")
]


class FileSinkTarget(FrozenSpec):
    """A plain Parquet directory (design.md, 'The file-sink commit'): staged here, moved to final names at commit."""

    kind: Literal["files"] = "files"
    root: str = Field(min_length=1)
    #: Identity partition columns; each file holds one value of each.
    partition_by: list[str] = Field(default_factory=list)
    #: FileIO properties (object store credentials, endpoints); local paths need none.
    io_properties: dict[str, str] = Field(default_factory=dict)
    #: Parquet writer settings in Iceberg's property names (``write.parquet.compression-codec``...).
    write_properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("root")
    @classmethod
    def _no_trailing_slash(cls, root: str) -> str:
        return root.rstrip("/") or "/"

    def write_location(self, write_id: str) -> str:
        return file_write_location(self.root, write_id)
