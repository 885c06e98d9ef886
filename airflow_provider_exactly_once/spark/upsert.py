"""Copy-on-write of an upsert epoch (design.md section 5, step 7): the Spark half.

pyiceberg 0.12 can neither write nor read delete files, so an epoch of changes is applied by
rewriting the data files that hold its keys:

1. the driver plans the table's live data files on the sink's branch that can hold any of the
   epoch's keys: pyiceberg's scan planning with a filter on the key columns (the key values
   themselves when they are few, their range otherwise) prunes by partition and by column
   statistics. The partition of a changed row is deliberately not used: an update may move a key
   to another partition, and its old row must still be found;
2. the executors read those files with pyiceberg's own Arrow reader (field ids, name mapping and
   schema evolution resolved as any Iceberg reader does), each row tagged with its file;
3. the files that really hold a changed key are rewritten without the changed and deleted keys,
   and the epoch's inserted and updated rows are written beside them, by the same writer as an
   append (``file_writer``), over as many tasks as files of the target size the rows fill
   (``Rewrite.distributed``);
4. the pre-commit names the rewritten files, the snapshot they were read from and the epoch's key
   range: the commit removes exactly those files in the snapshot that adds the new ones, and
   refuses when the table moved in a way that could hide a key from this write (``UpsertConflict``).

A revision of a committed epoch (``core.upsert_revisions``) does the same at the table as it was
before the write it revises, and rewrites that write's rewritten files as well, even where no key of
this epoch is in them: their rows there are what undoes the revised write's other changes.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
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
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.types import (
    DateType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, ReprocessRefused
from airflow_provider_exactly_once.core.upserts import (
    ChangeCounts,
    RevisedWrite,
    RevisionBasis,
    RewrittenFile,
    UpsertSpec,
)
from airflow_provider_exactly_once.spark.alignment import iceberg_to_spark
from airflow_provider_exactly_once.spark.changes import DELETE, OP, ORDER, UPSERT, Owner, quote
from airflow_provider_exactly_once.spark.parquet_writer import session_conf
from airflow_provider_exactly_once.spark.spread import spread

#: The column a read row carries: the data file it came from.
FILE = "__eo_file"
#: Up to this many distinct values of a key column are planned with ``In``; past it, with the range.
IN_LIMIT = 1000
#: Key column types the epoch's key range can be recorded for (Iceberg identifier fields are
#: primitives, never floating; these are the ones a copy-on-write plan can bound).
KEY_TYPES = (IntegerType, LongType, StringType, DateType, TimestampType, TimestamptzType)
#: Adaptive execution may coalesce the shuffle partitions of a cached plan, as it does any other's.
#: The change rows are cached after a shuffle (the last change per key), and with Spark's default
#: that cache keeps ``spark.sql.shuffle.partitions`` partitions (200) however small the epoch: every
#: later stage would run that many tasks, and write a file per partition that holds a row.
CACHE_CONF = {"spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true"}


@dataclass(frozen=True)
class Rewrite:
    """What copy-on-write produced for one table: the rows to write and what the commit needs."""

    rows: DataFrame
    rewritten: list[RewrittenFile]
    read_snapshot_id: int | None
    key_lower_bounds: dict[str, str]
    key_upper_bounds: dict[str, str]
    changes: ChangeCounts
    cached: tuple[DataFrame, ...]
    key: tuple[str, ...]
    #: A revision's: the committed write it replaces (``core.upsert_revisions``).
    revises: RevisedWrite | None = None

    def distributed(self, partition_keys: Sequence[Column], rows_per_file: int, writers: int | None) -> DataFrame:
        """The rows over as many write tasks as files of ``rows_per_file`` rows they fill (or
        ``writers``), never over ``spark.sql.shuffle.partitions``, 200 tasks however small the
        epoch. Ranges of partition value, then key: a partition value too big for one file spans
        several tasks, small ones share a task and still get a file each (sorted, so each value's
        rows are adjacent), and every file holds a narrow key range for later epochs' plans to prune.
        Rows that fill one file are not shuffled at all: one task sorts them where they are.
        """
        expected = self.changes.inserted + self.changes.updated + self.changes.rows_rewritten
        tasks = writers or max(1, math.ceil(expected / rows_per_file))
        order = [*partition_keys, *[F.col(quote(k)) for k in self.key]]
        spread = self.rows.coalesce(1) if tasks == 1 else self.rows.repartitionByRange(tasks, *order)
        return spread.sortWithinPartitions(*order)


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
    io_properties: dict[str, str],
    measured: Row,
    revision: RevisionBasis | None = None,
) -> Rewrite:
    """``changes``: one change per key, the table's columns (as written) plus ``OP``; the result's
    rows are in the same columns, without ``OP``. ``measured``: the validation pass's row, holding
    ``range_measures``.

    A ``revision`` is planned at the table as it was before the write it revises, and rewrites that
    write's rewritten files too, from their rows there: keys it changed and this epoch does not get
    their earlier rows back (``core.upsert_revisions``).
    """
    columns = [c for c in changes.columns if c not in (OP, ORDER)]
    keys = list(upsert.key)
    with session_conf(spark, CACHE_CONF):  # the cached plan is made here, when the cache is declared
        changes = changes.select(*[quote(c) for c in columns], OP).persist()
    read_id = _planned_at(table, branch, revision, owner)
    lower, upper, key_filter = _key_range(table, changes, keys, measured)
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
    schema = changes.select(*[quote(c) for c in columns]).schema
    existing = _read_files(spark, table.metadata, [t.file for t in tasks], schema, io_properties).persist()
    key_cols = [quote(k) for k in keys]
    # One job finds the files that really hold a changed key, how many rows each change hits there,
    # and (in the row whose file is null) how many of the epoch's changes are upserts and deletes.
    matched = existing.select(*key_cols, FILE).join(changes.select(*key_cols, OP), on=keys, how="inner")
    counts = [F.sum(F.when(F.col(OP) == kind, 1).otherwise(0)).alias(kind) for kind in (UPSERT, DELETE)]
    totals_row = changes.agg(F.lit(None).cast("string").alias(FILE), *counts)
    found = matched.groupBy(FILE).agg(*counts).unionByName(totals_row).collect()
    totals = next(row for row in found if row[FILE] is None)
    per_file = [row for row in found if row[FILE] is not None]
    touched = sorted({str(row[FILE]) for row in per_file} | set(revision.rewritten if revision else ()))
    updated = sum(int(row[UPSERT]) for row in per_file)
    deleted = sum(int(row[DELETE]) for row in per_file)
    kept = (
        existing.where(F.col(FILE).isin(touched)).join(changes.select(*key_cols), on=keys, how="left_anti").drop(FILE)
    )
    upserts = changes.where(F.col(OP) == UPSERT)
    by_path = {t.file.file_path: t.file for t in tasks}
    rewritten = [RewrittenFile(path=p, record_count=int(by_path[p].record_count)) for p in touched]
    change_counts = ChangeCounts(
        inserted=max(int(totals[UPSERT] or 0) - updated, 0),
        updated=updated,
        deleted=deleted,
        deletes_of_absent_keys=max(int(totals[DELETE] or 0) - deleted, 0),
        rows_rewritten=max(sum(f.record_count for f in rewritten) - updated - deleted, 0),
    )
    rows = kept.unionByName(upserts.drop(OP))
    return Rewrite(
        rows=rows,
        rewritten=rewritten,
        read_snapshot_id=read_id,
        key_lower_bounds=lower,
        key_upper_bounds=upper,
        changes=change_counts,
        cached=(changes, existing),
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


def range_measures(table: Table, keys: Sequence[str]) -> list[Column]:
    """What the validation pass (``changes.check_changes``) measures of each key column for
    ``_key_range``: its bounds and its number of distinct values, as Iceberg's literal values of the
    table's type. Deduplicating the changes later drops rows of a key, never a key, so the input's
    measures are the epoch's."""
    schema = table.schema()
    measures = []
    for key in keys:
        value = _comparable(key, schema.find_field(key).field_type)
        measures += [
            F.min(value).alias(f"lo_{key}"),
            F.max(value).alias(f"hi_{key}"),
            F.count_distinct(value).alias(f"n_{key}"),
        ]
    return measures


