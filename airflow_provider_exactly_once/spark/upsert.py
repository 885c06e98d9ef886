"""Copy-on-write of an upsert epoch (design.md section 5, step 7): the driver's half.

pyiceberg 0.12 can neither write nor read delete files, so an epoch of changes is applied by
rewriting the data files that hold its keys. The table's rows never pass through the JVM: each file
is read, filtered and written again by one Python task, as a single-process rewrite of the touched
files would do it, only spread over the executors (``rewrite_tasks``):

1. one pass of Python tasks over the changes (``staged_rows.stage_changes``) stages the upserted
   rows by partition value in the write location, and brings the changed keys and their operations
   to the driver as Arrow, which gives the key range, the upsert and delete totals and, where the
   keys are few, the values to plan with;
2. the driver plans the table's live data files on the sink's branch that can hold any of the
   epoch's keys: pyiceberg's scan planning with a filter on the key columns (the key values
   themselves when they are few, their range otherwise) prunes by partition and by column
   statistics. The partition of a changed row is deliberately not used: an update may move a key
   to another partition, and its old row must still be found;
3. one Spark job reads the key columns of those files on the executors (pyiceberg's own Arrow
   reader: field ids, name mapping and schema evolution resolved as any Iceberg reader does) and
   returns, per file, the positions of the rows a change hits: the files that really hold a
   changed key, and every count the commit reports, are known before anything is written;
4. the write (``rewrite_tasks.RewriteWriter``) rewrites each of those files without those rows,
   together with the epoch's staged rows of the same partition, and writes the rest of the staged
   rows as new files, by the target file size;
5. the pre-commit names the rewritten files, the snapshot they were read from and the epoch's key
   range: the commit removes exactly those files in the snapshot that adds the new ones, and
   refuses when the table moved in a way that could hide a key from this write (``UpsertConflict``).

A revision of a committed epoch (``core.upsert_revisions``) does the same at the table as it was
before the write it revises, and rewrites that write's rewritten files as well, even where no key of
this epoch is in them: their rows there are what undoes the revised write's other changes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, ReprocessRefused
from airflow_provider_exactly_once.core.upserts import (
    ChangeCounts,
    RevisedWrite,
    RevisionBasis,
    RewrittenFile,
    UpsertSpec,
)
from airflow_provider_exactly_once.spark.changes import CHECKED, OP, ORDER, Owner
from airflow_provider_exactly_once.spark.rewrite_tasks import TableFiles, find_hits
from airflow_provider_exactly_once.spark.staged_rows import DELETED, Staged, remove, stage_changes
from airflow_provider_exactly_once.spark.writers import FileWrite, quote
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark

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
    #: partition value (``staged_rows``).
    staged: tuple[Staged, ...]
    #: The files to rewrite, where to read them and which of their rows the epoch replaces.
    files: TableFiles
    rewritten: list[RewrittenFile]
    read_snapshot_id: int | None
    key_lower_bounds: dict[str, str]
    key_upper_bounds: dict[str, str]
    changes: ChangeCounts
    key: tuple[str, ...]
    #: A revision's: the committed write it replaces (``core.upsert_revisions``).
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
    """``changes``: one change per key (``changes.one_change_per_key``), the table's columns (as
    written) plus ``OP`` and ``CHECKED``; the result's rows are in the table's columns. ``refuse``
    sees the changed keys and ``CHECKED`` first (``changes.refuse_faults``): the one pass over the
    changes that brings them to the driver is also the one that checks them.

    A ``revision`` is planned at the table as it was before the write it revises, and rewrites that
    write's rewritten files too, from their rows there: keys it changed and this epoch does not get
    their earlier rows back (``core.upsert_revisions``).
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
    remove(write, staged.key_files)
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
    for field in schema.fields:
        spark_type = iceberg_to_spark(field.field_type)
        if spark_type is None:
            raise InvalidSinkConfig(f"{owner}: column {field.name!r} ({field.field_type}) has no Spark type")
        fields.append(st.StructField(field.name, spark_type, True))
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
