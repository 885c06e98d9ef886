"""Reading one epoch's input (design.md, 'Layers'): landing files (on an object store read by the
executors with pyarrow, not by Spark), a table, a SQL query, a user function, or the snapshot range
an epoch reserved of an upstream Iceberg table, its files read by Spark by field id.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InputRangeRefused, InvalidSinkConfig
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.spark.file_io import (
    driver_filesystem,
    is_object_store,
    scheme_of,
    spread,
    storage_properties,
)
from airflow_provider_exactly_once.spark.jobspec import (
    EpochJobSpec,
    FilesInput,
    FunctionInput,
    IcebergTableInput,
    IcebergTarget,
    SqlInput,
    TableInput,
)
from airflow_provider_exactly_once.spark.upsert import TableFiles, read_by_id
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark

# Reading one epoch's input: landing files, a table, a SQL query, a user function, or a snapshot
# range of an upstream Iceberg table.
#
# Each reader returns ``None`` when it can tell without a Spark job that the interval holds nothing
# (no landing files, an empty snapshot range), so an empty epoch costs no cluster work and never trips
# schema inference on an empty directory; otherwise a DataFrame, possibly empty, and the source
# positions to keep.
#
# Landing files on an object store (``s3://`` and the other ``file_io.OBJECT_STORE_SCHEMES``) are
# listed on the driver and read by the executors with pyarrow (``read_object_files``), so Spark needs no
# s3a connector; local and HDFS paths are read by Spark's own file sources.

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


# Landing files on an object store, read by the executors with pyarrow instead of by Spark.
#
# Spark could read ``s3://`` only through Hadoop's s3a connector, which is not there (see
# ``file_io``). Staging the files to a local disk first was the alternative; it is not done, because
# on a cluster the driver's disk is not the executors', it would copy every byte twice through one
# machine, and the copy would need its own clean-up. Instead:
#
# 1. the driver lists the epoch's files with fsspec (pyiceberg's fsspec FileIO, from the input's
#    FileIO properties), applying the same selection rule as for local paths (``jobspec``), and packs
#    them into partitions of about ``spark.sql.files.maxPartitionBytes`` each (fewer bytes than one
#    such partition are spread over Spark's default parallelism, ``spread``);
# 2. a DataFrame of file paths, one Spark partition per pack, goes through ``mapInArrow``: each task
#    opens its files with pyiceberg's FileIO (pyarrow's S3 filesystem, credentials from the spec) and
#    yields their rows as Arrow batches;
# 3. Parquet batches are the input's rows directly, in the schema of the first file (Spark's own
#    default; ``mergeSchema=true`` unifies every footer) or the spec's ``schema_ddl``. JSON and CSV
#    files are yielded as lines, and Spark's own JSON and CSV parsers turn the lines into rows, so
#    their options, schema inference, ``schema_ddl`` and FAILFAST behave exactly as for local files.
#
# What differs from Spark's file sources: a file is read by one task (Spark splits large splittable
# files by bytes); JSON ``multiLine`` files are read whole, one document per file; CSV ``multiLine``
# (quoted line breaks) cannot be split into lines and is refused; of the Parquet reader options only
# ``mergeSchema`` is understood. Compressed JSON and CSV files are decompressed by their extension
# (``.gz``, ``.bz2``, ``.zst``, ``.lz4``...), as Hadoop's codecs do.

#: Lines per Arrow batch a JSON or CSV read task yields.
LINES_PER_BATCH = 8192
#: Bytes read from a JSON or CSV file at a time.
READ_CHUNK = 8 * 1024 * 1024
_DEFAULT_PARTITION_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class ObjectFile:
    url: str
    size: int


def list_object_files(patterns: Sequence[str], io_properties: Mapping[str, str]) -> list[ObjectFile]:
    """Files the expanded paths select, by the rule ``jobspec`` states, as fsspec globs.

    A fresh listing every time: fsspec filesystems are shared per process and cache directory
    listings, and a file that landed since the last listing must not be missed.
    """
    found: dict[str, ObjectFile] = {}
    for pattern in patterns:
        scheme = scheme_of(pattern)
        fs, path = driver_filesystem(pattern, io_properties)
        fs.invalidate_cache()
        matches: dict[str, dict[str, Any]] = fs.glob(path, detail=True)
        for match, info in sorted(matches.items()):
            children = fs.ls(match, detail=True) if info.get("type") == "directory" else [info]
            for child in children:
                name = str(child["name"]).rstrip("/")
                if child.get("type") != "file" or name.rsplit("/", 1)[-1].startswith(("_", ".")):
                    continue
                url = f"{scheme}://{name}"
                found.setdefault(url, ObjectFile(url, int(child.get("size") or 0)))
    return [found[url] for url in sorted(found)]


def read_object_files(
    spark: SparkSession, source: FilesInput, files: Sequence[ObjectFile], io_properties: Mapping[str, str]
) -> DataFrame:
    """The rows of ``files``, read on the executors; the driver reads at most Parquet footers."""
    properties = dict(io_properties)
    options = {k.lower(): v for k, v in source.options.items()}
    paths = _paths_frame(spark, files)
    if source.format == "parquet":
        if source.schema_ddl:
            spark_schema = spark.createDataFrame([], source.schema_ddl).schema
        else:
            spark_schema = _footer_schema(files, properties, merge=options.get("mergeschema", "false") == "true")
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
        reader = functools.partial(_parquet_task, properties, arrow_schema)
        return paths.mapInArrow(reader, spark_schema)
    whole = source.format == "json" and options.get("multiline", "false") == "true"
    if source.format == "csv" and options.get("multiline", "false") == "true":
        raise InvalidSinkConfig(
            "CSV with multiLine=true cannot be read from an object store: its records are not lines; "
            "land it as JSON or Parquet, or read it through a user function"
        )
    lines = paths.mapInArrow(
        functools.partial(
            _lines_task,
            properties,
            "whole" if whole else "lines",
            options.get("encoding") or options.get("charset") or "utf-8",
            options.get("linesep"),
        ),
        "value string",
    )
    reader_options = dict(source.options)
    if source.format in ("json", "csv"):
        reader_options.setdefault("mode", "FAILFAST")
    frame_reader = spark.read.options(**reader_options)
    if source.schema_ddl:
        frame_reader = frame_reader.schema(source.schema_ddl)
    return frame_reader.json(lines) if source.format == "json" else frame_reader.csv(lines)


def _paths_frame(spark: SparkSession, files: Sequence[ObjectFile]) -> DataFrame:
    """One row per file. Up to ``maxPartitionBytes`` in all, the files are spread over Spark's
    default parallelism; above it, one partition per pack of about that many bytes, largest file
    first into the emptiest pack."""
    target = _bytes_setting(spark.conf.get("spark.sql.files.maxPartitionBytes"), _DEFAULT_PARTITION_BYTES)
    by_size = math.ceil(sum(f.size for f in files) / target)
    count = min(len(files), by_size) if by_size > 1 else len(files)
    packs: list[list[str]] = [[] for _ in range(count)]
    sizes = [0] * count
    for file in sorted(files, key=lambda f: (-f.size, f.url)):
        emptiest = sizes.index(min(sizes))
        packs[emptiest].append(file.url)
        sizes[emptiest] += file.size
    joined = ["\n".join(pack) for pack in packs]
    frame = spread(spark, joined, "pack", slices=count if by_size > 1 else None)
    return frame.mapInArrow(_one_row_per_path, "path string")


def _one_row_per_path(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        paths = [path for pack in batch.column("pack").to_pylist() for path in pack.split("\n")]
        yield pa.RecordBatch.from_arrays([pa.array(paths, pa.string())], names=["path"])


def _bytes_setting(value: str | None, default: int) -> int:
    """Spark's byte sizes: a plain number, or with a ``b``/``k``/``m``/``g`` suffix."""
    if not value:
        return default
    text = value.strip().lower().removesuffix("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text) if text.isdigit() else default


def _footer_schema(files: Sequence[ObjectFile], io_properties: dict[str, str], *, merge: bool) -> Any:
    """The Spark schema of Parquet files, from their footers: the first file's, as Spark reads
    without ``mergeSchema``, or all of them unified. Every column nullable, as Spark's reader makes
    them: a later file may hold nulls where the first held none."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schemas = [_parquet_schema(f.url, io_properties) for f in (files if merge else files[:1])]
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive") if len(schemas) > 1 else schemas[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidSinkConfig(f"the landing Parquet files' schemas cannot be merged: {exc}") from None
    plain = pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])
    return from_arrow_schema(plain, prefer_timestamp_ntz=True)


def _parquet_schema(url: str, io_properties: dict[str, str]) -> pa.Schema:
    with load_file_io(io_properties, url).new_input(url).open() as stream:
        return pq.read_schema(stream)


def _parquet_task(
    io_properties: dict[str, str], schema: pa.Schema, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task: every row of its Parquet files, in ``schema``: columns matched by
    name (exactly, else ignoring case, as Spark does by default), cast, absent ones null."""
    for batch in batches:
        for url in batch.column("path").to_pylist():
            with load_file_io(io_properties, url).new_input(url).open() as stream:
                parquet = pq.ParquetFile(stream)
                names = _match_columns(parquet.schema_arrow.names, schema.names)
                wanted = sorted({name for name in names.values() if name is not None})
                for part in parquet.iter_batches(columns=wanted):
                    yield _conform(part, schema, names, url)


def _match_columns(present: Sequence[str], wanted: Sequence[str]) -> dict[str, str | None]:
    folded = {name.lower(): name for name in present}
    return {name: name if name in present else folded.get(name.lower()) for name in wanted}


def _conform(batch: pa.RecordBatch, schema: pa.Schema, names: Mapping[str, str | None], url: str) -> pa.RecordBatch:
    arrays = []
    for wanted in schema:
        source = names[wanted.name]
        if source is None:
            arrays.append(pa.nulls(batch.num_rows, type=wanted.type))
            continue
        column = batch.column(source)
        if column.type != wanted.type:
            # Only a timestamp's unit may lose digits (nanoseconds to Spark's microseconds);
            # any other lossy cast is an error naming the file.
            lossy = pa.types.is_timestamp(column.type) and pa.types.is_timestamp(wanted.type)
            try:
                column = column.cast(wanted.type, safe=not lossy)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"{url}: column {source!r} ({column.type}) cannot be read as {wanted.type}: {exc}"
                ) from None
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _lines_task(
    io_properties: dict[str, str],
    mode: Literal["lines", "whole"],
    encoding: str,
    separator: str | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task: the text of its files, one row per line (or per file), for Spark's
    JSON and CSV parsers."""
    buffered: list[str] = []
    for batch in batches:
        for url in batch.column("path").to_pylist():
            if mode == "whole":
                texts: Iterator[str] = iter([_whole_text(url, io_properties, encoding)])
            else:
                texts = _lines(url, io_properties, encoding, separator)
            for text in texts:
                buffered.append(text)
                if len(buffered) >= LINES_PER_BATCH:
                    yield pa.RecordBatch.from_pydict({"value": buffered})
                    buffered = []
    if buffered:
        yield pa.RecordBatch.from_pydict({"value": buffered})


def _open_text(url: str, io_properties: dict[str, str]) -> Any:
    # The raw bytes, decompressed here: pyarrow's sequential streams would guess a codec from the
    # name themselves, fsspec's would not, and the result must not depend on which FileIO it is.
    stream = load_file_io(io_properties, url).new_input(url).open(seekable=True)
    codec = _codec(url)
    return stream if codec is None else pa.CompressedInputStream(stream, codec)


def _codec(url: str) -> str | None:
    name = url.rsplit("/", 1)[-1]
    if "." not in name:
        return None
    try:
        return str(pa.Codec.detect(name).name)
    except (TypeError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # no compression extension: the file is plain text


def _whole_text(url: str, io_properties: dict[str, str], encoding: str) -> str:
    with _open_text(url, io_properties) as stream:
        return str(stream.read().decode(encoding))


def _lines(url: str, io_properties: dict[str, str], encoding: str, separator: str | None) -> Iterator[str]:
    """Lines split as Spark's text reader splits them: on ``\\n``, ``\\r\\n`` or ``\\r``, or on
    ``lineSep`` when given; never on the other characters ``str.splitlines`` breaks at, which may
    sit inside a JSON string."""
    sep = separator.encode(encoding) if separator else None
    rest = b""
    with _open_text(url, io_properties) as stream:
        while chunk := stream.read(READ_CHUNK):
            complete, rest = _cut(rest + chunk, sep)
            yield from (part.decode(encoding) for part in _split(complete, sep))
    yield from (part.decode(encoding) for part in _split(rest, sep))


def _cut(data: bytes, sep: bytes | None) -> tuple[bytes, bytes]:
    """``data`` as its complete lines and the unfinished rest, which the next chunk continues."""
    if sep is not None:
        cut = data.rfind(sep)
        return (data[: cut + len(sep)], data[cut + len(sep) :]) if cut >= 0 else (b"", data)
    end = len(data) - 1 if data.endswith(b"\r") else len(data)  # a final \r may be half of \r\n
    cut = max(data.rfind(b"\n", 0, end), data.rfind(b"\r", 0, end))
    return (data[: cut + 1], data[cut + 1 :]) if cut >= 0 else (b"", data)


def _split(data: bytes, sep: bytes | None) -> list[bytes]:
    if not data:
        return []
    normalised = data if sep is not None else data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    parts = normalised.split(sep or b"\n")
    if parts[-1] == b"":
        parts.pop()
    return parts


# Reading the snapshot range an epoch reserved of an upstream Iceberg table (``IcebergTableInput``):
# the rows the range's appends added, read by Spark's own Parquet reader.
#
# Spark would read Iceberg through the iceberg-spark-runtime jar, which the pyspark package does not
# ship. The driver plans from the metadata alone (the snapshot log, manifest lists and manifests),
# then Spark's Parquet reader reads the planned files at the range's schema, by field id
# (``upsert.read_by_id``): what the runtime's reader does for files without delete files, which
# the range never has. Files on an object store, which pyspark has no connector for (``file_io``),
# are read by Python tasks with pyiceberg's reader instead, on the FileIO properties the committer
# reaches them with.
#
# The range was reserved before the write (``core.input_ranges``), and a retry, a clear or a reprocess
# reads it again: what it reads must follow from the range alone, never from the table's state now.
#
# - The range is checked against the table's snapshots and their parent links first. A snapshot expired before the sink
#   consumed it, or an upstream rolled back past the range's start, leaves rows that cannot be read;
#   the refusal says so rather than reading a part of the range.
# - Every snapshot in it must be an append or a replace (pyiceberg's incremental append scan would
#   skip the others silently): an overwrite or a delete changed rows the sink may have delivered
#   already, and reading its added files would deliver rows twice or ones taken back upstream; a
#   replace (a compaction) changed none, and the files it removed are read where their appends put them.
# - The rows are read at the schema of the range's last snapshot, so that a column added, renamed or
#   dropped upstream afterwards does not change what a replay of the epoch reads.

#: What the read gives ``inputs.read_input``: the rows (``None``: nothing to read, no Spark job) and
#: the source positions of the pre-commit. A pair rather than ``inputs.EpochInput``, which would be
#: an import cycle.
RangeRead = tuple[DataFrame | None, dict[str, Any]]

_KEEP_SNAPSHOTS = (
    "the rows of the range can no longer be read. Keep the upstream's snapshots until the sink has "
    "consumed them (the table's history.expire.max-snapshot-age-ms and "
    "history.expire.min-snapshots-to-keep, or the expiry job's own settings); to move on, write to a "
    "new sink id whose input starts after a current snapshot of the table (start_after_snapshot_id)"
)


def read_snapshot_range(spark: SparkSession, spec: EpochJobSpec) -> RangeRead:
    """The rows the appends of ``spec.input_range`` added to the upstream table, and the range as
    source positions with what was read (snapshots, data files, records)."""
    source, reserved = spec.input, spec.input_range
    if not isinstance(source, IcebergTableInput) or reserved is None:
        raise InvalidSinkConfig(f"{_owner(spec)}: a snapshot range is read for an iceberg_table input only")
    if reserved.empty:
        return None, reserved.positions(snapshots=0, files=0, records=0)
    # The catalog's name too, not a label: pyiceberg's SQL catalog keeps tables by catalog name.
    # ``load_table`` turns a missing table and an unreachable catalog into the domain's errors. It is
    # imported here, on the driver: the executors' tasks of this module need no catalog access.
    from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table

    table = load_table(load_catalog(spec.input_catalog_name, **spec.input_catalog_properties), source.table)
    snapshots = range_snapshots(table.metadata, reserved, _owner(spec))
    if reserved.after_snapshot_id is None:
        check_from_first(table, snapshots, reserved, _owner(spec))
    pinned = _at_schema_of(table.metadata, snapshots[-1])
    files = added_files(table, pinned, reserved, snapshots, _owner(spec))
    records = sum(int(f.record_count) for f in files.values())
    positions = reserved.positions(snapshots=len(snapshots), files=len(files), records=records)
    if not files:
        return None, positions
    schema = _spark_schema(pinned.schema(), source.table, _owner(spec))
    if not any(is_object_store(path) for path in files) and not _required_nested(pinned.schema()):
        return read_by_id(spark, pinned.schema(), sorted(files)), positions
    from pyspark.sql.pandas.types import to_arrow_schema

    shipped = TableFiles(
        pinned.model_dump_json(),
        # The catalog's storage properties, then the loaded table's FileIO's: a REST catalog that
        # vends credentials puts them there, scoped to this table (as ``epoch_writer.load_iceberg_target`` does for a sink).
        storage_properties({**spec.input_catalog_properties, **table.io.properties}),
        files,
    )
    task = functools.partial(_read_task, shipped, to_arrow_schema(schema, timezone="UTC"))
    return spread(spark, sorted(files), "path").mapInArrow(task, schema), positions


def range_snapshots(metadata: TableMetadata, reserved: SnapshotRange, owner: str) -> list[Snapshot]:
    """The snapshots of a non-empty range, oldest first, each an append or a replace: the parents
    of ``to_snapshot_id`` down to the one after ``after_snapshot_id`` (down to the root without one).
    A replace (a compaction, a file format change) rewrites files without changing a row (the
    table spec's ``replace`` operation), so what the range's appends added is all the range added;
    any other operation changed rows the sink may have delivered, and is refused.

    ``after_snapshot_id`` itself may be expired, as long as its child still names it parent (Java's
    expiry leaves the link; pyiceberg's drops it, and the range is refused then: nothing in the
    metadata tells an expired start from a rollback past it).
    """
    walked: list[Snapshot] = []
    wanted = reserved.to_snapshot_id
    while wanted != reserved.after_snapshot_id:
        if wanted is None or len(walked) > len(metadata.snapshots):
            raise _no_start(metadata, reserved, walked, owner)
        snapshot = metadata.snapshot_by_id(wanted)
        if snapshot is None:
            child = f", the parent of snapshot {walked[-1].snapshot_id}," if walked else ""
            raise InputRangeRefused(
                f"{owner}: snapshot {wanted}{child} of {reserved.table} is gone from the table's metadata, "
                f"expired by the upstream's snapshot expiry before the sink consumed the range "
                f"({reserved.describe()}): {_KEEP_SNAPSHOTS}"
            )
        walked.append(snapshot)
        wanted = snapshot.parent_snapshot_id
    walked.reverse()
    for snapshot in walked:
        operation = snapshot.summary.operation if snapshot.summary is not None else None
        if operation not in (Operation.APPEND, Operation.REPLACE):
            committed = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC).isoformat()
            kind = repr(operation.value) if operation is not None else "not recorded"
            raise InputRangeRefused(
                f"{owner}: snapshot {snapshot.snapshot_id} of {reserved.table} (committed {committed}), in the "
                f"range ({reserved.describe()}), is not an append: its operation is {kind}. An incremental input reads "
                "appends only (and steps over compactions, which change no row): the rows an overwrite or a delete "
                "changed or removed may have been delivered already, and reading its files would deliver them "
                "again or ones taken back upstream. To move on, write to a new sink id whose input starts after "
                "that snapshot (start_after_snapshot_id)"
            )
    return walked


def _no_start(
    metadata: TableMetadata, reserved: SnapshotRange, walked: Sequence[Snapshot], owner: str
) -> InputRangeRefused:
    """The parents of ``to`` ended (or looped) before ``after_snapshot_id``."""
    after = reserved.after_snapshot_id
    if after is None or metadata.snapshot_by_id(after) is not None or not walked:
        why = "the upstream was rolled back past it, or the table replaced"
    else:
        why = (
            f"it is gone from the table's metadata and snapshot {walked[-1].snapshot_id} names no parent: the "
            "snapshots before it were expired (pyiceberg's expiry drops the parent link of the oldest snapshot "
            "it keeps, so the range's start has to be kept too), or the upstream was rolled back"
        )
    return InputRangeRefused(
        f"{owner}: snapshot {reserved.after_snapshot_id} of {reserved.table} is not an ancestor of snapshot "
        f"{reserved.to_snapshot_id}, so the range ({reserved.describe()}) is not a piece of the table's "
        f"history any more ({why}): {_KEEP_SNAPSHOTS}"
    )


def check_from_first(table: Table, snapshots: Sequence[Snapshot], reserved: SnapshotRange, owner: str) -> None:
    """A range from the table's first snapshot ends its walk at a snapshot without a parent, which
    may be the oldest one pyiceberg's expiry kept rather than the first (it drops that link). Had
    the walk reached the first, every file live at the range's end would have been added by one of
    the range's snapshots, all appends: a file added by another one shows that snapshots expired."""
    ids = {s.snapshot_id for s in snapshots}
    for manifest in snapshots[-1].manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id not in ids:
                raise InputRangeRefused(
                    f"{owner}: snapshot {snapshots[0].snapshot_id} of {reserved.table} names no parent, but "
                    f"{entry.data_file.file_path} was added by snapshot {entry.snapshot_id}, which is gone from "
                    f"the table's metadata: the range ({reserved.describe()}) lost its first snapshots to the "
                    f"upstream's snapshot expiry before the sink consumed them: {_KEEP_SNAPSHOTS}"
                )


def added_files(
    table: Table, pinned: TableMetadata, reserved: SnapshotRange, snapshots: Sequence[Snapshot], owner: str
) -> dict[str, DataFile]:
    """The data files the range's appends added, by path (``pinned``: the metadata they are read
    at, which planning needs nothing of).

    A file an append of the range added is live at the range's end unless a replace of the range
    compacted it away afterwards: it then stays in storage (the range's snapshots still name it),
    but only its append's own manifests list it. So the appends after the range's last replace are
    planned from the range end's manifest list alone, where each of their files sits in a manifest
    they wrote (EXISTING where a later append merged it), and each append before that replace from
    its own manifest list. A range without a replace reads one manifest list; pyiceberg's
    ``IncrementalAppendScan`` reads one per snapshot (most of the planning of a range of many small
    appends, ``bench.incremental_read``). Delete files added by an append are refused.
    """
    replaces = [i for i, s in enumerate(snapshots) if _operation(s) is Operation.REPLACE]
    after_replaces = replaces[-1] + 1 if replaces else 0  # no replace: every append is a late one
    early = [s for s in snapshots[:after_replaces] if _operation(s) is Operation.APPEND]
    late = {s.snapshot_id for s in snapshots[after_replaces:]}
    files: dict[str, DataFile] = {}
    for snapshot in early:  # only its own entries, ADDED in the manifests it wrote
        _collect(table, snapshot, reserved, owner, {snapshot.snapshot_id}, files, added_only=True)
    if late:
        _collect(table, snapshots[-1], reserved, owner, late, files, added_only=False)
    return files


def _collect(
    table: Table,
    listed: Snapshot,
    reserved: SnapshotRange,
    owner: str,
    ids: set[int],
    files: dict[str, DataFile],
    *,
    added_only: bool,
) -> None:
    """Into ``files``: the entries of ``listed``'s manifests written by ``ids`` that ``ids`` added."""
    for manifest in listed.manifests(table.io):
        if manifest.added_snapshot_id not in ids:
            continue  # written before those snapshots, or by a replace: no file they added
        if manifest.content == ManifestContent.DELETES:
            raise InputRangeRefused(
                f"{owner}: snapshot {manifest.added_snapshot_id} of {reserved.table}, in the range "
                f"({reserved.describe()}), added delete files ({manifest.manifest_path}); an incremental "
                "input reads appended data files only. To move on, write to a new sink id whose input "
                "starts after that snapshot (start_after_snapshot_id)"
            )
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id in ids and (not added_only or entry.status == ManifestEntryStatus.ADDED):
                files[entry.data_file.file_path] = entry.data_file


def _operation(snapshot: Snapshot) -> Operation | None:
    return snapshot.summary.operation if snapshot.summary is not None else None


def _at_schema_of(metadata: TableMetadata, snapshot: Snapshot) -> TableMetadata:
    """The table's metadata with the snapshot's schema as the current one: the scan's partition
    evaluators and the executors' reader (``TableFiles.scan``) then see the table as it was at the
    range's end, whatever schema changes came after."""
    schema_id = snapshot.schema_id if snapshot.schema_id is not None else metadata.current_schema_id
    return metadata.model_copy(update={"current_schema_id": schema_id})


def _spark_schema(schema: Schema, table: str, owner: str) -> st.StructType:
    """The frame's schema: the Iceberg schema's, required columns not null (``type_mapping``)."""
    fields = []
    for column in schema.fields:
        spark_type = iceberg_to_spark(column.field_type)
        if spark_type is None:
            raise InvalidSinkConfig(
                f"{owner}: column {column.name!r} of {table} is {column.field_type}, which Spark has no type "
                "for; an incremental input reads tables whose columns Spark can hold"
            )
        fields.append(st.StructField(column.name, spark_type, nullable=not column.required))
    return st.StructType(fields)


def _required_nested(schema: Schema) -> bool:
    """Whether a struct field, list element or map value is required: Spark's file sources read
    every field as nullable, and a sink with the same required field would refuse such a frame
    (``alignment``), so these tables are read by pyiceberg's reader, which keeps the schema's
    nullability. A top-level required column read as nullable is checked for nulls instead."""
    top = {f.field_id for f in schema.fields}
    return any(f.required for field_id, f in index_by_id(schema).items() if field_id not in top)


def _read_task(files: TableFiles, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task for files on an object store: the rows of its files, in the frame's Arrow types (pyiceberg's reader
    may hand large strings, or another spelling of UTC, than Spark expects)."""
    scan = files.scan()
    for batch in batches:
        for path in batch.column("path").to_pylist():
            for read in scan.to_record_batches([FileScanTask(files.files[path])]):
                yield read.cast(schema)


def _owner(spec: EpochJobSpec) -> str:
    return f"sink {spec.sink_id!r} epoch {spec.epoch}"
