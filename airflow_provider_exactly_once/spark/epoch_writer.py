"""The PySpark application ``spark-submit`` runs for one epoch, the first phase of the commit: it reads
the input once, fits it to every target, writes the files and leaves the pre-commit, making nothing
visible (design.md D17); ``write_epoch`` is the same write for a PySpark job of one's own.

Usage: ``spark-submit .../epoch_writer.py <job spec JSON, or path of a file holding it>``. Exit 0
with the metadata written; 2 for an unreadable spec; 1 on a failed write, which deletes what it wrote
(best effort: the rest is an orphan recovery removes), with one ``ERROR_PREFIX`` line on stderr and
the same text in ``<output_path>.error`` when given. Credentials: the spec's alone (design.md D13).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.transforms import IdentityTransform
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig, SchemaMismatch, UnknownTable
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts
from airflow_provider_exactly_once.sinks.layout import (
    PRE_COMMIT_FILE,
    iceberg_data_root,
    iceberg_write_location,
    pre_commit_from_file,
    pre_commit_to_file,
)
from airflow_provider_exactly_once.spark import writers
from airflow_provider_exactly_once.spark.alignment import AlignmentPlan, ColumnPlan, plan_alignment
from airflow_provider_exactly_once.spark.file_io import put_small_file, read_small_file, remove_tree, storage_properties
from airflow_provider_exactly_once.spark.inputs import read_input
from airflow_provider_exactly_once.spark.jobspec import (
    INPUT_VIEW,
    EpochJobSpec,
    FileSinkTarget,
    IcebergTarget,
    TargetSpec,
)
from airflow_provider_exactly_once.spark.upsert import (
    CHECKED,
    OP,
    ORDER,
    Owner,
    Rewrite,
    RewriteWriter,
    check_key,
    copy_on_write,
    no_changes,
    one_change_per_key,
    read_changes,
    refuse_faults,
    row_columns,
)
from airflow_provider_exactly_once.spark.writers import (
    DEFAULT_TARGET_FILE_SIZE,
    IDENTITY_SOURCES,
    ArrowFileWriter,
    DataFileWriter,
    FileWrite,
    SparkParquetWriter,
    check_spec,
    quote,
)
from airflow_provider_exactly_once.type_mapping import spark_schema_to_iceberg

ERROR_PREFIX = "EXACTLY-ONCE WRITE FAILED:"
EXIT_OK, EXIT_FAILED, EXIT_BAD_SPEC = 0, 1, 2

log = logging.getLogger("airflow_provider_exactly_once.spark.epoch_writer")

#: The session settings of every write, ``spark-submit``'s and Spark Connect's (``connect_write``):
#: temporal partition transforms are defined in UTC, the zone Spark's date functions then use; and
#: what Spark's Parquet writer needs for Iceberg's files, set once instead of around each write.
SESSION_SETTINGS: dict[str, str] = {"spark.sql.session.timeZone": "UTC", **writers.SESSION_CONF}


@dataclass(frozen=True)
class WriteLocation:
    """A folder this write may have put files in, and how to reach it to remove them."""

    location: str
    io_properties: dict[str, str]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(
            f"{ERROR_PREFIX} expected one argument, the job spec (JSON or a file path), got {len(args)}",
            file=sys.stderr,
        )
        return EXIT_BAD_SPEC
    try:
        spec = EpochJobSpec.load(args[0])
    except ExactlyOnceError as exc:
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC

    spark = (
        SparkSession.builder.appName(f"exactly-once {spec.sink_id} epoch {spec.epoch}")
        # A speculative duplicate of a write task would only leave an unreferenced file; no gain.
        .config("spark.speculation", "false")
        .config(map=dict[str, Any](SESSION_SETTINGS))
        .getOrCreate()
    )
    written: list[WriteLocation] = []
    try:
        pre_commit = run(spark, spec, written)
        if spec.output_path is not None:
            _write_text(spec.output_path, pre_commit.model_dump_json(exclude_defaults=True))
        files = sum(len(t.data_files) for t in pre_commit.tables)
        changes = "".join(
            f"; {t.table}: {t.changes.describe()}, {len(t.rewritten)} file(s) rewritten"
            for t in pre_commit.tables
            if t.changes is not None
        )
        print(f"exactly-once write done: {pre_commit.describe()}: {files} file(s){changes}", file=sys.stderr)
        return EXIT_OK
    except Exception as exc:
        cause = describe_failure(exc)
        traceback.print_exc(file=sys.stderr)
        print(
            f"{ERROR_PREFIX} sink {spec.sink_id!r} epoch {spec.epoch} write {spec.write_id}: {cause}", file=sys.stderr
        )
        _remove_locations(written)
        if spec.output_path is not None:
            try:
                _write_text(spec.output_path + ".error", cause)
            except Exception as write_error:  # the stderr line above still carries the message
                print(f"(could not write {spec.output_path}.error: {write_error})", file=sys.stderr)
        return EXIT_FAILED
    finally:
        spark.stop()


def write_epoch(spark: SparkSession, spec: EpochJobSpec) -> PreCommit:
    """Write the epoch ``spec`` describes with ``spark`` and return its pre-commit: the function to
    call from a PySpark job of one's own (on any platform, classic or Spark Connect).

    The contract with the rest of the pipeline (docs/operators.md, "Writing an epoch from any Spark
    job"): the files go below the write location of ``spec.write_id`` in each target, and the
    pre-commit is left in the first target's location (``PRE_COMMIT_FILE``). A write task that
    returns it through XCom hands it to persist directly; one that returns nothing leaves persist to
    find it there. A failed write removes what it wrote.
    """
    return run(spark, spec, [])


def run(spark: SparkSession, spec: EpochJobSpec, written: list[WriteLocation]) -> PreCommit:
    """The write itself: every target from one read of the input, as one pre-commit.

    ``written`` receives each write location (with the FileIO properties that reach it) just before
    the first file can appear there. When any
    target fails, the locations of all of them are removed before the error goes on: the tables of
    one epoch are committed together, so the first table's files could never be committed alone.
    """
    try:
        return _write_targets(spark, spec, written)
    except BaseException:
        _remove_locations(written)
        raise


def _write_targets(spark: SparkSession, spec: EpochJobSpec, written: list[WriteLocation]) -> PreCommit:
    # Every table is loaded and checked before the input is read, and every table's rows are fitted
    # to its schema before the first file is written: a refusal writes nothing anywhere.
    targets = [
        (
            t,
            load_iceberg_target(t, spec.write_id)
            if isinstance(t, IcebergTarget)
            else load_file_target(t, spec.write_id),
        )
        for t in spec.targets
    ]
    source = read_input(spark, spec)
    frame = source.frame
    cached = frame is not None and len(targets) > 1
    if frame is not None and cached:
        # Read once: without the cache each table's job would read (and parse) the input again,
        # and an input that changed between reads would give the tables different rows.
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    viewed = frame is not None and any(isinstance(t, IcebergTarget) and t.query is not None for t, _ in targets)
    try:
        if frame is not None and viewed:
            frame.createOrReplaceTempView(INPUT_VIEW)
        planned = [(target, _plan(spark, spec, t, target, _select(spark, frame, t), written)) for t, target in targets]
        tables = [
            _write_table(spec, target, plan, written, upsert=_empty_upsert(t, target))
            for (target, plan), (t, _) in zip(planned, targets, strict=True)
        ]
    finally:
        if viewed:
            spark.catalog.dropTempView(INPUT_VIEW)
        if frame is not None and cached:
            frame.unpersist()
    pre_commit = PreCommit(
        sink_id=spec.sink_id,
        epoch=spec.epoch,
        write_id=spec.write_id,
        tables=tables,
        source_positions=source.source_positions,
    )
    # Left where persist finds it when the task cannot hand it over (``sinks/layout.py``); an empty
    # write's location holds this file alone.
    first = targets[0][1]
    written.append(WriteLocation(first.location, first.io_properties))
    put_small_file(
        f"{first.location}/{PRE_COMMIT_FILE}",
        pre_commit_to_file(pre_commit.model_dump_json(exclude_defaults=True).encode()),
        first.io_properties,
    )
    return pre_commit


def _select(spark: SparkSession, frame: DataFrame | None, target: TargetSpec) -> DataFrame | None:
    """The part of the epoch's input one table gets (all of it unless its target says otherwise)."""
    if frame is None or not isinstance(target, IcebergTarget):
        return frame
    if target.where is not None:
        return frame.where(F.expr(target.where))
    if target.query is not None:
        return spark.sql(target.query)
    return frame


@dataclass(frozen=True)
class _Planned:
    """One table's rows, fitted to its schema, and how they are to be written."""

    frame: DataFrame
    alignment: AlignmentPlan
    #: An upsert's copy-on-write (its rows are staged: ``frame`` is then the changes they came from).
    rewrite: Rewrite | None = None


def _plan(
    spark: SparkSession,
    spec: EpochJobSpec,
    given: TargetSpec,
    target: ResolvedTarget,
    frame: DataFrame | None,
    written: list[WriteLocation],
) -> _Planned | None:
    """How a table's rows are written. An upsert's pass over its changes stages their rows in the
    write location already (``stage_changes``), which is therefore in ``written`` from then on."""
    upsert = given.upsert if isinstance(given, IcebergTarget) else None
    if upsert is None or not isinstance(given, IcebergTarget):
        return None if frame is None else _align(spec, target, frame)
    owner = Owner(spec.sink_id, spec.epoch, target.name)
    check_key(target.table, upsert, owner)
    revision = given.revision
    if revision is not None and revision.table_uuid not in (None, str(target.table.metadata.table_uuid)):
        revision = None  # the table was re-created since the epoch's commit: persist re-opens the epoch
    if frame is None:
        if revision is None:
            return None  # no input: an epoch without changes (``_write_table``)
        # A revision without changes still undoes the revised write's: no change rows, same path.
        frame = no_changes(spark, target.table.schema(), upsert, owner)
    changes = read_changes(frame, upsert, owner)
    table_columns = {f.name for f in target.table.schema().fields}
    picked = row_columns(one_change_per_key(changes, upsert), upsert, table_columns)
    aligned = _align(spec, target, picked, carry=(OP, ORDER, *CHECKED))
    written.append(WriteLocation(target.location, target.io_properties))
    rewrite = copy_on_write(
        spark,
        target.table,
        given.branch,
        upsert,
        aligned.frame,
        owner,
        _file_write(spec, target, aligned.alignment),
        functools.partial(refuse_faults, changes=changes, upsert=upsert, owner=owner),
        revision,
    )
    return _Planned(aligned.frame, aligned.alignment, rewrite)


def _align(spec: EpochJobSpec, target: ResolvedTarget, frame: DataFrame, carry: tuple[str, ...] = ()) -> _Planned:
    """The rows fitted to the table's schema; ``carry`` columns pass through unaligned."""
    carried = [name for name in carry if name in frame.columns]
    data = frame.drop(*carried) if carried else frame
    if target.schema is not None:
        plan = plan_alignment(
            data.schema,
            target.schema,
            table=target.name,
            last_column_id=target.last_column_id,
            allow_schema_evolution=spec.allow_schema_evolution,
        )
    else:
        plan = AlignmentPlan(
            columns=[ColumnPlan(source=f.name, target=f.name, cast_to=None) for f in data.schema.fields],
            write_schema=spark_schema_to_iceberg(data.schema),
        )
    target.check_partition_sources(plan.write_schema)
    aligned = frame.select(
        *[
            (F.col(quote(c.source)).cast(c.cast_to) if c.cast_to is not None else F.col(quote(c.source))).alias(
                c.target
            )
            for c in plan.columns
        ],
        *[F.col(quote(name)) for name in carried],
    )
    return _Planned(aligned, plan)


def _empty_upsert(given: TargetSpec, target: ResolvedTarget) -> dict[str, Any]:
    """What an upsert epoch without input records: no changes, and the snapshot it saw, which a
    later revision of the epoch is planned at (``core.decisions``)."""
    if not isinstance(given, IcebergTarget) or given.upsert is None:
        return {}
    head = target.table.metadata.snapshot_by_name(given.branch)
    return {"changes": ChangeCounts(), "read_snapshot_id": None if head is None else head.snapshot_id}


def _write_table(
    spec: EpochJobSpec,
    target: ResolvedTarget,
    planned: _Planned | None,
    written: list[WriteLocation],
    *,
    upsert: dict[str, Any],
) -> TableWrite:
    if planned is None:
        schema_written = (
            AlignmentPlan(columns=[], write_schema=target.schema).written_columns() if target.schema is not None else []
        )
        return TableWrite(
            table=target.name,
            location=target.location,
            schema_written=schema_written,
            spec_id=target.spec_id,
            **upsert,
        )
    plan = planned.alignment
    if planned.rewrite is None:  # an upsert's location is there since its rows were staged
        written.append(WriteLocation(target.location, target.io_properties))
    data_files = _write_files(spec, target, planned)
    rewrite = planned.rewrite
    return TableWrite(
        table=target.name,
        location=target.location,
        data_files=data_files,
        schema_written=plan.written_columns(),
        added_columns=plan.added_columns,
        spec_id=target.spec_id,
        **(
            {}
            if rewrite is None
            else {
                "rewritten": rewrite.rewritten,
                "read_snapshot_id": rewrite.read_snapshot_id,
                "key_lower_bounds": rewrite.key_lower_bounds,
                "key_upper_bounds": rewrite.key_upper_bounds,
                "changes": rewrite.changes,
                "revises": rewrite.revises,
            }
        ),
    )


def _write_files(spec: EpochJobSpec, target: ResolvedTarget, planned: _Planned) -> list[DataFileDescriptor]:
    write = _file_write(spec, target, planned.alignment)
    return choose_writer(target.name, write, planned.rewrite).write(planned.frame, write)


def _file_write(spec: EpochJobSpec, target: ResolvedTarget, plan: AlignmentPlan) -> FileWrite:
    return FileWrite(
        location=target.location,
        write_schema=plan.write_schema,
        spec=target.spec_for(plan.write_schema),
        partition_style=target.partition_style,
        table_properties=target.write_properties,
        io_properties=target.io_properties,
        checked_required=tuple(plan.checked_required),
        target_file_size=spec.target_file_size_bytes or target.target_file_size,
        writers=spec.writers,
    )


def choose_writer(table: str, write: FileWrite, rewrite: Rewrite | None) -> DataFileWriter:
    """Which writer writes a table's files, and why: Spark's own Parquet writer wherever its files
    can be what the table needs (``writers.refusal`` names where they cannot: object stores,
    list and map columns, ...), else the pyarrow writer on the executors. A file sink's partition
    directories are Hive-style, which only the pyarrow writer names, and an upsert's rewrite reads
    and writes on the executors as one step."""
    reason = (
        "a file sink"
        if write.partition_style != "iceberg"
        else "an upsert"
        if rewrite is not None
        else writers.refusal(write.location, write.write_schema, write.spec, write.table_properties)
    )
    if reason is None:
        log.info("%s: Spark's Parquet writer writes the files", table)
        return SparkParquetWriter()
    log.info("%s: the pyarrow writer writes the files (%s)", table, reason)
    if rewrite is not None:
        return RewriteWriter(rewrite.files, rewrite.key, rewrite.staged)
    return ArrowFileWriter()


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Nulls|Mismatch|Failed|Table)): (.+)$")


