"""Copy-on-write of an upsert epoch (design.md, 'The Iceberg commit', step 7): the input read as changes, one per
key, with bad rows refused; the driver's plan of which files hold a changed key; and the executors'
tasks that find the hits and rewrite those files with the epoch's rows, staged by partition value.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, cast
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as st
from pyspark.sql.pandas.types import to_arrow_type

from airflow_provider_exactly_once.core.errors import InvalidChanges, InvalidSinkConfig, ReprocessRefused
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor
from airflow_provider_exactly_once.core.upserts import (
    ChangeCounts,
    RevisedWrite,
    RevisionBasis,
    RewrittenFile,
    UpsertSpec,
)
from airflow_provider_exactly_once.spark.file_io import is_object_store, spread
from airflow_provider_exactly_once.spark.writers import (
    DESCRIPTOR_COLUMN,
    FileWrite,
    arrow_values,
    nested_column,
    quote,
    write_task,
)
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark, spark_schema

# An upsert epoch's input as changes: operation and order read, bad rows refused, one change per key.
#
# Everything here refuses before a single file is written, naming the sink, the epoch, the table, the
# column and example rows, because a change set with a null key or an unknown operation cannot be
# applied "mostly": the table would hold a state no input ever described.

#: Columns the upsert adds to the change rows; never written.
OP, ORDER = "__eo_op", "__eo_order"
UPSERT, DELETE = "upsert", "delete"
#: Example rows an error shows.
EXAMPLES = 5


@dataclass(frozen=True)
class Owner:
    """Who the changes belong to, for every message."""

    sink_id: str
    epoch: int
    table: str

    def __str__(self) -> str:
        return f"sink {self.sink_id!r} epoch {self.epoch} table {self.table!r}"


def read_changes(frame: DataFrame, upsert: UpsertSpec, owner: Owner) -> DataFrame:
    """The input with ``OP`` and ``ORDER`` added (``one_change_per_key`` next, then ``row_columns``)."""
    present = set(frame.columns)
    missing = [name for name in upsert.key if name not in present]
    if missing:
        raise InvalidSinkConfig(
            f"{owner}: key column(s) {missing} are not in the epoch's input (columns: {sorted(present)}); "
            "every change row must carry the whole key"
        )
    for what, name in (("op_column", upsert.op_column), ("order_by", upsert.order_by)):
        if name is not None and name not in present:
            raise InvalidSinkConfig(
                f"{owner}: {what} {name!r} is not in the epoch's input (columns: {sorted(present)})"
            )
    if upsert.op_column is None:
        op: Column = F.lit(UPSERT)
    else:
        text = F.col(quote(upsert.op_column)).cast("string")
        op = (
            F.when(text.isin(list(upsert.delete_values)), F.lit(DELETE))
            .when(text.isin(list(upsert.upsert_values)), F.lit(UPSERT))
            .otherwise(F.lit(None))
        )
    order = F.col(quote(upsert.order_by)) if upsert.order_by is not None else F.lit(None)
    return frame.withColumn(OP, op).withColumn(ORDER, order)


def row_columns(changes: DataFrame, upsert: UpsertSpec, table_columns: set[str]) -> DataFrame:
    """The changes without the operation and order columns, unless the table has columns of those
    names (then they are data as well)."""
    dropped = [name for name in upsert.change_columns() if name not in table_columns]
    return changes.drop(*dropped) if dropped else changes


#: Columns the checks read, added per key in the pass that picks its last change: whether any of
#: the key's changes has an unknown operation, and how many share its last order value. Never written.
UNKNOWN_OP, TIED = "__eo_unknown_op", "__eo_tied"
CHECKED = (UNKNOWN_OP, TIED)


def one_change_per_key(changes: DataFrame, upsert: UpsertSpec) -> DataFrame:
    """One change per key: the only one, or the greatest by ``order_by``; with ``CHECKED``.

    The columns that find an unknown operation or a tie at the last change are windows over the
    partitioning of the pick itself, so the checks cost no pass of their own: ``refuse_faults``
    reads them, and the keys, from the rows the write brings to the driver anyway."""
    unknown = F.col(OP).isNull()
    if upsert.order_by is None:
        return changes.withColumn(UNKNOWN_OP, unknown).withColumn(TIED, F.lit(1))
    keys = [F.col(quote(k)) for k in upsert.key]
    last_first = Window.partitionBy(*keys).orderBy(F.col(ORDER).desc_nulls_last())
    return (
        changes.withColumn(UNKNOWN_OP, F.max(unknown).over(Window.partitionBy(*keys)))
        .withColumn(TIED, F.count(F.lit(1)).over(Window.partitionBy(*keys, F.col(ORDER))))
        .withColumn("__eo_rank", F.row_number().over(last_first))
        .where(F.col("__eo_rank") == 1)
        .drop("__eo_rank")
    )


def refuse_faults(changed: pa.Table, changes: DataFrame, upsert: UpsertSpec, owner: Owner) -> None:
    """Refuse null keys, unknown operations and (per the order rule) two changes of one key.

    ``changed``: the keys and ``CHECKED`` of ``one_change_per_key``'s rows, on the driver;
    ``changes``: the input (``read_changes``), queried for counts and examples only when there is
    a fault to show.
    """
    keys = [F.col(quote(k)) for k in upsert.key]
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | key.isNull()
    if any(changed.column(k).null_count for k in upsert.key):
        null_keys = changes.where(null_key).count()
        shown = [row.asDict() for row in changes.where(null_key).drop(OP, ORDER).limit(EXAMPLES).collect()]
        nulls = [k for k in upsert.key if changes.where(F.col(quote(k)).isNull()).limit(1).count()]
        raise InvalidChanges(
            f"{owner}: {null_keys} change row(s) have a null in key column(s) {nulls}, e.g. {shown}; "
            "a key identifies one row of the table and may not be null. Nothing was written."
        )
    if pc.any(changed.column(UNKNOWN_OP)).as_py():
        unknown_ops = changes.where(F.col(OP).isNull()).count()
        column = F.col(quote(str(upsert.op_column))).cast("string")
        unknown = changes.where(F.col(OP).isNull()).select(column).distinct().limit(EXAMPLES)
        values = [row[0] for row in unknown.collect()]
        raise InvalidChanges(
            f"{owner}: {unknown_ops} change row(s) have an operation in column {upsert.op_column!r} that is none of "
            f"{list(upsert.known_values)}: {values}; name the values with insert_values, update_values and "
            "delete_values. Nothing was written."
        )
    per_key = changes.groupBy(*keys).agg(F.count(F.lit(1)).alias("changes"), F.max(ORDER).alias("last"))
    if upsert.order_by is None:
        if changed.select(list(upsert.key)).group_by(list(upsert.key)).aggregate([]).num_rows == changed.num_rows:
            return  # one change per key
        repeated = per_key.where(F.col("changes") > 1)
        examples = [row.asDict() for row in repeated.limit(EXAMPLES).collect()]
        raise InvalidChanges(
            f"{owner}: {repeated.count()} key(s) change more than once in the epoch, e.g. {examples}; give the "
            "sink order_by (a column ordering the changes, greatest wins) or send one change per key. "
            "Nothing was written."
        )
    if (pc.max(changed.column(TIED)).as_py() or 0) <= 1:
        return  # no key has two changes at its last order value
    ties = (
        changes.join(per_key.where(F.col("changes") > 1), on=list(upsert.key))
        .where(F.col(ORDER).eqNullSafe(F.col("last")))
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("changes_at_last"))
        .where(F.col("changes_at_last") > 1)
    )
    examples = [row.asDict() for row in ties.limit(EXAMPLES).collect()]
    raise InvalidChanges(
        f"{owner}: {ties.count()} key(s) have two or more last changes with the same {upsert.order_by!r}, e.g. "
        f"{examples}; which one wins would depend on how Spark split the input. Nothing was written."
    )


# An upsert's rows to write, staged by partition value under the write location, for the rewrite's
# Python tasks to read (``RewriteWriter``).
#
# The rewrite writes each partition's upserted rows together with the file it rewrites there. Handing
# them over through Spark (a shuffle by that file, a sort, then Arrow into the tasks) cost more than
# the rewrite itself: at 1M upserted rows, 3 to 6 s of a 5 to 9 s job with no file work at all. Here
# one pass of Python tasks over the rows writes each task's rows of each partition value as a file
# (``_staging/`` in the write location, where a failed write's clean-up finds them too), and reports
# them to the driver, which hands each file's path to the task that needs it. Nothing is sorted or
# moved by the JVM; the reading task sorts its partition's rows by key, once. The files are Parquet,
# uncompressed and without statistics, rather than Arrow's own format: a table bucket (S3 Tables,
# SeaweedFS's) refuses objects of other kinds in a table's location.

#: Below the write location: removed with it when the write fails, and by ``remove`` when it succeeds.
STAGING = "_staging"
#: The changed keys' column: the change deletes its key.
DELETED = "__eo_deleted"


@dataclass(frozen=True)
class Staged:
    """One staged file: the partition value of its rows (``partition_key``), where it is, and how
    many rows it holds."""

    partition: str
    path: str
    rows: int


@dataclass(frozen=True)
class StagedChanges:
    """What the pass over an upsert's changes left: the keys, on the driver, and its files."""

    #: Every change's key, with ``DELETED`` and ``CHECKED``.
    changed: pa.Table
    #: The upserted rows' files.
    rows: list[Staged]
    #: The same keys as files, which the hits job's tasks read instead of getting them in their
    #: function (on Spark Connect, inside the plan sent to the server).
    key_files: list[str]


