"""An epoch's files written by Spark's own Parquet writer, described from their footers afterwards.

The pyarrow writer (``file_writer``) hands every row from the JVM to a Python worker as Arrow and
back; Spark's writer keeps the rows in the JVM, which is what a plain ``df.write.parquet`` costs. It
is used wherever it can give the files everything the pyarrow writer would:

* **Field ids, not a name mapping.** Spark (3.3 and later) writes a column's Parquet field id from its
  ``parquet.field.id`` metadata, for top-level columns and struct fields. Files that carry their ids
  keep resolving after any rename or drop-and-re-add of a column, with any Iceberg reader, whatever
  the table's name mapping says. Spark cannot give list elements and map keys and values an id,
  and a file with ids on some fields only is read by id by Iceberg readers (the mapping is only for
  files without any): a table with list or map columns keeps the pyarrow writer.
* **Partition values as Iceberg has them.** Rows go to ``partitionBy`` directories of computed
  columns holding the Iceberg partition value itself (the day ordinal for ``day(ts)``, the days or
  microseconds of an identity date or timestamp), so each file holds one partition value and the
  directory names it exactly. Strings get a one-character prefix because Spark writes the empty
  string and null to the same directory.
* **Spark's default commit protocol** (``FileOutputCommitter``, algorithm 1). Each task attempt
  writes below ``_temporary``, the driver lets one attempt per task commit, and only the job commit
  moves the committed tasks' files into the write location: a failed or speculative attempt never
  adds rows, and listing the location after the job lists exactly the committed files. Algorithm 2
  or a committer writing straight into the location would save renames, which on local disk and
  HDFS are metadata operations (no gain the benchmark could see), and would make a task commit
  that dies half way leave files the listing could not tell apart. Object stores, where renames
  are copies, are written by the pyarrow writer anyway: pyspark has no connector for them.
* **Rows as they come**, as a plain write takes them: each task sorts its rows by partition value
  and writes one file per value it holds. Shuffling them by partition value first (fewer files)
  is a full exchange of the rows; a table asks for it with ``write.distribution-mode`` ``hash`` or
  ``range``, a job with ``writers``.
* **Descriptors from the footers**, by ``describe_parquet_file`` as for the pyarrow writer's files,
  after the job: one footer read per file, on the executors, or on the driver for a few files,
  where a Spark job would cost more than the reads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.transforms import IdentityTransform, Transform, VoidTransform
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    ListType,
    MapType,
    StringType,
    StructType,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.spark.changes import quote
from airflow_provider_exactly_once.spark.file_io import driver_filesystem, is_object_store
from airflow_provider_exactly_once.spark.partition_transforms import spark_value
from airflow_provider_exactly_once.spark.spread import spread
from airflow_provider_exactly_once.spark.writer_protocol import (
    FileWrite,
    RequiredColumnHasNulls,
    required_nulls_message,
    rows_per_file,
)
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark, spark_schema

#: What Spark writes for a null partition value (it is not configurable).
NULL_DIRECTORY = "__HIVE_DEFAULT_PARTITION__"
#: Prefix of a string partition value in its directory name (Spark writes "" as null otherwise).
STRING_PREFIX = "_"
#: Iceberg's codec names, as Spark's ``compression`` option spells them.
_CODECS = {
    "zstd": "zstd",
    "snappy": "snappy",
    "gzip": "gzip",
    "lz4": "lz4_raw",
    "brotli": "brotli",
    "uncompressed": "uncompressed",
    "none": "uncompressed",
}
#: Iceberg's table property for how rows are spread over write tasks (``none``, ``hash``, ``range``).
DISTRIBUTION_MODE = "write.distribution-mode"
_PART_FILE = re.compile(r"^part-(\d+)-")
#: Up to this many files are described on the driver: a Spark job costs a tenth of a second or more
#: to schedule its Python tasks, the driver reads and describes a local footer in about a millisecond.
DRIVER_DESCRIBES_UP_TO = 64


def refusal(
    location: str, write_schema: Schema, spec: PartitionSpec, table_properties: Mapping[str, str]
) -> str | None:
    """Why Spark's writer cannot write this table's files as the pyarrow writer would; ``None`` when
    it can. Each reason is a case where its files would differ from what the table needs."""
    if is_object_store(location):
        return "the table is on an object store, which pyspark reaches through no connector"
    for column in write_schema.fields:
        found = _unwritable(column.field_type)
        if found is not None:
            return f"column {column.name!r} holds {found}"
    for partition_field in spec.fields:
        transform = partition_field.transform
        source = write_schema.find_field(partition_field.source_id).field_type
        # identity sources are the ones ``partition_transforms.check_spec`` let through; a float's
        # directory name would not read back as the value it was written from
        if isinstance(transform, IdentityTransform) and isinstance(source, FloatType | DoubleType):
            return f"identity partition field {partition_field.name!r} on {source}"
    codec = table_properties.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    if codec.lower() not in _CODECS:
        return f"compression codec {codec!r}"
    if TableProperties.PARQUET_COMPRESSION_LEVEL in table_properties and codec.lower() != "zstd":
        return f"a compression level for {codec!r}"
    return None


def _unwritable(iceberg: IcebergType) -> str | None:
    if isinstance(iceberg, ListType | MapType):
        return f"a {'list' if isinstance(iceberg, ListType) else 'map'}, whose element ids Spark cannot write"
    if isinstance(iceberg, StructType):
        return next((found for f in iceberg.fields if (found := _unwritable(f.field_type)) is not None), None)
    if iceberg_to_spark(iceberg) is None:
        return f"type {iceberg}, which Spark cannot produce"
    return None


class SparkParquetWriter:
    """Spark's own Parquet writer, for the tables ``refusal`` finds nothing against."""

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        spark = frame.sparkSession
        columns, values = _file_columns(frame, write.write_schema)
        partitions = _partition_columns(write, values)
        out = frame.select(*columns.values(), *[p.column.alias(p.directory) for p in partitions])
        keys = [F.col(quote(p.directory)) for p in partitions]
        distribution = write.table_properties.get(DISTRIBUTION_MODE, "none")
        if write.writers is not None:
            out = out.repartition(write.writers, *keys)
        elif keys and distribution in ("hash", "range"):
            out = out.repartition(*keys)
        writer = out.write.options(**_writer_options(write)).mode("error")
        if partitions:
            writer = writer.partitionBy(*[p.directory for p in partitions])
        with session_conf(spark, SESSION_CONF):
            writer.parquet(write.location)
        return _describe(spark, write, partitions)


