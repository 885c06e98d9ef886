"""What each Spark write task runs: Arrow batches in, Parquet files and their descriptors out.

It runs inside ``DataFrame.mapInArrow`` on the executors, so the footer statistics are computed
where the footer was just written (from the closed writer's metadata, no read-back) and only the
small descriptors travel to the driver. A task's work is pure pyarrow and pyiceberg
(``write_task``), which also lets tests drive it without a session.

A file holds exactly one partition value. Rows arrive sorted by a Spark key that groups them the way
the partition transform does, so a task usually closes each file once; if equal partition values were
ever not adjacent, the result would be more files, never a file with two partition values.
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow
from pyiceberg.partitioning import partition_record_value
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, IcebergType, TimestampType, TimestamptzType
from pyspark import TaskContext

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue
from airflow_provider_exactly_once.sinks.files import partition_path as hive_partition_path
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.spark.partition_transforms import arrow_values, spark_sort_keys
from airflow_provider_exactly_once.spark.writer_protocol import (
    FileWrite,
    RequiredColumnHasNulls,
    required_nulls_message,
    rows_per_file,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