def stage_changes(changes: DataFrame, write: FileWrite, keys: Sequence[str]) -> StagedChanges:
    """The one pass over an upsert's changes (one change per key, aligned to the write schema, with
    ``OP`` and ``CHECKED``): the upserted rows staged, a file per task and partition value, and the
    keys with ``DELETED`` and ``CHECKED``, for the driver to plan the rewrite from and to refuse bad
    changes by (the staged files then go with the write location). One Spark job, no shuffle, no
    cache: each change row goes from the JVM to Python once. The keys come to the driver as staged
    files too: through the JVM, a million of them cost a second."""
    task = functools.partial(_stage_task, write, tuple(keys))
    found = changes.mapInArrow(task, "partition string, path string, rows long").collect()
    staged = [Staged(row[0], str(row[1]), int(row[2])) for row in found if row[0] is not None]
    key_files = [str(row[1]) for row in found if row[0] is None]
    changed = read_staged(write.io_properties, key_files)
    if changed is None:  # no change rows at all: a revision that only undoes the write it revises
        fields = [changes.schema[name] for name in (*keys, *CHECKED)]
        changed = pa.table({f.name: pa.array([], to_arrow_type(f.dataType, timezone="UTC")) for f in fields})
        changed = changed.add_column(len(keys), DELETED, pa.array([], pa.bool_()))
    return StagedChanges(changed, staged, key_files)