def left_pre_commit(spec: EpochJobSpec) -> PreCommit | None:
    """The pre-commit a finished write of ``spec`` left in its first target's location, or ``None``:
    how a task that cannot see its driver's files (cluster deploy mode, a remote driver) gets it."""
    first = spec.targets[0]
    if isinstance(first, IcebergTarget):
        target = load_iceberg_target(first, spec.write_id)
    else:
        target = load_file_target(first, spec.write_id)
    data = read_small_file(f"{target.location}/{PRE_COMMIT_FILE}", target.io_properties)
    return None if data is None else PreCommit.from_json(pre_commit_from_file(data))


def describe_failure(exc: BaseException) -> str:
    """One line a person can act on. Spark wraps executor failures in JVM stack traces; the line
    that matters is the last Python exception raised in the task, so that is what is kept."""
    if isinstance(exc, ExactlyOnceError):
        return f"{type(exc).__name__}: {exc}"
    java = getattr(exc, "java_exception", None)
    if java is not None:  # a JVM failure (py4j): its deepest cause names the file or row at fault
        try:
            while java.getCause() is not None and java.getCause() != java:
                java = java.getCause()
            return f"{java.getClass().getSimpleName()}: {java.getMessage()}"
        except Exception:  # the JVM may be gone already; fall back to the text
            pass
    text = str(exc)
    found = [m for m in (_EXCEPTION_LINE.match(line.strip()) for line in text.splitlines()) if m]
    if found:
        last = found[-1]
        return f"{last.group(1)}: {last.group(2)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:2000]}"


