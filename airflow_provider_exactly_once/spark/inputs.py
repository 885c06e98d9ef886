"""Reading one epoch's input: landing files, a table, a SQL query, a user function, or a snapshot
range of an upstream Iceberg table (``snapshot_range_reads``).

Each reader returns ``None`` when it can tell without a Spark job that the interval holds nothing
(no landing files, an empty snapshot range), so an empty epoch costs no cluster work and never trips
schema inference on an empty directory; otherwise a DataFrame, possibly empty, and the source
positions to keep.

Landing files on an object store (``s3://`` and the other ``storage.OBJECT_STORE_SCHEMES``) are
listed on the driver and read by the executors with pyarrow (``object_inputs``), so Spark needs no
s3a connector; local and HDFS paths are read by Spark's own file sources.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig
from airflow_provider_exactly_once.spark.file_io import is_object_store, storage_properties
from airflow_provider_exactly_once.spark.jobspec import (
    EpochJobSpec,
    FilesInput,
    FunctionInput,
    IcebergTableInput,
    IcebergTarget,
    SqlInput,
    TableInput,
)
from airflow_provider_exactly_once.spark.object_inputs import list_object_files, read_object_files
from airflow_provider_exactly_once.spark.snapshot_range_reads import read_snapshot_range

#: Up to this many input files are listed in the source positions; beyond, a count and a digest,
#: so that a huge landing directory cannot blow up the pre-commit metadata that travels by XCom.
LISTED_FILES_MAX = 1000
#: Spark's condition for a path or glob that selects nothing.
_PATH_NOT_FOUND = "PATH_NOT_FOUND"


class UserFunctionFailed(ExactlyOnceError):
    """The user's input function raised or returned something other than a DataFrame."""


@dataclass(frozen=True)
class EpochContext:
    """What a user input function is told about the epoch it produces rows for."""

    sink_id: str
    epoch: int
    write_id: str
    data_interval_start: datetime
    data_interval_end: datetime
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpochInput:
    frame: DataFrame | None
    source_positions: dict[str, Any] | None


def read_input(spark: SparkSession, spec: EpochJobSpec) -> EpochInput:
    source = spec.input
    if isinstance(source, FilesInput):
        return _read_files(spark, spec, source)
    if isinstance(source, TableInput):
        frame = spark.table(source.table)
        if source.time_column:
            column = F.col(source.time_column)
            frame = frame.where((column >= F.lit(spec.data_interval_start)) & (column < F.lit(spec.data_interval_end)))
        return EpochInput(frame, None)
    if isinstance(source, SqlInput):
        args = {
            "interval_start": spec.data_interval_start,
            "interval_end": spec.data_interval_end,
            "epoch": spec.epoch,
        }
        used = {k: v for k, v in args.items() if f":{k}" in source.query}
        return EpochInput(spark.sql(source.query, args=used or None), None)
    if isinstance(source, IcebergTableInput):
        return EpochInput(*read_snapshot_range(spark, spec))
    return EpochInput(_call_function(spark, spec, source), None)


def list_input_files(spark: SparkSession, paths: list[str]) -> list[str]:
    """Files the expanded paths select (see ``jobspec``), as Spark's own file index lists them, so
    a path Spark reads itself (``hdfs://``, ``file:``, a plain path) is listed where Spark reads it:
    on the driver of a classic session, on the server of a Spark Connect one. ``inputFiles`` asks
    the index without running a job; it leaves out names starting with ``_`` or ``.``, and a
    directory's files below a subfolder."""
    try:
        return sorted(set(_indexed_files(spark, paths)))
    except AnalysisException as exc:
        if exc.getCondition() != _PATH_NOT_FOUND:
            raise
    if len(paths) == 1:
        return []
    # Some of the patterns select nothing (hours without files): each alone, the rest skipped.
    found: set[str] = set()
    for path in paths:
        try:
            found.update(_indexed_files(spark, [path]))
        except AnalysisException as exc:
            if exc.getCondition() != _PATH_NOT_FOUND:
                raise
    return sorted(found)


def _indexed_files(spark: SparkSession, paths: list[str]) -> list[str]:
    return list(spark.read.format("binaryFile").load(paths).inputFiles())


def input_io_properties(spec: EpochJobSpec, source: FilesInput) -> dict[str, str]:
    """FileIO properties for reading the landing files: the input's own over those of its storage
    connection (``spec.input_io_properties``) or, without one, the storage properties configured
    for the first target (its catalog's, or the file sink's).

    A landing bucket usually lives in the store the tables do, reached with the same credentials;
    a REST catalog's vended credentials are left out on purpose, scoped as they are to the table.
    A connection of its own replaces the target's properties rather than overlaying them: another
    store's endpoint or region must not leak into it.
    """
    if spec.input_io_properties:
        return {**spec.input_io_properties, **source.io_properties}
    target = spec.targets[0]
    configured = target.catalog_properties if isinstance(target, IcebergTarget) else target.io_properties
    return {**storage_properties(configured), **source.io_properties}


def _read_files(spark: SparkSession, spec: EpochJobSpec, source: FilesInput) -> EpochInput:
    patterns = source.expanded_paths(spec.data_interval_start, spec.data_interval_end, spec.epoch)
    if is_object_store(source.path):
        properties = input_io_properties(spec, source)
        listed = list_object_files(patterns, properties)
        positions = _file_positions(patterns, [f.url for f in listed])
        frame = read_object_files(spark, source, listed, properties) if listed else None
        return EpochInput(frame, positions)
    files = list_input_files(spark, patterns)
    positions = _file_positions(patterns, files)
    if not files:
        return EpochInput(None, positions)
    options = dict(source.options)
    if source.format in ("json", "csv"):
        # PERMISSIVE (Spark's default) turns a bad line into nulls plus a _corrupt_record column:
        # data would be lost quietly. Fail instead, unless the user chose otherwise.
        options.setdefault("mode", "FAILFAST")
    reader = spark.read.format(source.format).options(**options)
    if source.schema_ddl:
        reader = reader.schema(source.schema_ddl)
    return EpochInput(reader.load(files), positions)


def _file_positions(patterns: list[str], files: list[str]) -> dict[str, Any]:
    """The input files as source positions: listed up to ``LISTED_FILES_MAX``, else a digest."""
    positions: dict[str, Any] = {"kind": "files", "patterns": patterns, "file_count": len(files)}
    if len(files) <= LISTED_FILES_MAX:
        positions["files"] = files
    else:
        positions["files_sha256"] = hashlib.sha256("\n".join(files).encode()).hexdigest()
    return positions


def _call_function(spark: SparkSession, spec: EpochJobSpec, source: FunctionInput) -> DataFrame:
    module_name, _, function_name = source.callable.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidSinkConfig(f"input function {source.callable!r}: module cannot be imported: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InvalidSinkConfig(f"input function {source.callable!r}: {module_name} has no callable {function_name!r}")
    context = EpochContext(
        sink_id=spec.sink_id,
        epoch=spec.epoch,
        write_id=spec.write_id,
        data_interval_start=spec.data_interval_start,
        data_interval_end=spec.data_interval_end,
        options=dict(source.options),
    )
    try:
        frame = function(spark, context)
    except Exception as exc:
        raise UserFunctionFailed(f"input function {source.callable!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(frame, DataFrame):
        raise UserFunctionFailed(
            f"input function {source.callable!r} returned {type(frame).__name__}, not a pyspark DataFrame"
        )
    return frame