def read_staged(io_properties: Mapping[str, str], paths: Sequence[str]) -> pa.Table | None:
    """The rows of the staged files ``paths``, or ``None`` when there are none."""
    tables = []
    for path in paths:
        with load_file_io(dict(io_properties), path).new_input(path).open() as stream:
            tables.append(pq.read_table(pa.BufferReader(stream.read())))
    return pa.concat_tables(tables) if tables else None


def remove_staged(write: FileWrite, paths: Sequence[str]) -> None:
    """Delete staged files once what was written from them is described: a committed write's
    location holds its data files and its pre-commit, nothing else."""
    if not paths:
        return
    io = load_file_io(write.io_properties, write.location)
    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        list(pool.map(io.delete, paths))


def partition_key(write: FileWrite, values: Sequence[Any]) -> str:
    """A partition value as the write's files record it (``ArrowFileWriter``'s representation), as
    JSON: what a staged file and a file to rewrite are matched by."""
    from pyiceberg.partitioning import partition_record_value

    record = [partition_record_value(f, v, write.write_schema) for f, v in zip(write.spec.fields, values, strict=True)]
    return json.dumps(record, default=str)


def _stage_task(write: FileWrite, keys: tuple[str, ...], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each partition value's upserted rows to a file of their own, every change's key (with
    ``DELETED`` and ``CHECKED``) to the task's key file; one row per file written: its partition
    value (null for the key file), its path, its rows."""
    context = TaskContext.get()
    task = f"{context.partitionId():05d}-{context.attemptNumber()}" if context is not None else "00000-0"
    files: dict[str | None, _StagedFile] = {}
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            op = batch.column(OP)
            changed = pa.RecordBatch.from_arrays(
                [*[batch.column(k) for k in keys], pc.equal(op, DELETE), *[batch.column(c) for c in CHECKED]],
                names=[*keys, DELETED, *CHECKED],
            )
            parts: list[tuple[str | None, pa.RecordBatch]] = [(None, changed)]
            upserted = batch.filter(pc.fill_null(pc.equal(op, UPSERT), False))
            parts += _by_partition(upserted.select([n for n in batch.schema.names if n not in (OP, *CHECKED)]), write)
            for partition, part in parts:
                if partition not in files:
                    files[partition] = _StagedFile(write, task, part.schema)
                files[partition].add(part)
    finally:
        for staged in files.values():
            staged.close()
    if files:
        partitions = list(files)
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array(partitions, pa.string()),
                "path": [files[p].path for p in partitions],
                "rows": pa.array([files[p].rows for p in partitions], pa.int64()),
            }
        )


class _StagedFile:
    """An open staged file: Parquet, uncompressed, no statistics (read once, by one task)."""

    def __init__(self, write: FileWrite, task: str, schema: pa.Schema) -> None:
        self.path = f"{write.location}/{STAGING}/{task}-{uuid.uuid4().hex[:12]}.parquet"
        self._stream = load_file_io(write.io_properties, self.path).new_output(self.path).create(overwrite=False)
        self._writer = pq.ParquetWriter(self._stream, schema, compression="none", write_statistics=False)
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        with self._stream:
            self._writer.close()


def _by_partition(batch: pa.RecordBatch, write: FileWrite) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows by partition value (``partition_key``), each value's rows together."""
    if not batch.num_rows:
        return
    if not write.spec.fields:
        yield "[]", batch
        return
    values = [
        arrow_values(f.transform, nested_column(batch, str(write.write_schema.find_column_name(f.source_id))))
        for f in write.spec.fields
    ]
    keyed = pa.table({f"p{i}": v for i, v in enumerate(values)})
    distinct = keyed.group_by(keyed.column_names, use_threads=False).aggregate([])
    if distinct.num_rows == 1:
        yield partition_key(write, list(distinct.to_pylist()[0].values())), batch
        return
    order = pc.sort_indices(keyed, [(name, "ascending") for name in keyed.column_names])
    ordered_keys, ordered = keyed.take(order), batch.take(order)
    count = ordered.num_rows
    starts = np.zeros(count, dtype=bool)
    starts[0] = True
    for column in ordered_keys.columns:
        later, earlier = column.slice(1), column.slice(0, count - 1)
        differs = pc.coalesce(pc.not_equal(later, earlier), pc.xor(pc.is_null(later), pc.is_null(earlier)))
        starts[1:] |= differs.to_numpy(zero_copy_only=False)
    bounds = [*np.flatnonzero(starts).tolist(), count]
    for start, end in itertools.pairwise(bounds):
        values = [column[start].as_py() for column in ordered_keys.columns]
        yield partition_key(write, values), ordered.slice(start, end - start)


# Copy-on-write of an upsert epoch: the executors' half (``upsert`` plans it on the driver).
#
# A table's rows never pass through Python twice. Two Spark jobs:
#
# 1. ``find_hits``: the candidate files' key columns are read by Spark's own Parquet reader, by
#    field id (``read_by_id``), each row with its file and its position in it (``_metadata``), and
#    joined in the JVM with the epoch's changed keys (read from the files the pass over the changes
#    staged them in): the positions of the rows a change hits, and whether the change deletes. Files
#    on an object store, which pyspark has no connector for (``file_io``), are read by Python tasks
#    with pyiceberg's reader instead (``_hits_task``). A position is the row's place in the file,
#    which is also where pyiceberg's reader yields it in the rewrite (the files carry no delete
#    files: ``upsert`` refuses those).
# 2. ``RewriteWriter``: the upserted rows are staged by partition value (``stage_changes``: one pass
#    of Python tasks, nothing shuffled), then one job of Python tasks writes the units: each file to
#    rewrite streams its rows without the hit positions, then the staged rows of its partition (it
#    is the smallest file there) sorted by key, through the append's own ``writers.write_task``:
#    a file per partition value, rolled at the target size, described from the footers it wrote. The
#    staged rows of a partition without such a file are new files, written by one task in key order.
#    Its files are read with pyiceberg's reader in the task that writes them: read by Spark, every
#    row of a rewritten file would cross from the JVM into that Python task as well.
#
# An update that moves its key to another partition is written in that partition's group and
# removed from its old file by position: the layout is a choice, never a condition of correctness.

#: A file row's position in the file, as pyiceberg's reader yields the rows.
ROW = "__eo_row"
#: Rows a task of the rewrite job reads and writes, about a second of its work: a Python task's
#: fixed cost (its function, its reader) is then small beside it, and a rewrite of twenty small
#: files is not twenty tasks.
ROWS_PER_TASK = 1_000_000


@dataclass(frozen=True)
class Hits:
    """The rows of one file the epoch's changes hit: positions, ascending, and which are deletes."""

    rows: np.ndarray[Any, np.dtype[np.int64]]
    deleted: np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True)
