"""Landing files on an object store, read by the executors with pyarrow instead of by Spark.

Spark could read ``s3://`` only through Hadoop's s3a connector, which is not there (see
``storage``). Staging the files to a local disk first was the alternative; it is not done, because
on a cluster the driver's disk is not the executors', it would copy every byte twice through one
machine, and the copy would need its own clean-up. Instead:

1. the driver lists the epoch's files with fsspec (pyiceberg's fsspec FileIO, from the input's
   FileIO properties), applying the same selection rule as for local paths (``jobspec``), and packs
   them into partitions of about ``spark.sql.files.maxPartitionBytes`` each (fewer bytes than one
   such partition are spread over Spark's default parallelism, ``spread``);
2. a DataFrame of file paths, one Spark partition per pack, goes through ``mapInArrow``: each task
   opens its files with pyiceberg's FileIO (pyarrow's S3 filesystem, credentials from the spec) and
   yields their rows as Arrow batches;
3. Parquet batches are the input's rows directly, in the schema of the first file (Spark's own
   default; ``mergeSchema=true`` unifies every footer) or the spec's ``schema_ddl``. JSON and CSV
   files are yielded as lines, and Spark's own JSON and CSV parsers turn the lines into rows, so
   their options, schema inference, ``schema_ddl`` and FAILFAST behave exactly as for local files.

What differs from Spark's file sources: a file is read by one task (Spark splits large splittable
files by bytes); JSON ``multiLine`` files are read whole, one document per file; CSV ``multiLine``
(quoted line breaks) cannot be split into lines and is refused; of the Parquet reader options only
``mergeSchema`` is understood. Compressed JSON and CSV files are decompressed by their extension
(``.gz``, ``.bz2``, ``.zst``, ``.lz4``...), as Hadoop's codecs do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyspark.sql import DataFrame, SparkSession

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.spark.file_io import driver_filesystem, scheme_of, spread
from airflow_provider_exactly_once.spark.jobspec import FilesInput

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
    for field in schema:
        source = names[field.name]
        if source is None:
            arrays.append(pa.nulls(batch.num_rows, type=field.type))
            continue
        column = batch.column(source)
        if column.type != field.type:
            # Only a timestamp's unit may lose digits (nanoseconds to Spark's microseconds);
            # any other lossy cast is an error naming the file.
            lossy = pa.types.is_timestamp(column.type) and pa.types.is_timestamp(field.type)
            try:
                column = column.cast(field.type, safe=not lossy)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"{url}: column {source!r} ({column.type}) cannot be read as {field.type}: {exc}"
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