def _key_range(
    table: Table, changes: DataFrame, keys: Sequence[str], measured: Row
) -> tuple[dict[str, str], dict[str, str], BooleanExpression]:
    """Per key column: its lower and upper bound over the epoch's changes (deletes included), in
    Iceberg's single-value serialisation, and the filter that plans the files that can hold them:
    the values themselves where they are few (one query of the cached changes), else the range."""
    if measured[f"lo_{keys[0]}"] is None:
        return {}, {}, AlwaysTrue()
    schema = table.schema()
    lower: dict[str, str] = {}
    upper: dict[str, str] = {}
    few = [k for k in keys if int(measured[f"n_{k}"]) <= IN_LIMIT]
    values: dict[str, list[Any]] = {k: [] for k in few}
    if few:
        comparable = [_comparable(k, schema.find_field(k).field_type).alias(k) for k in few]
        for row in changes.select(*comparable).distinct().collect():
            for k in few:
                values[k].append(row[k])
    expression: BooleanExpression = AlwaysTrue()
    for key in keys:
        field_type = cast(PrimitiveType, schema.find_field(key).field_type)  # KEY_TYPES, checked
        lo, hi = measured[f"lo_{key}"], measured[f"hi_{key}"]
        lower[key] = base64.b64encode(to_bytes(field_type, lo)).decode("ascii")
        upper[key] = base64.b64encode(to_bytes(field_type, hi)).decode("ascii")
        if key in values:
            term: BooleanExpression = In(term=key, literals=sorted(set(values[key])))
        else:
            term = And(GreaterThanOrEqual(term=key, value=lo), LessThanOrEqual(term=key, value=hi))
        expression = term if isinstance(expression, AlwaysTrue) else And(expression, term)
    return lower, upper, expression


