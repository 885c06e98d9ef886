"""Reading the snapshot range an epoch reserved of an upstream Iceberg table (``IcebergTableInput``):
the rows the range's appends added, read by pyiceberg's reader on the executors.

Spark would read Iceberg through the iceberg-spark-runtime jar, which the pyspark package does not
ship (nor the s3a one, ``file_io``); pyiceberg reads the files the committer's FileIO reaches, on the
same properties. The driver reads metadata only: the snapshot log, manifest lists and manifests.

The range was reserved before the write (``core.input_ranges``), and a retry, a clear or a reprocess
reads it again: what it reads must follow from the range alone, never from the table's state now.

- The range is checked against the table's snapshots and their parent links first. A snapshot expired before the sink
  consumed it, or an upstream rolled back past the range's start, leaves rows that cannot be read;
  the refusal says so rather than reading a part of the range.
- Every snapshot in it must be an append or a replace (pyiceberg's incremental append scan would
  skip the others silently): an overwrite or a delete changed rows the sink may have delivered
  already, and reading its added files would deliver rows twice or ones taken back upstream; a
  replace (a compaction) changed none, and the files it removed are read where their appends put them.
- The rows are read at the schema of the range's last snapshot, so that a column added, renamed or
  dropped upstream afterwards does not change what a replay of the epoch reads.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InputRangeRefused, InvalidSinkConfig
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table
from airflow_provider_exactly_once.spark.file_io import spread, storage_properties
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec, IcebergTableInput
from airflow_provider_exactly_once.spark.upsert import TableFiles
from airflow_provider_exactly_once.type_mapping import iceberg_to_spark

#: What the read gives ``inputs.read_input``: the rows (``None``: nothing to read, no Spark job) and
#: the source positions of the pre-commit. A pair rather than ``inputs.EpochInput``, which would be
#: an import cycle.
RangeRead = tuple[DataFrame | None, dict[str, Any]]

_KEEP_SNAPSHOTS = (
    "the rows of the range can no longer be read. Keep the upstream's snapshots until the sink has "
    "consumed them (the table's history.expire.max-snapshot-age-ms and "
    "history.expire.min-snapshots-to-keep, or the expiry job's own settings); to move on, write to a "
    "new sink id whose input starts after a current snapshot of the table (start_after_snapshot_id)"
)


def read_snapshot_range(spark: SparkSession, spec: EpochJobSpec) -> RangeRead:
    """The rows the appends of ``spec.input_range`` added to the upstream table, and the range as
    source positions with what was read (snapshots, data files, records)."""
    source, reserved = spec.input, spec.input_range
    if not isinstance(source, IcebergTableInput) or reserved is None:
        raise InvalidSinkConfig(f"{_owner(spec)}: a snapshot range is read for an iceberg_table input only")
    if reserved.empty:
        return None, reserved.positions(snapshots=0, files=0, records=0)
    # The catalog's name too, not a label: pyiceberg's SQL catalog keeps tables by catalog name.
    # ``load_table`` turns a missing table and an unreachable catalog into the domain's errors.
    table = load_table(load_catalog(spec.input_catalog_name, **spec.input_catalog_properties), source.table)
    snapshots = range_snapshots(table.metadata, reserved, _owner(spec))
    if reserved.after_snapshot_id is None:
        check_from_first(table, snapshots, reserved, _owner(spec))
    pinned = _at_schema_of(table.metadata, snapshots[-1])
    files = added_files(table, pinned, reserved, snapshots, _owner(spec))
    records = sum(int(f.record_count) for f in files.values())
    positions = reserved.positions(snapshots=len(snapshots), files=len(files), records=records)
    if not files:
        return None, positions
    schema = _spark_schema(pinned.schema(), source.table, _owner(spec))
    from pyspark.sql.pandas.types import to_arrow_schema

    shipped = TableFiles(
        pinned.model_dump_json(),
        # The catalog's storage properties, then the loaded table's FileIO's: a REST catalog that
        # vends credentials puts them there, scoped to this table (as ``targets`` does for a sink).
        storage_properties({**spec.input_catalog_properties, **table.io.properties}),
        files,
    )
    task = functools.partial(_read_task, shipped, to_arrow_schema(schema, timezone="UTC"))
    return spread(spark, sorted(files), "path").mapInArrow(task, schema), positions


def range_snapshots(metadata: TableMetadata, reserved: SnapshotRange, owner: str) -> list[Snapshot]:
    """The snapshots of a non-empty range, oldest first, each an append or a replace: the parents
    of ``to_snapshot_id`` down to the one after ``after_snapshot_id`` (down to the root without one).
    A replace (a compaction, a file format change) rewrites files without changing a row (the
    table spec's ``replace`` operation), so what the range's appends added is all the range added;
    any other operation changed rows the sink may have delivered, and is refused.

    ``after_snapshot_id`` itself may be expired, as long as its child still names it parent (Java's
    expiry leaves the link; pyiceberg's drops it, and the range is refused then: nothing in the
    metadata tells an expired start from a rollback past it).
    """
    walked: list[Snapshot] = []
    wanted = reserved.to_snapshot_id
    while wanted != reserved.after_snapshot_id:
        if wanted is None or len(walked) > len(metadata.snapshots):
            raise _no_start(metadata, reserved, walked, owner)
        snapshot = metadata.snapshot_by_id(wanted)
        if snapshot is None:
            child = f", the parent of snapshot {walked[-1].snapshot_id}," if walked else ""
            raise InputRangeRefused(
                f"{owner}: snapshot {wanted}{child} of {reserved.table} is gone from the table's metadata, "
                f"expired by the upstream's snapshot expiry before the sink consumed the range "
                f"({reserved.describe()}): {_KEEP_SNAPSHOTS}"
            )
        walked.append(snapshot)
        wanted = snapshot.parent_snapshot_id
    walked.reverse()
    for snapshot in walked:
        operation = snapshot.summary.operation if snapshot.summary is not None else None
        if operation not in (Operation.APPEND, Operation.REPLACE):
            committed = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC).isoformat()
            kind = repr(operation.value) if operation is not None else "not recorded"
            raise InputRangeRefused(
                f"{owner}: snapshot {snapshot.snapshot_id} of {reserved.table} (committed {committed}), in the "
                f"range ({reserved.describe()}), is not an append: its operation is {kind}. An incremental input reads "
                "appends only (and steps over compactions, which change no row): the rows an overwrite or a delete "
                "changed or removed may have been delivered already, and reading its files would deliver them "
                "again or ones taken back upstream. To move on, write to a new sink id whose input starts after "
                "that snapshot (start_after_snapshot_id)"
            )
    return walked


def _no_start(
    metadata: TableMetadata, reserved: SnapshotRange, walked: Sequence[Snapshot], owner: str
) -> InputRangeRefused:
    """The parents of ``to`` ended (or looped) before ``after_snapshot_id``."""
    after = reserved.after_snapshot_id
    if after is None or metadata.snapshot_by_id(after) is not None or not walked:
        why = "the upstream was rolled back past it, or the table replaced"
    else:
        why = (
            f"it is gone from the table's metadata and snapshot {walked[-1].snapshot_id} names no parent: the "
            "snapshots before it were expired (pyiceberg's expiry drops the parent link of the oldest snapshot "
            "it keeps, so the range's start has to be kept too), or the upstream was rolled back"
        )
    return InputRangeRefused(
        f"{owner}: snapshot {reserved.after_snapshot_id} of {reserved.table} is not an ancestor of snapshot "
        f"{reserved.to_snapshot_id}, so the range ({reserved.describe()}) is not a piece of the table's "
        f"history any more ({why}): {_KEEP_SNAPSHOTS}"
    )


def check_from_first(table: Table, snapshots: Sequence[Snapshot], reserved: SnapshotRange, owner: str) -> None:
    """A range from the table's first snapshot ends its walk at a snapshot without a parent, which
    may be the oldest one pyiceberg's expiry kept rather than the first (it drops that link). Had
    the walk reached the first, every file live at the range's end would have been added by one of
    the range's snapshots, all appends: a file added by another one shows that snapshots expired."""
    ids = {s.snapshot_id for s in snapshots}
    for manifest in snapshots[-1].manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id not in ids:
                raise InputRangeRefused(
                    f"{owner}: snapshot {snapshots[0].snapshot_id} of {reserved.table} names no parent, but "
                    f"{entry.data_file.file_path} was added by snapshot {entry.snapshot_id}, which is gone from "
                    f"the table's metadata: the range ({reserved.describe()}) lost its first snapshots to the "
                    f"upstream's snapshot expiry before the sink consumed them: {_KEEP_SNAPSHOTS}"
                )


def added_files(
    table: Table, pinned: TableMetadata, reserved: SnapshotRange, snapshots: Sequence[Snapshot], owner: str
) -> dict[str, DataFile]:
    """The data files the range's appends added, by path (``pinned``: the metadata they are read
    at, which planning needs nothing of).

    A file an append of the range added is live at the range's end unless a replace of the range
    compacted it away afterwards: it then stays in storage (the range's snapshots still name it),
    but only its append's own manifests list it. So the appends after the range's last replace are
    planned from the range end's manifest list alone, where each of their files sits in a manifest
    they wrote (EXISTING where a later append merged it), and each append before that replace from
    its own manifest list. A range without a replace reads one manifest list; pyiceberg's
    ``IncrementalAppendScan`` reads one per snapshot (most of the planning of a range of many small
    appends, ``bench.incremental_read``). Delete files added by an append are refused.
    """
    replaces = [i for i, s in enumerate(snapshots) if _operation(s) is Operation.REPLACE]
    after_replaces = replaces[-1] + 1 if replaces else 0  # no replace: every append is a late one
    early = [s for s in snapshots[:after_replaces] if _operation(s) is Operation.APPEND]
    late = {s.snapshot_id for s in snapshots[after_replaces:]}
    files: dict[str, DataFile] = {}
    for snapshot in early:  # only its own entries, ADDED in the manifests it wrote
        _collect(table, snapshot, reserved, owner, {snapshot.snapshot_id}, files, added_only=True)
    if late:
        _collect(table, snapshots[-1], reserved, owner, late, files, added_only=False)
    return files


def _collect(
    table: Table,
    listed: Snapshot,
    reserved: SnapshotRange,
    owner: str,
    ids: set[int],
    files: dict[str, DataFile],
    *,
    added_only: bool,
) -> None:
    """Into ``files``: the entries of ``listed``'s manifests written by ``ids`` that ``ids`` added."""
    for manifest in listed.manifests(table.io):
        if manifest.added_snapshot_id not in ids:
            continue  # written before those snapshots, or by a replace: no file they added
        if manifest.content == ManifestContent.DELETES:
            raise InputRangeRefused(
                f"{owner}: snapshot {manifest.added_snapshot_id} of {reserved.table}, in the range "
                f"({reserved.describe()}), added delete files ({manifest.manifest_path}); an incremental "
                "input reads appended data files only. To move on, write to a new sink id whose input "
                "starts after that snapshot (start_after_snapshot_id)"
            )
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id in ids and (not added_only or entry.status == ManifestEntryStatus.ADDED):
                files[entry.data_file.file_path] = entry.data_file


def _operation(snapshot: Snapshot) -> Operation | None:
    return snapshot.summary.operation if snapshot.summary is not None else None


def _at_schema_of(metadata: TableMetadata, snapshot: Snapshot) -> TableMetadata:
    """The table's metadata with the snapshot's schema as the current one: the scan's partition
    evaluators and the executors' reader (``TableFiles.scan``) then see the table as it was at the
    range's end, whatever schema changes came after."""
    schema_id = snapshot.schema_id if snapshot.schema_id is not None else metadata.current_schema_id
    return metadata.model_copy(update={"current_schema_id": schema_id})


def _spark_schema(schema: Schema, table: str, owner: str) -> st.StructType:
    """The frame's schema: the Iceberg schema's, required columns not null (``type_mapping``)."""
    fields = []
    for column in schema.fields:
        spark_type = iceberg_to_spark(column.field_type)
        if spark_type is None:
            raise InvalidSinkConfig(
                f"{owner}: column {column.name!r} of {table} is {column.field_type}, which Spark has no type "
                "for; an incremental input reads tables whose columns Spark can hold"
            )
        fields.append(st.StructField(column.name, spark_type, nullable=not column.required))
    return st.StructType(fields)


def _read_task(files: TableFiles, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task: the rows of its files, in the frame's Arrow types (pyiceberg's reader
    may hand large strings, or another spelling of UTC, than Spark expects)."""
    scan = files.scan()
    for batch in batches:
        for path in batch.column("path").to_pylist():
            for read in scan.to_record_batches([FileScanTask(files.files[path])]):
                yield read.cast(schema)


def _owner(spec: EpochJobSpec) -> str:
    return f"sink {spec.sink_id!r} epoch {spec.epoch}"
