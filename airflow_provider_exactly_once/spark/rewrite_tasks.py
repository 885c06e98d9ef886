"""Copy-on-write of an upsert epoch: the executors' half (``upsert`` plans it on the driver).

A table's rows never pass through the JVM. Two Spark jobs, each a set of Python tasks:

1. ``find_hits``: per candidate file, its key columns only are read and joined with the epoch's
   changed keys (in Arrow, with the task's function): the positions of the rows a change hits, and
   whether the change deletes. Positions are those of pyiceberg's reader over the whole file, the
   same in both jobs (the files carry no delete files: ``upsert`` refuses those).
2. ``RewriteWriter``: every upserted row is tagged with the file to rewrite in its partition when
   there is one (the smallest), by a broadcast join on partition values in Spark; a marker row
   per file to rewrite makes sure every such file gets its group. Grouped by that tag, each group's task streams the file's rows without the hit
   positions, then its upserted rows sorted by partition and key, through the append's own
   ``file_writer.write_task``: a file per partition value, rolled at the target size, described
   from the footers it wrote. The rows of partitions without such a file are new files, spread by
   range of partition and key over as many tasks as files of the target size they fill.

An update that moves its key to another partition is written in that partition's group and
removed from its old file by position: the layout is a choice, never a condition of correctness.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.transforms import VoidTransform
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue
from airflow_provider_exactly_once.spark.changes import quote
from airflow_provider_exactly_once.spark.file_writer import (
    DESCRIPTOR_COLUMN,
    nested_column,
    spark_task,
    write_task,
)
from airflow_provider_exactly_once.spark.partition_transforms import arrow_values, spark_sort_keys, spark_value
from airflow_provider_exactly_once.spark.spread import spread
from airflow_provider_exactly_once.spark.writer_protocol import FileWrite, rows_per_file

#: The changed keys' column: the change deletes its key.
DELETED = "__eo_deleted"
#: A file row's position in the file, as pyiceberg's reader yields the rows.
ROW = "__eo_row"
#: The group a row to write belongs to: the path of the file to rewrite with it (null: a new file).
GROUP = "__eo_group"
#: True on the one row per rewritten file that gives its group a task even without upserted rows.
MARKER = "__eo_marker"
#: Rows of the files to rewrite per task, about a second of a task's reading and writing: a Python
#: task's fixed cost (its function, its reader) is then small beside its work, and a rewrite of
#: twenty small files is not twenty tasks.
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


def find_hits(spark: SparkSession, files: TableFiles, changed: pa.Table, keys: Sequence[str]) -> dict[str, Hits]:
    """Per file of ``files`` that holds a changed key: the rows hit. ``changed``: the keys and
    ``DELETED``, one row per key."""
    paths = sorted(files.files)
    if not paths:
        return {}
    task = functools.partial(_hits_task, files, changed, tuple(keys), {p: i for i, p in enumerate(paths)})
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


def _hits_task(
    files: TableFiles,
    changed: pa.Table,
    keys: tuple[str, ...],
    index: dict[str, int],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
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


@dataclass(frozen=True)
class RewriteWriter:
    """The writer of an upsert: rewritten files and the upserted rows, grouped as the module says."""

    files: TableFiles
    key: tuple[str, ...]
    #: Upserted rows of keys the table did not hold: about how many go to new files.
    inserted: int

    def write(self, frame: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        if not self.files.files:
            return self._write_new(frame, write)
        tagged = _tagged(frame, write, self.files)
        new = tagged.where(F.col(GROUP).isNull()).drop(GROUP)
        return self._rewrite(tagged.where(F.col(GROUP).isNotNull()), write) + self._write_new(new, write)

    def _rewrite(self, tagged: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        """One group per file to rewrite (its marker row makes sure of it), ``ROWS_PER_TASK`` rows'
        worth of files a task (or ``writers`` tasks)."""
        spark = tagged.sparkSession
        nulls = [F.lit(None).cast(f.dataType).alias(f.name) for f in tagged.schema.fields if f.name != GROUP]
        markers = spread(spark, sorted(self.files.files), GROUP).select(*nulls, F.col(GROUP), F.lit(True).alias(MARKER))
        rows = tagged.withColumn(MARKER, F.lit(False)).unionByName(markers)
        files, key = self.files, self.key

        def rewrite(group: pa.Table) -> pa.Table:
            return _group_task(files, write, key, group)

        rows_read = sum(f.record_count for f in files.files.values())
        tasks = write.writers or min(len(files.files), max(2, math.ceil(rows_read / ROWS_PER_TASK)))
        grouped = rows.repartition(tasks, F.col(GROUP)).groupBy(GROUP)
        described = grouped.applyInArrow(rewrite, f"{DESCRIPTOR_COLUMN} string").collect()
        return [DataFileDescriptor.model_validate_json(row[0]) for row in described]

    def _write_new(self, rows: DataFrame, write: FileWrite) -> list[DataFileDescriptor]:
        """The rows no rewritten file takes, over as many tasks as files of the target size they
        fill (or ``writers``), never over ``spark.sql.shuffle.partitions``. Ranges of partition
        value, then key: a partition value too big for one file spans several tasks, small ones
        share a task and still get a file each, and every file holds a narrow key range for later
        epochs' plans to prune. Rows that fill one file are not shuffled: one task sorts them."""
        size = rows_per_file(write.target_file_size, write.write_schema)
        tasks = write.writers or max(1, math.ceil(self.inserted / size))
        order = [
            *spark_sort_keys(write.spec, write.write_schema, set(rows.columns)),
            *[F.col(quote(k)) for k in self.key],
        ]
        spread_rows = rows.coalesce(1) if tasks == 1 else rows.repartitionByRange(tasks, *order)
        task = functools.partial(spark_task, write)
        described = spread_rows.sortWithinPartitions(*order).mapInArrow(task, f"{DESCRIPTOR_COLUMN} string").collect()
        return [DataFileDescriptor.model_validate_json(row[0]) for row in described]