def _comparable(name: str, field_type: IcebergType) -> Any:
    """The key as Iceberg's literal value: dates as days, timestamps as microseconds, from Spark
    itself (collecting them as Python datetimes would apply the driver's local time zone). The
    input's column is cast to the table's type first, as the alignment casts it for the write."""
    spark_type = iceberg_to_spark(field_type)
    column = F.col(quote(name)) if spark_type is None else F.col(quote(name)).cast(spark_type)
    if isinstance(field_type, DateType):
        return F.unix_date(column)
    if isinstance(field_type, TimestampType | TimestamptzType):
        return F.unix_micros(column.cast("timestamp"))
    return column


def _read_files(
    spark: SparkSession,
    metadata: TableMetadata,
    files: list[DataFile],
    schema: st.StructType,
    io_properties: dict[str, str],
) -> DataFrame:
    """The rows of ``files`` in ``schema`` (the table's columns as written) plus ``FILE``."""
    out = st.StructType([*schema.fields, st.StructField(FILE, st.StringType(), False)])
    if not files:
        return spark.createDataFrame([], out)
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(out, timezone="UTC")
    by_path = {f.file_path: f for f in files}
    reader = functools.partial(_read_task, metadata.model_dump_json(), io_properties, by_path, arrow)
    return spread(spark, sorted(by_path), "path").mapInArrow(reader, out)


def _read_task(
    metadata_json: str,
    io_properties: dict[str, str],
    files: dict[str, DataFile],
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task: each of its files read with pyiceberg's reader (the table's current
    schema, so renamed and added columns resolve by field id or name mapping, identity partition
    values from the manifest), cast to ``schema``, path attached."""
    metadata = TableMetadataUtil.parse_raw(metadata_json)
    io = load_file_io({**metadata.properties, **io_properties}, metadata.location)
    scan = ArrowScan(metadata, io, metadata.schema(), AlwaysTrue())
    for batch in batches:
        for path in batch.column("path").to_pylist():
            for part in scan.to_record_batches([FileScanTask(files[path])]):
                arrays = []
                for field in schema:
                    if field.name == FILE:
                        arrays.append(pa.array([path] * part.num_rows, type=field.type))
                    elif field.name in part.schema.names:
                        arrays.append(part.column(field.name).cast(field.type))
                    else:
                        arrays.append(pa.nulls(part.num_rows, type=field.type))
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