#: Session settings the Parquet writer reads from the session alone: Iceberg's timestamps are
#: INT64 microseconds, its types are the non-legacy Parquet ones, dates before 1582 are proleptic
#: Gregorian as written, and the ids are what readers resolve columns by.
SESSION_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.writeLegacyFormat": "false",
    "spark.sql.parquet.fieldId.write.enabled": "true",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
}


@contextlib.contextmanager
def session_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` for the duration of the write, leaving the session as it was; a session built
    with them (``epoch_writer.main``) costs a look-up per setting. Not ``conf.getAll``: in process it
    walks every setting of the session through py4j, a call each and an exception at the end: 22 to
    26 ms of every write, against under 1 ms for the four look-ups."""
    before = {key: now for key, value in settings.items() if (now := spark.conf.get(key, None)) != value}
    for key in before:
        spark.conf.set(key, settings[key])
    try:
        yield
    finally:
        for key, previous in before.items():
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)


#: Table properties that have a Parquet writer option of the same meaning.
_PARQUET_OPTIONS = {
    TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES: "parquet.block.size",
    TableProperties.PARQUET_ROW_GROUP_LIMIT: "parquet.block.row.count.limit",
    TableProperties.PARQUET_PAGE_SIZE_BYTES: "parquet.page.size",
    TableProperties.PARQUET_PAGE_ROW_LIMIT: "parquet.page.row.count.limit",
    TableProperties.PARQUET_DICT_SIZE_BYTES: "parquet.dictionary.page.size",
    TableProperties.PARQUET_COMPRESSION_LEVEL: "parquet.compression.codec.zstd.level",
}


def _writer_options(config: FileWrite) -> dict[str, str]:
    """The table's Parquet properties as Spark's writer options (they reach the job's Hadoop conf).

    Only the properties the table sets: parquet-java's own defaults are Iceberg's (128 MiB row
    groups, 1 MiB pages of at most 20,000 rows). pyiceberg's default row limit per row group
    (``write.parquet.row-group-limit``, which Iceberg itself does not have) is not imposed: it made
    the write measurably slower.
    """
    properties = config.table_properties
    codec = properties.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    options = {option: str(int(properties[key])) for key, option in _PARQUET_OPTIONS.items() if key in properties}
    options.update(
        {
            "compression": _CODECS[codec.lower()],
            "maxRecordsPerFile": str(rows_per_file(config.target_file_size, config.write_schema)),
            # The location is the write's own: no _SUCCESS marker, and no .crc files beside local
            # files (Hadoop's checksummed local filesystem writes one per file; nothing reads them).
            "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
            "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
            "fs.file.impl.disable.cache": "true",
        }
    )
    return options


def _file_columns(frame: DataFrame, schema: Schema) -> tuple[dict[str, Column], dict[str, Column]]:
    """Every column of the write schema, in its order, carrying its field ids (and the same without
    its name, for the partition values); absent optional columns as typed nulls, so every file has
    every column with its statistics."""
    present = set(frame.columns)
    columns: dict[str, Column] = {}
    values: dict[str, Column] = {}
    for spark_field in spark_schema(schema).fields:  # refusal() sent the types Spark lacks elsewhere
        if spark_field.name in present:
            value = F.col(quote(spark_field.name))
            if isinstance(spark_field.dataType, st.StructType):
                value = value.cast(spark_field.dataType)  # the cast carries the nested fields' ids
        else:
            value = F.lit(None).cast(spark_field.dataType)
        columns[spark_field.name] = value.alias(spark_field.name, metadata=spark_field.metadata)
        values[spark_field.name] = value
    return columns, values


@dataclass(frozen=True)
class _PartitionColumn:
    """A computed column whose directory holds one Iceberg partition field's value."""

    field_name: str
    directory: str
    column: Column
    #: How the directory's text reads back: ``int``, ``bool`` or ``str`` (prefixed).
    kind: str


def _partition_columns(config: FileWrite, columns: Mapping[str, Column]) -> list[_PartitionColumn]:
    taken = {name.lower() for name in columns}
    result = []
    for partition_field in config.spec.fields:
        transform = partition_field.transform
        if isinstance(transform, VoidTransform):
            continue  # null in every file: no directory level needed
        name = config.write_schema.find_column_name(partition_field.source_id)
        assert name is not None
        source_type = config.write_schema.find_field(partition_field.source_id).field_type
        top, *nested = name.split(".")
        source = columns[top]
        for part in nested:
            source = source.getField(part)
        directory = partition_field.name
        while directory.lower() in taken:
            directory += "_"
        taken.add(directory.lower())
        value = spark_value(transform, source_type, source)
        kind = _kind(transform, source_type)
        if kind == "str":
            value = F.concat(F.lit(STRING_PREFIX), value)
        result.append(_PartitionColumn(partition_field.name, directory, value, kind))
    return result


def _kind(transform: Transform[Any, Any], source_type: IcebergType) -> str:
    """How a partition value's directory name reads back: every value is an integer but an identity
    string's or boolean's."""
    if isinstance(transform, IdentityTransform) and isinstance(source_type, StringType):
        return "str"
    if isinstance(transform, IdentityTransform) and isinstance(source_type, BooleanType):
        return "bool"
    return "int"


def _describe(
    spark: SparkSession, config: FileWrite, partitions: Sequence[_PartitionColumn]
) -> list[DataFileDescriptor]:
    files = _committed_files(config, partitions)
    if not files:
        return []
    described: list[tuple[str, dict[str, int]]]
    if len(files) <= DRIVER_DESCRIBES_UP_TO:
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:  # footer reads wait on storage
            described = list(pool.map(lambda f: next(_describe_files(config, iter([f]))), files))
    else:
        encoded = [json.dumps(file) for file in files]
        task = functools.partial(_describe_task, config)
        rows = spread(spark, encoded, "file").mapInArrow(task, "described string").collect()
        described = [(text, counts) for text, counts in (json.loads(row[0]) for row in rows)]
    nulls: dict[str, int] = {}
    descriptors = []
    for text, counts in described:
        for name, count in counts.items():
            nulls[name] = nulls.get(name, 0) + count
        descriptors.append(DataFileDescriptor.model_validate_json(text))
    for name in config.checked_required:
        if nulls.get(name):
            raise RequiredColumnHasNulls(required_nulls_message(name, nulls[name]))
    empty = [d.path for d in descriptors if not d.record_count]
    if empty:  # Spark writes one file without rows for a task without rows; the table needs none
        fs, _ = driver_filesystem(config.location, config.io_properties)
        fs.rm([driver_filesystem(path, config.io_properties)[1] for path in empty])
    return [d for d in descriptors if d.record_count]


def _committed_files(
    config: FileWrite, partitions: Sequence[_PartitionColumn]
) -> list[tuple[str, int, dict[str, PartitionValue]]]:
    """Every data file the job committed, with its size and partition; Spark's commit put exactly the
    files of one successful attempt per task here and removed its ``_temporary`` folder."""
    void = [f.name for f in config.spec.fields if isinstance(f.transform, VoidTransform)]
    fs, root = driver_filesystem(config.location, config.io_properties)
    fs.invalidate_cache()
    root = root.rstrip("/")
    found = []
    for path, info in sorted(fs.find(root, detail=True).items()):
        relative = posixpath.relpath(path, root)
        if not relative.endswith(".parquet") or any(p.startswith(("_", ".")) for p in relative.split("/")):
            continue
        partition = dict.fromkeys(void, None) | _directory_partition(relative, partitions)
        found.append((f"{config.location}/{relative}", int(info["size"]), partition))
    return found


def _directory_partition(relative: str, partitions: Sequence[_PartitionColumn]) -> dict[str, PartitionValue]:
    levels = dict(_unescape(level).split("=", 1) for level in relative.split("/")[:-1])
    values: dict[str, PartitionValue] = {}
    by_directory = {p.directory: p for p in partitions}
    if set(levels) != set(by_directory):
        raise ValueError(f"file {relative!r} is not in a directory of every partition column {sorted(by_directory)}")
    for directory, text in levels.items():
        partition = by_directory[directory]
        values[partition.field_name] = _read_back(text, partition.kind)
    return values


def _read_back(text: str, kind: str) -> PartitionValue:
    if text == NULL_DIRECTORY:
        return None
    if kind == "str":
        if not text.startswith(STRING_PREFIX):
            raise ValueError(f"partition directory value {text!r} lacks its prefix")
        return text[len(STRING_PREFIX) :]
    if kind == "bool":
        return {"true": True, "false": False}[text]
    return int(text)


def _unescape(text: str) -> str:
    """Spark's ``unescapePathName``: ``%XX`` back to the character it escaped."""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _describe_files(
    config: FileWrite, files: Iterator[tuple[str, int, dict[str, PartitionValue]]]
) -> Iterator[tuple[str, dict[str, int]]]:
    """Each file's descriptor from its footer, and the nulls of the required columns Spark could not
    prove non-null (the footer counts them per column chunk); on the executors, or on the driver."""
    for path, size, partition in files:
        with load_file_io(config.io_properties, path).new_input(path).open() as stream:
            metadata = pq.read_metadata(stream)
        descriptor = describe_parquet_file(
            path,
            table_schema=config.write_schema,
            partition=partition,
            writer=_writer_of(path),
            table_properties=config.table_properties,
            parquet_metadata=metadata,
            file_size_in_bytes=size,
        )
        yield (
            descriptor.model_dump_json(exclude_defaults=True),
            {name: _null_count(path, metadata, name, config.io_properties) for name in config.checked_required},
        )


def _describe_task(config: FileWrite, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``_describe_files`` as a ``mapInArrow`` task over ``spread``'s rows, each described file as JSON."""
    for batch in batches:
        files = (tuple(json.loads(text)) for text in batch.column("file").to_pylist())
        described = [json.dumps(pair) for pair in _describe_files(config, files)]
        yield pa.RecordBatch.from_arrays([pa.array(described, pa.string())], names=["described"])


def _writer_of(path: str) -> str | None:
    """The Spark task that wrote the file, from the name Spark gave it (``part-00003-<job>.c000...``)."""
    found = _PART_FILE.match(posixpath.basename(path))
    return found.group(1) if found else None


def _null_count(path: str, metadata: pq.FileMetaData, name: str, io_properties: Mapping[str, str]) -> int:
    leaf = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == name), None)
    if leaf is not None:
        counts = [metadata.row_group(g).column(leaf).statistics for g in range(metadata.num_row_groups)]
        if all(c is not None and c.has_null_count for c in counts):  # Spark writes them
            return sum(c.null_count for c in counts if c is not None)
    # A struct's nulls are not its fields' nulls, and a missing count is never guessed: read it.
    with load_file_io(dict(io_properties), path).new_input(path).open() as stream:
        return int(pq.read_table(stream, columns=[name]).column(name).null_count)