class TableFiles:
    """Data files of one table, as the tasks read them, and the positions of each that go."""

    metadata_json: str
    io_properties: dict[str, str]
    files: dict[str, DataFile]
    removed: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = field(default_factory=dict)

    def native(self) -> bool:
        """Whether Spark's own Parquet reader reaches every file: none is on an object store, which
        pyspark has no connector for (``file_io``)."""
        return not any(is_object_store(p) for p in self.files)

    def only(self, paths: Sequence[str], removed: dict[str, np.ndarray[Any, np.dtype[np.int64]]]) -> TableFiles:
        return replace(self, files={p: self.files[p] for p in paths}, removed=removed)

    def scan(self, columns: Sequence[str] | None = None) -> ArrowScan:
        """pyiceberg's reader at the table's current schema (or the named columns of it)."""
        metadata = TableMetadataUtil.parse_raw(self.metadata_json)
        io = load_file_io({**metadata.properties, **self.io_properties}, metadata.location)
        schema = metadata.schema() if columns is None else metadata.schema().select(*columns)
        return ArrowScan(metadata, io, schema, AlwaysTrue())

    def kept(self, path: str) -> Iterator[pa.RecordBatch]:
        """The file's rows without the removed positions, streamed in the file's order."""
        removed = self.removed.get(path, np.empty(0, np.int64))
        offset = 0
        for batch in self.scan().to_record_batches([FileScanTask(self.files[path])]):
            count = batch.num_rows
            lo, hi = np.searchsorted(removed, [offset, offset + count])
            if hi > lo:
                mask = np.ones(count, dtype=bool)
                mask[removed[lo:hi] - offset] = False
                batch = batch.filter(pa.array(mask))
            offset += count
            if batch.num_rows:
                yield batch


#: Spark's Parquet reader resolving columns by field id (Spark 3.3 and later) as every Iceberg reader
#: does: a renamed column is found under its new name, a dropped one is not read, one added after a
#: file was written reads as null there. A file without any field id (imported by ``add_files``,
#: which the table's name mapping resolves) fails the read rather than reading as nulls.
FIELD_ID_READ = {
    "spark.sql.parquet.fieldId.read.enabled": "true",
    "spark.sql.parquet.fieldId.read.ignoreMissing": "false",
}


def read_by_id(spark: SparkSession, schema: Schema, paths: Sequence[str]) -> DataFrame:
    """Iceberg data files (without delete files) read by Spark's Parquet reader at ``schema``, each
    column by its field id (``type_mapping.spark_schema``; a timestamp without zone as
    ``TIMESTAMP_NTZ``); identity partition values are in the files. ``FIELD_ID_READ`` is set on
    the session and left there: the frame is lazy, and is read when a later action runs; it changes
    nothing for read schemas without ids."""
    for key, value in FIELD_ID_READ.items():
        spark.conf.set(key, value)
    return spark.read.schema(spark_schema(schema)).parquet(*paths)


def file_key(path: str) -> str:
    """A file's path as Spark's ``_metadata.file_path`` and an Iceberg manifest both come to it:
    Spark reports ``file:/a%20b`` for ``file:///a b`` and ``/a b``."""
    path = unquote(path)
    if path.startswith("file:"):
        path = "/" + path[len("file:") :].lstrip("/")
    return path


def find_hits(spark: SparkSession, files: TableFiles, key_files: Sequence[str], keys: Sequence[str]) -> dict[str, Hits]:
    """Per file of ``files`` that holds a changed key: the rows hit. ``key_files``: the staged keys
    and ``DELETED``, one row per key (``StagedChanges``)."""
    paths = sorted(files.files)
    if not paths:
        return {}
    if files.native() and not any(is_object_store(p) for p in key_files):
        found = _native_hits(spark, files, key_files, keys)
    else:
        task = functools.partial(_hits_task, files, tuple(key_files), tuple(keys), {p: i for i, p in enumerate(paths)})
        found = spread(spark, paths, "path").mapInArrow(task, f"file int, `{ROW}` long, `{DELETED}` boolean").toArrow()
    if not found.num_rows:
        return {}
    found = found.sort_by([("file", "ascending"), (ROW, "ascending")])
    file_index = found.column("file").to_numpy()
    rows = found.column(ROW).to_numpy()
    deleted = found.column(DELETED).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, file_index[1:] != file_index[:-1]])
    ends = np.r_[starts[1:], len(file_index)]
    return {paths[int(file_index[a])]: Hits(rows[a:b], deleted[a:b]) for a, b in zip(starts, ends, strict=True)}


