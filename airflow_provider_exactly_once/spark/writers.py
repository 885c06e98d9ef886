"""The writers of an epoch's data files behind one protocol: the pyarrow writer each Spark write task
runs on the executors (Arrow batches in, Parquet files and their descriptors out) and Spark's own
Parquet writer, described from its footers afterwards, with the Iceberg partition transforms both
compute (design.md, 'Layers').
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import math
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow
from pyiceberg.partitioning import PartitionSpec, partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue
from airflow_provider_exactly_once.sinks.files import partition_path as hive_partition_path
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.spark.file_io import driver_filesystem, is_object_store, spread
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_exactly_once.core.precommit import DataFileDescriptor


# What the epoch writer asks of a writer of data files, whichever of the two writes them.
#
# Spark's own Parquet writer (``SparkParquetWriter``) and the pyarrow writer on the executors
# (``ArrowFileWriter``) both take one table's rows, aligned to its write schema, write them below the
# write's own location, and describe each file they wrote; both refuse a null in a required column
# Spark could not prove non-null. ``epoch_writer.choose_writer`` is the one place that says which of
# them writes a table's files.

DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024


class RequiredColumnHasNulls(ValueError):
    """A required column received a null: the write fails, and its location is removed with it."""


def required_nulls_message(name: str, count: int) -> str:
    return f"required column {name!r} holds {count} null value(s); the table refuses them (filter or fill them in the input)"


@dataclass(frozen=True)
class FileWrite:
    """One table's write: everything a writer needs, pickled to the executors once per job."""

    location: str
    write_schema: Schema
    spec: PartitionSpec
    #: ``iceberg``: partition values in Iceberg's internal representation, keyed by partition field
    #: name; ``hive``: a file sink's identity partitions as readers of ``k=v`` directories expect.
    partition_style: Literal["iceberg", "hive"]
    table_properties: dict[str, str] = field(default_factory=dict)
    io_properties: dict[str, str] = field(default_factory=dict)
    checked_required: tuple[str, ...] = ()
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    #: Tasks to write with, rows distributed by partition value; ``None``: the writer's own choice.
    writers: int | None = None

    @property
    def row_group_rows(self) -> int:
        return int(
            self.table_properties.get(
                TableProperties.PARQUET_ROW_GROUP_LIMIT, str(TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT)
            )
        )


class DataFileWriter(Protocol):
    """A writer of one table's data files."""

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        """Write ``frame`` (aligned to the write schema) below ``write.location``; one descriptor a file."""
        ...


