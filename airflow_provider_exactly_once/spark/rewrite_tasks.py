"""Copy-on-write of an upsert epoch: the executors' half (``upsert`` plans it on the driver).

A table's rows never pass through the JVM. Two Spark jobs, each a set of Python tasks:

1. ``find_hits``: per candidate file, its key columns only are read and joined with the epoch's
   changed keys (in Arrow, from the files the pass over the changes staged them in): the positions
   of the rows a change hits, and whether the change deletes. Positions are those of pyiceberg's
   reader over the whole file, the same in both jobs (the files carry no delete files: ``upsert``
   refuses those).
2. ``RewriteWriter``: the upserted rows are staged by partition value (``staged_rows``: one pass
   of Python tasks, nothing shuffled), then one job of Python tasks writes the units: each file to
   rewrite streams its rows without the hit positions, then the staged rows of its partition (it
   is the smallest file there) sorted by key, through the append's own ``writers.write_task``:
   a file per partition value, rolled at the target size, described from the footers it wrote. The
   staged rows of a partition without such a file are new files, written by one task in key order.

An update that moves its key to another partition is written in that partition's group and
removed from its old file by position: the layout is a choice, never a condition of correctness.
"""

from __future__ import annotations

import functools
import json
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
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor
from airflow_provider_exactly_once.spark import staged_rows
from airflow_provider_exactly_once.spark.file_io import spread
from airflow_provider_exactly_once.spark.staged_rows import DELETED
from airflow_provider_exactly_once.spark.writers import (
    DESCRIPTOR_COLUMN,
    FileWrite,
    arrow_values,
    nested_column,
    write_task,
)

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


def find_hits(spark: SparkSession, files: TableFiles, key_files: Sequence[str], keys: Sequence[str]) -> dict[str, Hits]:
    """Per file of ``files`` that holds a changed key: the rows hit. ``key_files``: the staged keys
    and ``DELETED``, one row per key (``staged_rows.StagedChanges``), which each task reads."""
    paths = sorted(files.files)
    if not paths:
        return {}
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


def _hits_task(
    files: TableFiles,
    key_files: tuple[str, ...],
    keys: tuple[str, ...],
    index: dict[str, int],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    changed = staged_rows.read(files.io_properties, key_files)
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
    rows staged in the pass over the changes (``staged_rows.stage_changes``), not from ``frame``."""

    files: TableFiles
    key: tuple[str, ...]
    staged: tuple[staged_rows.Staged, ...]

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
        staged_rows.remove(write, [s.path for s in self.staged])
        return [DataFileDescriptor.model_validate_json(row[0]) for row in described]


def _units(files: TableFiles, write: FileWrite, staged: Sequence[staged_rows.Staged]) -> list[_Unit]:
    """Every file to rewrite is a unit, the smallest of each partition value with that partition's
    staged rows; the staged rows of a partition without one are a unit of new files, sorted by key
    in one task, so that each file it rolls holds a narrow key range for later epochs' plans."""
    by_partition: dict[str, list[staged_rows.Staged]] = {}
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
    its partition's staged rows go into it (``staged_rows.partition_key``)."""
    smallest: dict[str, str] = {}
    width = len(write.spec.fields)
    for path, data_file in sorted(files.files.items(), key=lambda item: (-item[1].record_count, item[0])):
        if data_file.spec_id == write.spec.spec_id:
            smallest[staged_rows.partition_key(write, [data_file.partition[i] for i in range(width)])] = path
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
    added = staged_rows.read(write.io_properties, staged)
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