def _native_hits(spark: SparkSession, files: TableFiles, key_files: Sequence[str], keys: Sequence[str]) -> pa.Table:
    """``find_hits``'s rows (file index, position, ``DELETED``) from one Spark job: the files' key
    columns by field id, each row's file and position from ``_metadata``, joined with the staged
    keys (a broadcast join where the keys are few, as Spark's statistics of the staged files tell)."""
    paths = sorted(files.files)
    schema = TableMetadataUtil.parse_raw(files.metadata_json).schema().select(*keys)
    read = read_by_id(spark, schema, paths).select(
        *[quote(k) for k in keys], F.col("_metadata.file_path").alias("file"), F.col("_metadata.row_index").alias(ROW)
    )
    types = {f.name: f.dataType for f in read.schema.fields}
    changed = spark.read.parquet(*key_files).select(
        *[F.col(quote(k)).cast(types[k]).alias(k) for k in keys], quote(DELETED)
    )
    found = read.join(changed, on=list(keys), how="inner").select("file", ROW, DELETED).toArrow()
    index = {file_key(p): i for i, p in enumerate(paths)}
    numbers = [index[file_key(p)] for p in found.column("file").to_pylist()]
    return found.set_column(0, "file", pa.array(numbers, pa.int32()))


def _hits_task(
    files: TableFiles,
    key_files: tuple[str, ...],
    keys: tuple[str, ...],
    index: dict[str, int],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    changed = read_staged(files.io_properties, key_files)
    if changed is None:
        return
    scan = files.scan(keys)
    fitted: dict[tuple[pa.DataType, ...], pa.Table] = {}
    for batch in batches:
        for path in batch.column("path").to_pylist():
            read = scan.to_table([FileScanTask(files.files[path])])
            rows, deleted = _match(read, changed, keys, fitted)
            number = pa.array(np.full(len(rows), index[path], dtype=np.int32))
            yield pa.RecordBatch.from_arrays([number, rows, deleted], names=["file", ROW, DELETED])


def _match(
    read: pa.Table, changed: pa.Table, keys: tuple[str, ...], fitted: dict[tuple[pa.DataType, ...], pa.Table]
) -> tuple[pa.Array, pa.Array]:
    """Positions in ``read`` whose key is changed, and whether the change deletes. The changed keys
    are cast to the file's types once per task and cut to the file's range of the first key column."""
    nothing = (pa.array([], pa.int64()), pa.array([], pa.bool_()))
    first = read.column(keys[0])
    bounds = pc.min_max(first)
    if not read.num_rows or bounds["min"].as_py() is None:
        return nothing
    types = tuple(read.column(k).type for k in keys)
    if types not in fitted:
        fitted[types] = pa.table(
            {**{k: changed.column(k).cast(t) for k, t in zip(keys, types, strict=True)}, DELETED: changed[DELETED]}
        )
    candidates = fitted[types]
    near = pc.and_(
        pc.greater_equal(candidates.column(keys[0]), bounds["min"]),
        pc.less_equal(candidates.column(keys[0]), bounds["max"]),
    )
    candidates = candidates.filter(near)
    if not candidates.num_rows:
        return nothing
    left = read.select(list(keys)).append_column(ROW, pa.array(np.arange(read.num_rows, dtype=np.int64)))
    joined = left.join(candidates, keys=list(keys), join_type="inner")
    return joined.column(ROW).combine_chunks(), joined.column(DELETED).combine_chunks()


#: The column of the rewrite job's units (``_Unit`` as JSON).
UNIT = "__eo_unit"


@dataclass(frozen=True)
class _Unit:
    """One piece of the rewrite job: a file to rewrite with the staged rows of its partition, or
    (``file`` None) a partition's staged rows that no rewritten file takes, as new files."""

    file: str | None
    staged: tuple[str, ...]
    #: About how many rows it reads and writes: what the job's tasks are counted from.
    rows: int


@dataclass(frozen=True)
class RewriteWriter:
    """The writer of an upsert: one job of Python tasks writing the units (``_units``) from the
    rows staged in the pass over the changes (``stage_changes``), not from ``frame``."""

    files: TableFiles
    key: tuple[str, ...]
    staged: tuple[Staged, ...]

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        units = _units(self.files, write, self.staged)
        described: list[Any] = []
        if units:
            rows = sum(u.rows for u in units)
            tasks = write.writers or min(len(units), max(2, math.ceil(rows / ROWS_PER_TASK)))
            values = [json.dumps([u.file, list(u.staged), u.rows]) for u in units]
            task = functools.partial(_units_task, self.files, write, self.key)
            spread_units = spread(frame.sparkSession, values, UNIT, tasks)
            described = spread_units.mapInArrow(task, f"{DESCRIPTOR_COLUMN} string").collect()
        remove_staged(write, [s.path for s in self.staged])
        return [DataFileDescriptor.model_validate_json(row[0]) for row in described]


def _units(files: TableFiles, write: FileWrite, staged: Sequence[Staged]) -> list[_Unit]:
    """Every file to rewrite is a unit, the smallest of each partition value with that partition's
    staged rows; the staged rows of a partition without one are a unit of new files, sorted by key
    in one task, so that each file it rolls holds a narrow key range for later epochs' plans."""
    by_partition: dict[str, list[Staged]] = {}
    for s in staged:
        by_partition.setdefault(s.partition, []).append(s)
    groups = _groups_by_partition(files, write)
    units = []
    for path in sorted(files.files):
        taken = by_partition.pop(key, []) if (key := groups.get(path)) is not None else []
        rows = int(files.files[path].record_count) + sum(s.rows for s in taken)
        units.append(_Unit(path, tuple(s.path for s in taken), rows))
    for partition in sorted(by_partition):
        left = by_partition[partition]
        units.append(_Unit(None, tuple(s.path for s in left), sum(s.rows for s in left)))
    return units


def _groups_by_partition(files: TableFiles, write: FileWrite) -> dict[str, str]:
    """The smallest file being rewritten in each partition value of the write's spec, by path:
    its partition's staged rows go into it (``partition_key``)."""
    smallest: dict[str, str] = {}
    width = len(write.spec.fields)
    for path, data_file in sorted(files.files.items(), key=lambda item: (-item[1].record_count, item[0])):
        if data_file.spec_id == write.spec.spec_id:
            smallest[partition_key(write, [data_file.partition[i] for i in range(width)])] = path
    return {path: key for key, path in smallest.items()}


def _units_task(
    files: TableFiles, write: FileWrite, key: tuple[str, ...], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    context = TaskContext.get()
    task = f"{context.partitionId():05d}-{context.attemptNumber()}" if context is not None else "00000-0"
    for batch in batches:
        for value in batch.column(UNIT).to_pylist():
            path, staged, _ = json.loads(value)
            yield from write_task(write, _unit_rows(files, write, key, path, staged), task)


def _unit_rows(
    files: TableFiles, write: FileWrite, key: tuple[str, ...], path: str | None, staged: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """The file's kept rows (when the unit is a file), then the staged rows, by partition and key."""
    if path is not None:
        kept = files.kept(path)
        if files.files[path].spec_id != write.spec.spec_id:  # rows of several partitions now: sort them
            read = list(kept)
            kept = iter(_sorted(pa.Table.from_batches(read), write, ()).to_batches() if read else ())
        yield from kept
    added = read_staged(write.io_properties, staged)
    if added is not None and added.num_rows:
        yield from _sorted(added, write, key).to_batches()


def _sorted(table: pa.Table, write: FileWrite, key: tuple[str, ...]) -> pa.Table:
    """Rows by partition value, then key: a file per partition value, each a narrow key range."""
    if not table.num_rows:
        return table
    order = []
    for i, partition_field in enumerate(write.spec.fields):
        source = write.write_schema.find_column_name(partition_field.source_id)
        if source is None or source.split(".")[0] not in table.column_names:
            continue
        table = table.append_column(f"__eo_p{i}", arrow_values(partition_field.transform, nested_column(table, source)))
        order.append((f"__eo_p{i}", "ascending"))
    order += [(k, "ascending") for k in key if k in table.column_names]
    if not order:
        return table
    ordered = table.sort_by(order)
    return ordered.drop_columns([name for name, _ in order if name.startswith("__eo_p")])


# Copy-on-write of an upsert epoch (design.md, 'The Iceberg commit', step 7): the driver's half.
#
# pyiceberg 0.12 can neither write nor read delete files, so an epoch of changes is applied by
# rewriting the data files that hold its keys. The table's rows never pass through the JVM: each file
# is read, filtered and written again by one Python task, as a single-process rewrite of the touched
# files would do it, only spread over the executors (``RewriteWriter``); only their key columns are
# read by Spark, to find the rows a change hits (``find_hits``):
#
# 1. one pass of Python tasks over the changes (``stage_changes``) stages the upserted
#    rows by partition value in the write location, and brings the changed keys and their operations
#    to the driver as Arrow, which gives the key range, the upsert and delete totals and, where the
#    keys are few, the values to plan with;
# 2. the driver plans the table's live data files on the sink's branch that can hold any of the
#    epoch's keys: pyiceberg's scan planning with a filter on the key columns (the key values
#    themselves when they are few, their range otherwise) prunes by partition and by column
#    statistics. The partition of a changed row is deliberately not used: an update may move a key
#    to another partition, and its old row must still be found;
# 3. one Spark job reads the key columns of those files (Spark's Parquet reader, by field id, so that
#    renamed, dropped and added columns resolve as any Iceberg reader resolves them) and joins them
#    with the changed keys, returning per file the positions of the rows a change hits: the files
#    that really hold a changed key, and every count the commit reports, are known before anything
#    is written;
# 4. the write (``RewriteWriter``) rewrites each of those files without those rows,
#    together with the epoch's staged rows of the same partition, and writes the rest of the staged
#    rows as new files, by the target file size;
# 5. the pre-commit names the rewritten files, the snapshot they were read from and the epoch's key
#    range: the commit removes exactly those files in the snapshot that adds the new ones, and
#    refuses when the table moved in a way that could hide a key from this write (``UpsertConflict``).
#
# A revision of a committed epoch (``core.decisions``) does the same at the table as it was
# before the write it revises, and rewrites that write's rewritten files as well, even where no key of
# this epoch is in them: their rows there are what undoes the revised write's other changes.

#: Up to this many distinct values of a key column are planned with ``In``; past it, with the range.
IN_LIMIT = 1000
#: Key column types the epoch's key range can be recorded for (Iceberg identifier fields are
#: primitives, never floating; these are the ones a copy-on-write plan can bound).
KEY_TYPES = (IntegerType, LongType, StringType, DateType, TimestampType, TimestamptzType)


@dataclass(frozen=True)
class Rewrite:
    """What copy-on-write planned for one table: the rows to write, the files to rewrite and the
    rows of each that go, and what the commit needs."""

    #: The epoch's inserted and updated rows, in the table's columns as written, staged by
    #: partition value (``stage_changes``).
    staged: tuple[Staged, ...]
    #: The files to rewrite, where to read them and which of their rows the epoch replaces.
    files: TableFiles
    rewritten: list[RewrittenFile]
    read_snapshot_id: int | None
    key_lower_bounds: dict[str, str]
    key_upper_bounds: dict[str, str]
    changes: ChangeCounts
    key: tuple[str, ...]
    #: A revision's: the committed write it replaces (``core.decisions``).
    revises: RevisedWrite | None = None


def check_key(table: Table, upsert: UpsertSpec, owner: Owner) -> None:
    """The key against the table: its columns exist with a type the plan can bound, and the
    table's identifier fields, when it has any, are exactly the key."""
    schema = table.schema()
    faults = []
    for name in upsert.key:
        try:
            field = schema.find_field(name)
        except ValueError:
            faults.append(f"key column {name!r} is not in the table")
            continue
        if not isinstance(field.field_type, KEY_TYPES):
            faults.append(
                f"key column {name!r} has type {field.field_type}; keys may be int, long, string, date or timestamp"
            )
    identifiers = schema.identifier_field_names()
    if identifiers and identifiers != set(upsert.key):
        faults.append(f"the table's identifier fields are {sorted(identifiers)}, the sink's key is {list(upsert.key)}")
    if faults:
        raise InvalidSinkConfig(f"{owner}: cannot upsert by key: {'; '.join(faults)}. Nothing was written.")


def copy_on_write(
    spark: SparkSession,
    table: Table,
    branch: str,
    upsert: UpsertSpec,
    changes: DataFrame,
    owner: Owner,
    write: FileWrite,
    refuse: Callable[[pa.Table], None],
    revision: RevisionBasis | None = None,
) -> Rewrite:
    """``changes``: one change per key (``one_change_per_key``), the table's columns (as
    written) plus ``OP`` and ``CHECKED``; the result's rows are in the table's columns. ``refuse``
    sees the changed keys and ``CHECKED`` first (``refuse_faults``): the one pass over the
    changes that brings them to the driver is also the one that checks them.

    A ``revision`` is planned at the table as it was before the write it revises, and rewrites that
    write's rewritten files too, from their rows there: keys it changed and this epoch does not get
    their earlier rows back (``core.decisions``).
    """
    columns = [c for c in changes.columns if c not in (OP, ORDER, *CHECKED)]
    keys = list(upsert.key)
    staged = stage_changes(changes.select(*[quote(c) for c in columns], OP, *CHECKED), write, keys)
    changed = staged.changed
    refuse(changed)  # what it staged goes with the write location
    read_id = _planned_at(table, branch, revision, owner)
    lower, upper, key_filter = _key_range(table, changed, keys)
    tasks: list[FileScanTask] = []
    if read_id is not None and lower:
        tasks = list(table.scan(row_filter=key_filter, snapshot_id=read_id).plan_files())
    if revision is not None:
        tasks += _revised_files(table, read_id, revision, tasks, owner)
    with_deletes = [t.file.file_path for t in tasks if t.delete_files]
    if with_deletes:
        raise InvalidSinkConfig(
            f"{owner}: {len(with_deletes)} data file(s) holding the epoch's keys have delete files (merge-on-read "
            f"writes by another engine), e.g. {with_deletes[0]}; copy-on-write cannot rewrite them. Rewrite the "
            "table's delete files first (Spark: CALL system.rewrite_position_delete_files / rewrite_data_files)."
        )
    candidates = TableFiles(
        table.metadata.model_dump_json(), write.io_properties, {t.file.file_path: t.file for t in tasks}
    )
    hits = find_hits(spark, candidates, staged.key_files, keys) if changed.num_rows else {}
    remove_staged(write, staged.key_files)
    touched = sorted(set(hits) | set(revision.rewritten if revision else ()))
    updated = sum(int((~hit.deleted).sum()) for hit in hits.values())
    deleted = sum(int(hit.deleted.sum()) for hit in hits.values())
    deletes = int(pc.sum(changed.column(DELETED)).as_py() or 0)
    rewritten = [RewrittenFile(path=p, record_count=int(candidates.files[p].record_count)) for p in touched]
    change_counts = ChangeCounts(
        inserted=max(changed.num_rows - deletes - updated, 0),
        updated=updated,
        deleted=deleted,
        deletes_of_absent_keys=max(deletes - deleted, 0),
        rows_rewritten=max(sum(f.record_count for f in rewritten) - updated - deleted, 0),
    )
    files = candidates.only(touched, {path: hit.rows for path, hit in hits.items()})
    return Rewrite(
        staged=tuple(staged.rows),
        files=files,
        rewritten=rewritten,
        read_snapshot_id=read_id,
        key_lower_bounds=lower,
        key_upper_bounds=upper,
        changes=change_counts,
        key=tuple(keys),
        revises=None if revision is None else revision.revised(),
    )


def _planned_at(table: Table, branch: str, revision: RevisionBasis | None, owner: Owner) -> int | None:
    """The snapshot the write reads: the branch head, or for a revision the table before the write
    it revises (``None``: no snapshot, an empty table)."""
    metadata = table.metadata
    if revision is None:
        head = metadata.snapshot_by_name(branch)
        return None if head is None else head.snapshot_id
    refused = f"{owner}: cannot revise write {revision.write_id}"
    base = revision.snapshot_id
    if revision.parent_of is not None:
        committed = metadata.snapshot_by_id(revision.parent_of)
        if committed is None:
            raise ReprocessRefused(
                f"{refused}: snapshot {revision.parent_of}, which committed it, is no longer in the table (expired, "
                "or the table was re-created), so the table as it was before it is unknown. Nothing was written; "
                "correct the epoch with a new epoch's changes"
            )
        base = committed.parent_snapshot_id
    if base is not None and metadata.snapshot_by_id(base) is None:
        raise ReprocessRefused(
            f"{refused}: snapshot {base}, the table as it was before that write, has expired, so the rows the write "
            "changed can no longer be read as they were. Nothing was written; correct the epoch with a new epoch's "
            "changes"
        )
    return base


def _revised_files(
    table: Table, read_id: int | None, revision: RevisionBasis, planned: list[FileScanTask], owner: Owner
) -> list[FileScanTask]:
    """The files the revised write rewrote that ``planned`` lacks, as snapshot ``read_id`` holds them.

    They hold that write's keys, so a plan filtered by its key range finds them without reading
    every manifest of the table.
    """
    wanted = set(revision.rewritten) - {t.file.file_path for t in planned}
    if not wanted:
        return []
    found: list[FileScanTask] = []
    if read_id is not None:
        in_range = _range_filter(table, revision.key_lower_bounds, revision.key_upper_bounds)
        found = [
            t for t in table.scan(row_filter=in_range, snapshot_id=read_id).plan_files() if t.file.file_path in wanted
        ]
    missing = sorted(wanted - {t.file.file_path for t in found})
    if missing:
        raise ReprocessRefused(
            f"{owner}: cannot revise write {revision.write_id}: {len(missing)} file(s) it rewrote are not in snapshot "
            f"{read_id}, the table as it was before it, e.g. {missing[0]}. Nothing was written"
        )
    return found


def _range_filter(table: Table, lower: dict[str, str], upper: dict[str, str]) -> BooleanExpression:
    """Rows whose key lies in the recorded range, in every key column (values as ``_key_range`` gives them)."""
    schema = table.schema()
    expression: BooleanExpression = AlwaysTrue()
    for key, encoded in lower.items():
        field_type = cast(PrimitiveType, schema.find_field(key).field_type)
        lo = from_bytes(field_type, base64.b64decode(encoded))
        hi = from_bytes(field_type, base64.b64decode(upper[key]))
        term = And(GreaterThanOrEqual(term=key, value=lo), LessThanOrEqual(term=key, value=hi))
        expression = term if isinstance(expression, AlwaysTrue) else And(expression, term)
    return expression


def no_changes(spark: SparkSession, schema: Schema, upsert: UpsertSpec, owner: Owner) -> DataFrame:
    """The change rows of a revision whose epoch has no input: none, in the table's columns and the
    change columns, so that the revision still rewrites the revised write's files and undoes it."""
    fields = []
    for column in schema.fields:
        spark_type = iceberg_to_spark(column.field_type)
        if spark_type is None:
            raise InvalidSinkConfig(f"{owner}: column {column.name!r} ({column.field_type}) has no Spark type")
        fields.append(st.StructField(column.name, spark_type, True))
    names = {f.name for f in fields}
    fields += [st.StructField(name, st.StringType(), True) for name in upsert.change_columns() if name not in names]
    return spark.createDataFrame([], st.StructType(fields))


def _key_range(
    table: Table, changed: pa.Table, keys: Sequence[str]
) -> tuple[dict[str, str], dict[str, str], BooleanExpression]:
    """Per key column: its lower and upper bound over the epoch's changes (deletes included), in
    Iceberg's single-value serialisation, and the filter that plans the files that can hold them:
    the values themselves where they are few, else the range."""
    if not changed.num_rows:
        return {}, {}, AlwaysTrue()
    schema = table.schema()
    lower: dict[str, str] = {}
    upper: dict[str, str] = {}
    expression: BooleanExpression = AlwaysTrue()
    for key in keys:
        field_type = cast(PrimitiveType, schema.find_field(key).field_type)  # KEY_TYPES, checked
        values = _literal_values(changed.column(key))
        bounds = pc.min_max(values)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        lower[key] = base64.b64encode(to_bytes(field_type, lo)).decode("ascii")
        upper[key] = base64.b64encode(to_bytes(field_type, hi)).decode("ascii")
        distinct = pc.unique(values)
        if len(distinct) <= IN_LIMIT:
            term: BooleanExpression = In(term=key, literals=sorted(distinct.to_pylist()))
        else:
            term = And(GreaterThanOrEqual(term=key, value=lo), LessThanOrEqual(term=key, value=hi))
        expression = term if isinstance(expression, AlwaysTrue) else And(expression, term)
    return lower, upper, expression


def _literal_values(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A key column as Iceberg's literal values: dates as days, timestamps as microseconds (of the
    instant for a zoned timestamp, of the wall clock for a local one, as Iceberg stores them)."""
    if pa.types.is_date(column.type):
        return column.cast(pa.date32()).cast(pa.int32())
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    return column