def _write_text(path: str, text: str) -> None:
    """Write, then rename into place: the operator never reads a half-written file."""
    fs, raw = fsspec.core.url_to_fs(path)
    temporary = raw + ".tmp"
    with fs.open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    fs.mv(temporary, raw)


def _remove_locations(locations: list[WriteLocation]) -> None:
    for written in locations:
        try:
            remove_tree(written.location, written.io_properties)
        except Exception as exc:  # an orphan left behind is recovery's to remove
            print(f"could not remove the failed write's location {written.location}: {exc}", file=sys.stderr)


# Where an epoch's files go: both kinds of target are reduced to the same few facts the write needs
# (location, schema, partitioning, writer properties, and the FileIO properties that reach the
# files), so the write path has no branch per sink kind. Partitioning is checked here
# (``check_spec``), before the input is read.

FILE_SINK_PARTITION_FIELD_ID = 1000


@dataclass
class ResolvedTarget:
    name: str
    location: str
    #: The table's schema; ``None`` for a file sink, whose schema is the DataFrame's.
    schema: Schema | None
    last_column_id: int
    partition_style: Literal["iceberg", "hive"]
    spec: PartitionSpec | None = None
    #: The id of ``spec`` in the table, recorded so the commit files the write under the spec it was
    #: partitioned for even if the table's spec changes before then; ``None`` for a file sink.
    spec_id: int | None = None
    partition_by: list[str] = field(default_factory=list)
    write_properties: dict[str, str] = field(default_factory=dict)
    io_properties: dict[str, str] = field(default_factory=dict)
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    #: The loaded pyiceberg table (an Iceberg target): an upsert plans its rewrite from it.
    table: Any = None

    def spec_for(self, write_schema: Schema) -> PartitionSpec:
        if self.spec is not None:
            return self.spec
        return PartitionSpec(
            *[
                PartitionField(
                    source_id=write_schema.find_field(name).field_id,
                    field_id=FILE_SINK_PARTITION_FIELD_ID + i,
                    transform=IdentityTransform(),
                    name=name,
                )
                for i, name in enumerate(self.partition_by)
            ]
        )

    def check_partition_sources(self, write_schema: Schema) -> None:
        if self.spec is not None:
            return  # checked against the table's own schema when it was loaded
        names = {f.name: f for f in write_schema.fields}
        for name in self.partition_by:
            if name not in names:
                raise SchemaMismatch(f"file sink {self.name!r}: partition column {name!r} is not in the input")
            if not isinstance(names[name].field_type, IDENTITY_SOURCES):
                raise SchemaMismatch(
                    f"file sink {self.name!r}: partition column {name!r} has type {names[name].field_type}; "
                    "partition directories take boolean, integer, floating, string, date or timestamp values"
                )