def _groups_by_partition(files: TableFiles, write: FileWrite) -> dict[tuple[PartitionValue, ...], str]:
    """Per partition value of the write's spec: the smallest file being rewritten there."""
    groups: dict[tuple[PartitionValue, ...], str] = {}
    width = len(write.spec.fields)
    for path, data_file in sorted(files.files.items(), key=lambda item: (-item[1].record_count, item[0])):
        if data_file.spec_id == write.spec.spec_id:
            groups[tuple(data_file.partition[i] for i in range(width))] = path
    return groups


def _tagged(frame: DataFrame, write: FileWrite, files: TableFiles) -> DataFrame:
    """Each upserted row with the file to rewrite in its partition, or null: a broadcast join on the
    partition values, which Spark computes as Iceberg does (``spark_value``) and the files'
    partition records hold. A value Spark cannot take from a record only leaves rows untagged: they
    are new files, the layout changes and nothing else."""
    groups = _groups_by_partition(files, write)
    untagged = frame.withColumn(GROUP, F.lit(None).cast("string"))
    if not groups:
        return untagged
    if not write.spec.fields:
        return frame.withColumn(GROUP, F.lit(groups[()]))
    values = {f"__eo_p{i}": _partition_value(frame, write, f) for i, f in enumerate(write.spec.fields)}
    typed = frame.select(*[v.alias(name) for name, v in values.items()]).schema
    fields = [st.StructField(f"__eo_g{i}", field.dataType) for i, field in enumerate(typed.fields)]
    try:
        known = frame.sparkSession.createDataFrame(
            [(*key, path) for key, path in groups.items()],
            st.StructType([*fields, st.StructField(GROUP, st.StringType())]),
        )
    except (TypeError, ValueError):
        return untagged
    same = functools.reduce(
        lambda a, b: a & b, [F.col(f"__eo_p{i}").eqNullSafe(F.col(f"__eo_g{i}")) for i in range(len(values))]
    )
    joined = frame.withColumns(values).join(F.broadcast(known), on=same, how="left")
    return joined.drop(*values, *[f.name for f in fields])


def _partition_value(frame: DataFrame, write: FileWrite, partition_field: PartitionField) -> Column:
    name = write.write_schema.find_column_name(partition_field.source_id)
    if name is None or name.split(".")[0] not in frame.columns or isinstance(partition_field.transform, VoidTransform):
        return F.lit(None)
    source_type = write.write_schema.find_field(partition_field.source_id).field_type
    return spark_value(partition_field.transform, source_type, F.col(".".join(quote(p) for p in name.split("."))))


def _group_task(files: TableFiles, write: FileWrite, key: tuple[str, ...], group: pa.Table) -> pa.Table:
    """One group: the file's kept rows (when the group is a file), then the upserted rows."""
    name = str(group.column(GROUP)[0].as_py())
    added = group.filter(pc.invert(group.column(MARKER))).drop_columns([GROUP, MARKER])
    context = TaskContext.get()
    task = f"{context.partitionId():05d}-{context.attemptNumber()}" if context is not None else "00000-0"

    def rows() -> Iterator[pa.RecordBatch]:
        if name in files.files:
            kept = files.kept(name)
            if files.files[name].spec_id != write.spec.spec_id:  # rows of several partitions now: sort them
                read = list(kept)
                kept = iter(_sorted(pa.Table.from_batches(read), write, ()).to_batches() if read else ())
            yield from kept
        if added.num_rows:
            yield from _sorted(added, write, key).to_batches()

    described = [batch.column(0)[0].as_py() for batch in write_task(write, rows(), task)]
    return pa.table({DESCRIPTOR_COLUMN: pa.array(described, pa.string())})


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
