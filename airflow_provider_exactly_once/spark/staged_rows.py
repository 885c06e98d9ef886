"""An upsert's rows to write, staged by partition value under the write location, for the rewrite's
Python tasks to read (``rewrite_tasks.RewriteWriter``).

The rewrite writes each partition's upserted rows together with the file it rewrites there. Handing
them over through Spark (a shuffle by that file, a sort, then Arrow into the tasks) cost more than
the rewrite itself: at 1M upserted rows, 3 to 6 s of a 5 to 9 s job with no file work at all. Here
one pass of Python tasks over the rows writes each task's rows of each partition value as a file
(``_staging/`` in the write location, where a failed write's clean-up finds them too), and reports
them to the driver, which hands each file's path to the task that needs it. Nothing is sorted or
moved by the JVM; the reading task sorts its partition's rows by key, once. The files are Parquet,
uncompressed and without statistics, rather than Arrow's own format: a table bucket (S3 Tables,
SeaweedFS's) refuses objects of other kinds in a table's location.
"""

from __future__ import annotations

import functools
import itertools
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_type

from airflow_provider_exactly_once.spark.changes import CHECKED, DELETE, OP, UPSERT
from airflow_provider_exactly_once.spark.writers import FileWrite, arrow_values, nested_column

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
    changed = read(write.io_properties, key_files)
    if changed is None:  # no change rows at all: a revision that only undoes the write it revises
        fields = [changes.schema[name] for name in (*keys, *CHECKED)]
        changed = pa.table({f.name: pa.array([], to_arrow_type(f.dataType, timezone="UTC")) for f in fields})
        changed = changed.add_column(len(keys), DELETED, pa.array([], pa.bool_()))
    return StagedChanges(changed, staged, key_files)


def read(io_properties: Mapping[str, str], paths: Sequence[str]) -> pa.Table | None:
    """The rows of the staged files ``paths``, or ``None`` when there are none."""
    tables = []
    for path in paths:
        with load_file_io(dict(io_properties), path).new_input(path).open() as stream:
            tables.append(pq.read_table(pa.BufferReader(stream.read())))
    return pa.concat_tables(tables) if tables else None


def remove(write: FileWrite, paths: Sequence[str]) -> None:
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