def load_iceberg_target(target: IcebergTarget, write_id: str) -> ResolvedTarget:
    catalog = load_catalog(target.catalog_name, **target.catalog_properties)
    try:
        table = catalog.load_table(target.table)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise UnknownTable(f"catalog {target.catalog_name!r} has no table {target.table!r}: {exc}") from None
    schema = table.schema()
    spec = table.spec()
    check_spec(target.table, spec, schema)
    properties = dict(table.properties)
    data_root = iceberg_data_root(table.location(), properties)
    return ResolvedTarget(
        name=target.table,
        location=iceberg_write_location(data_root, write_id),
        schema=schema,
        last_column_id=table.metadata.last_column_id,
        partition_style="iceberg",
        spec=spec,
        spec_id=spec.spec_id,
        write_properties=properties,
        # The catalog's storage properties, then what the loaded table's FileIO holds: a REST catalog
        # that vends credentials puts them there, scoped to this table, and they win.
        io_properties=storage_properties({**target.catalog_properties, **table.io.properties}),
        target_file_size=int(properties.get(TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE)),
        table=table,
    )


def load_file_target(target: FileSinkTarget, write_id: str) -> ResolvedTarget:
    if len(set(target.partition_by)) != len(target.partition_by):
        raise InvalidSinkConfig(f"file sink {target.root!r}: a partition column is listed twice")
    return ResolvedTarget(
        name=target.root,
        location=target.write_location(write_id),
        schema=None,
        last_column_id=0,
        partition_style="hive",
        partition_by=list(target.partition_by),
        write_properties=dict(target.write_properties),
        io_properties=dict(target.io_properties),
        target_file_size=int(
            target.write_properties.get(TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE)
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