def rows_per_file(target_file_size: int, write_schema: Schema) -> int:
    """How many rows fill a file of the target size: the target over Spark's estimate of a row's
    uncompressed size. Spark's writer rolls files by rows alone, and an upsert sizes its write tasks
    by it before the pyarrow writer, which rolls on uncompressed bytes, writes them."""
    return max(1, target_file_size // _row_size(write_schema.as_struct()))


def _row_size(iceberg: IcebergType) -> int:
    """Spark's estimate of a value's uncompressed size (``DataType.defaultSize``): 20 bytes a string,
    100 a binary, the width of everything else."""
    if isinstance(iceberg, StructType):
        return max(1, sum(_row_size(f.field_type) for f in iceberg.fields))
    if isinstance(iceberg, StringType):
        return 20
    if isinstance(iceberg, BinaryType):
        return 100
    if isinstance(iceberg, DecimalType):
        return 8 if iceberg.precision <= 18 else 16
    if isinstance(iceberg, BooleanType):
        return 1
    return 4 if isinstance(iceberg, IntegerType | DateType | FloatType) else 8


# The Iceberg partition transforms the epoch writer writes, in the two forms its writers compute.
#
# Identity, void, year, month, day and hour: ``check_spec`` refuses any other transform when the
# table is loaded, before the input is read. The pyarrow writer computes a batch's partition values
# with ``arrow_values``; Spark's Parquet writer computes them as a column with ``spark_value``, which
# is also the key rows are grouped by before the pyarrow writer sees them (``spark_sort_keys``). Both
# give the value pyiceberg's own transform gives (the tests hold them to it), independent of any
# session time zone.

#: Source types whose identity partition value fits the pre-commit's JSON scalars.
IDENTITY_SOURCES = (
    BooleanType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    StringType,
    DateType,
    TimestampType,
    TimestamptzType,
)
TEMPORAL = (YearTransform, MonthTransform, DayTransform, HourTransform)
_DAY_MICROS = 86_400_000_000
_HOUR_MICROS = 3_600_000_000


def quote(name: str) -> str:
    """A top-level column reference; a dot in ``name`` is part of the name."""
    return "`" + name.replace("`", "``") + "`"


def check_spec(table: str, spec: PartitionSpec, schema: Schema) -> None:
    """Refuse a partition spec with a transform the writer cannot compute, naming every fault."""
    faults = []
    for partition_field in spec.fields:
        transform: Transform[Any, Any] = partition_field.transform
        source = schema.find_field(partition_field.source_id)
        if isinstance(transform, IdentityTransform):
            if not isinstance(source.field_type, IDENTITY_SOURCES):
                faults.append(
                    f"identity partition field {partition_field.name!r} on {source.field_type} column "
                    f"{source.name!r} (supported: boolean, int, long, float, double, string, date, timestamp)"
                )
        elif not isinstance(transform, (*TEMPORAL, VoidTransform)):
            faults.append(f"partition field {partition_field.name!r} uses transform {transform}")
    if faults:
        raise InvalidSinkConfig(
            f"table {table!r} is partitioned in a way the epoch writer cannot write: {'; '.join(faults)}; "
            "it writes identity, year, month, day and hour partitions"
        )


def arrow_values(transform: Transform[Any, Any], array: pa.Array) -> pa.Array:
    """Partition values of a column, computed with pyarrow alone.

    pyiceberg 0.12 needs the optional ``pyiceberg-core`` (Rust) for its temporal ``pyarrow_transform``;
    these four are simple enough to compute exactly here: floor to the unit in UTC, then count units
    since 1970 (day and hour by exact division of the floored microseconds, which is also right for
    instants before 1970).
    """
    if isinstance(transform, IdentityTransform):
        return array
    if isinstance(transform, VoidTransform):
        return pa.nulls(len(array), type=pa.int32())
    if pa.types.is_timestamp(array.type):
        naive = array.cast(pa.int64()).cast(pa.timestamp("us"))
    elif pa.types.is_date(array.type):
        naive = array.cast(pa.date32()).cast(pa.timestamp("us"))
    else:
        raise TypeError(f"transform {transform} needs a date or timestamp column, not {array.type}")
    if isinstance(transform, YearTransform):
        return pc.subtract(pc.year(naive), 1970).cast(pa.int32())
    if isinstance(transform, MonthTransform):
        months = pc.add(pc.multiply(pc.subtract(pc.year(naive), 1970), 12), pc.subtract(pc.month(naive), 1))
        return months.cast(pa.int32())
    unit, micros = ("day", _DAY_MICROS) if isinstance(transform, DayTransform) else ("hour", _HOUR_MICROS)
    floored = pc.floor_temporal(naive, unit=unit).cast(pa.int64())
    return pc.divide(floored, micros).cast(pa.int32())


def spark_value(transform: Transform[Any, Any], source_type: IcebergType, source: Column) -> Column:
    """A Spark expression for the Iceberg partition value of ``source``: the value itself for an
    identity transform, the days of a date and the microseconds of a timestamp (their Iceberg
    representation), the unit ordinal of a temporal one."""
    if isinstance(transform, IdentityTransform):
        if isinstance(source_type, DateType):
            return F.unix_date(source)
        if isinstance(source_type, TimestampType | TimestamptzType):
            return _micros(source_type, source)
        return source
    if isinstance(source_type, DateType):
        days = F.unix_date(source)
        date = source
    else:
        micros = _micros(source_type, source)
        if isinstance(transform, HourTransform):
            return _floor_div(micros, _HOUR_MICROS)
        days = _floor_div(micros, _DAY_MICROS)
        date = F.date_from_unix_date(days)
    if isinstance(transform, DayTransform):
        return days.cast("int")
    if isinstance(transform, MonthTransform):
        return ((F.year(date) - 1970) * 12 + F.month(date) - 1).cast("int")
    if isinstance(transform, YearTransform):
        return (F.year(date) - 1970).cast("int")
    raise TypeError(f"transform {transform} is not written by the epoch writer")  # pragma: no cover - refused


def spark_sort_keys(spec: PartitionSpec, write_schema: Schema, present: set[str]) -> list[Column]:
    """Spark expressions that group rows exactly as the partition transforms do, to shuffle and sort
    by before the pyarrow writer, which closes its file whenever the value changes; a transform
    whose source column is not in the input (all nulls) needs no key, nor does void."""
    keys = []
    for partition_field in spec.fields:
        name = write_schema.find_column_name(partition_field.source_id)
        if name is None or name.split(".")[0] not in present or isinstance(partition_field.transform, VoidTransform):
            continue
        column = F.col(".".join(quote(part) for part in name.split(".")))
        source_type = write_schema.find_field(partition_field.source_id).field_type
        keys.append(spark_value(partition_field.transform, source_type, column))
    return keys


def _micros(source_type: IcebergType, source: Column) -> Column:
    if isinstance(source_type, TimestamptzType):
        return F.unix_micros(source)
    # timestamp without zone: microseconds of its wall-clock time since 1970-01-01 00:00, which is
    # what Iceberg stores; no session time zone is involved.
    return F.timestamp_diff("MICROSECOND", F.lit("1970-01-01 00:00:00").cast("timestamp_ntz"), source)


def _floor_div(micros: Column, unit: int) -> Column:
    """Exact floor division of a 64-bit count: the difference is a multiple of ``unit``, and the
    quotient (below 2^31) survives the double division within far less than 0.5."""
    return F.round((micros - F.pmod(micros, F.lit(unit))) / F.lit(unit)).cast("int")


# What each Spark write task runs: Arrow batches in, Parquet files and their descriptors out.
#
# It runs inside ``DataFrame.mapInArrow`` on the executors, so the footer statistics are computed
# where the footer was just written (from the closed writer's metadata, no read-back) and only the
# small descriptors travel to the driver. A task's work is pure pyarrow and pyiceberg
# (``write_task``), which also lets tests drive it without a session.
#
# A file holds exactly one partition value. Rows arrive sorted by a Spark key that groups them the way
# the partition transform does, so a task usually closes each file once; if equal partition values were
# ever not adjacent, the result would be more files, never a file with two partition values.

#: The single column ``mapInArrow`` returns: one descriptor (compact JSON) per row.
DESCRIPTOR_COLUMN = "descriptor"
#: Batches are buffered to this many uncompressed bytes per row group: Spark hands over 10,000-row
#: batches, and one row group each would make files with weak compression and many footers entries.
ROW_GROUP_BYTES = 64 * 1024 * 1024


class ArrowFileWriter:
    """The pyarrow writer: rows handed to Python workers as Arrow, written there with pyarrow."""

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        frame = self._distribute(frame, write)
        rows = frame.mapInArrow(functools.partial(spark_task, write), f"{DESCRIPTOR_COLUMN} string").collect()
        return [DataFileDescriptor.model_validate_json(row[0]) for row in rows]

    def _distribute(self, frame: DataFrame, write: FileWrite) -> DataFrame:
        """A task closes its file whenever the partition value changes, so rows of one value must be
        adjacent."""
        keys = spark_sort_keys(write.spec, write.write_schema, set(frame.columns))
        if keys:
            # Hash-partition by the partition values: each value goes to one task, so it becomes one
            # file (or a few, past the target size) instead of one per input split.
            shuffle = frame.sparkSession.conf.get("spark.sql.shuffle.partitions")
            return frame.repartition(write.writers or int(shuffle or "200"), *keys).sortWithinPartitions(*keys)
        return frame.repartition(write.writers) if write.writers else frame


def write_task(config: FileWrite, batches: Iterator[pa.RecordBatch], task: str) -> Iterator[pa.RecordBatch]:
    """Write one task's rows; yield one single-row batch of descriptor JSON per closed file.

    A file is closed at the target size, in uncompressed bytes or in rows of Spark's size estimate
    (``rows_per_file``, as Spark's own writer counts), whichever comes first."""
    arrow_schema = schema_to_pyarrow(config.write_schema, include_field_ids=True)
    most_rows = rows_per_file(config.target_file_size, config.write_schema)
    writer: _RollingFile | None = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        conformed = _conform(batch, arrow_schema, config)
        for key, part in _split_by_partition(conformed, config):
            while part.num_rows:
                if writer is not None and (writer.key != key or writer.full or writer.rows >= most_rows):
                    yield _descriptor_batch(writer.close())
                    writer = None
                if writer is None:
                    writer = _RollingFile(config, arrow_schema, key, task)
                room = most_rows - writer.rows
                writer.add(part.slice(0, room))
                part = part.slice(room)
    if writer is not None:
        yield _descriptor_batch(writer.close())


def _descriptor_batch(descriptor_json: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({DESCRIPTOR_COLUMN: [descriptor_json]})


def _conform(batch: pa.RecordBatch, schema: pa.Schema, config: FileWrite) -> pa.RecordBatch:
    """The batch in the file's schema: field ids attached, absent optional columns as typed nulls."""
    for name in config.checked_required:
        column = batch.column(name)
        if column.null_count:
            raise RequiredColumnHasNulls(required_nulls_message(name, column.null_count))
    arrays = []
    names = set(batch.schema.names)
    for target in schema:
        if target.name in names:
            column = batch.column(target.name)
            arrays.append(column if column.type == target.type else column.cast(target.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, type=target.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _split_by_partition(
    batch: pa.RecordBatch, config: FileWrite
) -> Iterator[tuple[tuple[PartitionValue, ...], pa.RecordBatch]]:
    if not config.spec.fields:
        yield (), batch
        return
    columns: list[list[Any]] = []
    for partition_field in config.spec.fields:
        name = config.write_schema.find_column_name(partition_field.source_id)
        assert name is not None
        array = nested_column(batch, name)
        transformed = arrow_values(partition_field.transform, array)
        if _single_value(transformed):
            columns.append([transformed[0].as_py()])
        else:
            columns.append(transformed.to_pylist())
    if all(len(c) == 1 for c in columns):
        yield _partition_key(config, [c[0] for c in columns]), batch
        return
    width = batch.num_rows
    full = [c if len(c) == width else c * width for c in columns]
    rows = list(zip(*full, strict=True))
    start = 0
    for i in range(1, width + 1):
        if i == width or not _same(rows[i], rows[start]):
            yield _partition_key(config, list(rows[start])), batch.slice(start, i - start)
            start = i


def nested_column(batch: pa.RecordBatch | pa.Table, dotted: str) -> Any:
    """A column by its dotted name: struct fields are reached through their parents."""
    parts = dotted.split(".")
    array = batch.column(parts[0])
    if len(parts) > 1 and isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    for part in parts[1:]:
        array = array.field(part)
    return array


def _single_value(array: pa.Array) -> bool:
    if len(array) == 0:
        return True
    if array.null_count:
        return bool(array.null_count == len(array))
    first = array[0]
    if pa.types.is_floating(array.type):
        return False  # NaN compares unequal to itself: take the slow path that handles it
    return bool(pc.all(pc.equal(array, first)).as_py())


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(
        x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b, strict=True)
    )


def _partition_key(config: FileWrite, values: Sequence[Any]) -> tuple[PartitionValue, ...]:
    key: list[PartitionValue] = []
    for partition_field, value in zip(config.spec.fields, values, strict=True):
        if config.partition_style == "iceberg":
            key.append(partition_record_value(partition_field, value, config.write_schema))
        else:
            source = config.write_schema.find_field(partition_field.source_id).field_type
            key.append(_hive_value(source, value))
    return tuple(key)


def _hive_value(source: IcebergType, value: Any) -> PartitionValue:
    """The text Spark and Hive write for a partition directory, so readers get the value back."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(source, DateType) and isinstance(value, date):
        return value.isoformat()
    if isinstance(source, TimestampType | TimestamptzType) and isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".")
    return str(value)


class _RollingFile:
    """One open Parquet file for one partition value, with buffered row groups."""

    def __init__(self, config: FileWrite, schema: pa.Schema, key: tuple[PartitionValue, ...], task: str):
        self.config = config
        self.key = key
        self.task = task
        self.partition: dict[str, PartitionValue] = {f.name: v for f, v in zip(config.spec.fields, key, strict=True)}
        if not key:
            sub = ""
        elif config.partition_style == "iceberg":  # Iceberg's own human-readable path, as pyiceberg writes
            sub = config.spec.partition_to_path(Record(*key), config.write_schema)
        else:  # the file sink's committer derives final names with the same function
            sub = hive_partition_path(self.partition)
        name = f"{task}-{uuid.uuid4().hex[:12]}.parquet"
        self.path = f"{config.location}/{sub}/{name}" if sub else f"{config.location}/{name}"
        self._output = load_file_io(config.io_properties, self.path).new_output(self.path)
        self._stream = self._output.create(overwrite=False)
        try:
            self._writer = pq.ParquetWriter(
                self._stream,
                schema=schema,
                store_decimal_as_integer=True,
                **_get_parquet_writer_kwargs(config.table_properties),
            )
        except Exception:
            self._stream.close()
            raise
        self._buffer: list[pa.RecordBatch] = []
        self._buffered_bytes = 0
        self._buffered_rows = 0
        self._written_bytes = 0
        self.rows = 0

    @property
    def full(self) -> bool:
        return self._written_bytes + self._buffered_bytes >= self.config.target_file_size

    def add(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self.rows += batch.num_rows
        self._buffered_bytes += batch.nbytes
        self._buffered_rows += batch.num_rows
        if self._buffered_bytes >= ROW_GROUP_BYTES or self._buffered_rows >= self.config.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_batches(self._buffer)
        self._writer.write_table(table, row_group_size=self.config.row_group_rows)
        self._written_bytes += self._buffered_bytes
        self._buffer, self._buffered_bytes, self._buffered_rows = [], 0, 0

    def close(self) -> str:
        self._flush()
        with self._stream:
            self._writer.close()
        metadata = self._writer.writer.metadata
        descriptor = describe_parquet_file(
            self.path,
            table_schema=self.config.write_schema,
            partition=self.partition,
            writer=self.task,
            table_properties=self.config.table_properties,
            parquet_metadata=metadata,
            file_size_in_bytes=len(self._output),
        )
        return json.dumps(descriptor.model_dump(mode="json", exclude_defaults=True), separators=(",", ":"))


def spark_task(config: FileWrite, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: names the writer after the Spark partition and attempt, so a
    retried or speculative attempt never writes over the files of another."""
    context = TaskContext.get()
    task = f"{context.partitionId():05d}-{context.attemptNumber()}" if context is not None else "00000-0"
    yield from write_task(config, batches, task)


# An epoch's files written by Spark's own Parquet writer, described from their footers afterwards.
#
# The pyarrow writer (``ArrowFileWriter``) hands every row from the JVM to a Python worker as Arrow and
# back; Spark's writer keeps the rows in the JVM, which is what a plain ``df.write.parquet`` costs. It
# is used wherever it can give the files everything the pyarrow writer would:
#
# * **Field ids, not a name mapping.** Spark (3.3 and later) writes a column's Parquet field id from its
#   ``parquet.field.id`` metadata, for top-level columns and struct fields. Files that carry their ids
#   keep resolving after any rename or drop-and-re-add of a column, with any Iceberg reader, whatever
#   the table's name mapping says. Spark cannot give list elements and map keys and values an id,
#   and a file with ids on some fields only is read by id by Iceberg readers (the mapping is only for
#   files without any): a table with list or map columns keeps the pyarrow writer.
# * **Partition values as Iceberg has them.** Rows go to ``partitionBy`` directories of computed
#   columns holding the Iceberg partition value itself (the day ordinal for ``day(ts)``, the days or
#   microseconds of an identity date or timestamp), so each file holds one partition value and the
#   directory names it exactly. Strings get a one-character prefix because Spark writes the empty
#   string and null to the same directory.
# * **Spark's default commit protocol** (``FileOutputCommitter``, algorithm 1). Each task attempt
#   writes below ``_temporary``, the driver lets one attempt per task commit, and only the job commit
#   moves the committed tasks' files into the write location: a failed or speculative attempt never
#   adds rows, and listing the location after the job lists exactly the committed files. Algorithm 2
#   or a committer writing straight into the location would save renames, which on local disk and
#   HDFS are metadata operations (no gain the benchmark could see), and would make a task commit
#   that dies half way leave files the listing could not tell apart. Object stores, where renames
#   are copies, are written by the pyarrow writer anyway: pyspark has no connector for them.
# * **Rows as they come**, as a plain write takes them: each task sorts its rows by partition value
#   and writes one file per value it holds. Shuffling them by partition value first (fewer files)
#   is a full exchange of the rows; a table asks for it with ``write.distribution-mode`` ``hash`` or
#   ``range``, a job with ``writers``.
# * **Descriptors from the footers**, by ``describe_parquet_file`` as for the pyarrow writer's files,
#   after the job: one footer read per file, on the executors, or on the driver for a few files,
#   where a Spark job would cost more than the reads.

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
        # identity sources are the ones ``check_spec`` let through; a float's
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
