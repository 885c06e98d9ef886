"""The PySpark application ``spark-submit`` runs for one epoch: the first phase of the commit.

Usage: ``spark-submit .../epoch_writer.py <job spec JSON, or path of a file holding it>``.

It reads the epoch's input, fits it to the target's schema (refusing before any write), writes
Parquet files in parallel below a location unique to this write, describes each file on the
executor that wrote it, and writes the pre-commit metadata JSON to the spec's ``output_path``. It
makes nothing visible: the commit does that later, from the metadata alone.

Exit status: 0 with the metadata written; 1 on a failed write, with one line starting with
``ERROR_PREFIX`` on stderr (spark-submit forwards it to its stdout) and the same text in
``<output_path>.error`` (the operator raises it);
2 for a spec that cannot be read. A failed write deletes what it wrote, best effort: its location is
its own, nothing else can reference it, and whatever is left there is an orphan recovery removes.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import traceback
from collections.abc import Sequence

import fsspec
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_exactly_once.core.errors import ExactlyOnceError
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite, WrittenColumn
from airflow_provider_exactly_once.spark.alignment import (
    AlignmentPlan,
    ColumnPlan,
    plan_alignment,
    spark_schema_to_iceberg,
)
from airflow_provider_exactly_once.spark.file_writer import DESCRIPTOR_COLUMN, FileWriteConfig, spark_task
from airflow_provider_exactly_once.spark.inputs import read_input
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec, IcebergTarget
from airflow_provider_exactly_once.spark.targets import load_file_target, load_iceberg_target

ERROR_PREFIX = "EXACTLY-ONCE WRITE FAILED:"
EXIT_OK, EXIT_FAILED, EXIT_BAD_SPEC = 0, 1, 2

log = logging.getLogger("airflow_provider_exactly_once.spark.epoch_writer")


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
        # Temporal partition transforms are defined in UTC; Spark's date functions use this zone.
        .config("spark.sql.session.timeZone", "UTC")
        # A speculative duplicate of a write task would only leave an unreferenced file; no gain.
        .config("spark.speculation", "false")
        .getOrCreate()
    )
    written: list[str] = []
    try:
        pre_commit = run(spark, spec, written)
        _write_text(spec.output_path, pre_commit.model_dump_json(exclude_defaults=True))
        files = sum(len(t.data_files) for t in pre_commit.tables)
        print(f"exactly-once write done: {pre_commit.describe()}: {files} file(s)", file=sys.stderr)
        return EXIT_OK
    except Exception as exc:
        message = f"sink {spec.sink_id!r} epoch {spec.epoch} write {spec.write_id}: {describe_failure(exc)}"
        traceback.print_exc(file=sys.stderr)
        print(f"{ERROR_PREFIX} {message}", file=sys.stderr)
        _remove_locations(written)
        try:
            _write_text(spec.output_path + ".error", message)
        except Exception as write_error:  # the stderr line above still carries the message
            print(f"(could not write {spec.output_path}.error: {write_error})", file=sys.stderr)
        return EXIT_FAILED
    finally:
        spark.stop()


def run(spark: SparkSession, spec: EpochJobSpec, written: list[str]) -> PreCommit:
    """The write itself. ``written`` receives the write location just before the first file can
    appear there, so that a failure from then on can clean it up."""
    target = (
        load_iceberg_target(spec.target, spec.write_id)
        if isinstance(spec.target, IcebergTarget)
        else load_file_target(spec.target, spec.write_id)
    )
    source = read_input(spark, spec)
    frame = source.frame
    descriptors: list[DataFileDescriptor] = []
    added_columns: list[WrittenColumn] = []
    schema_written: list[WrittenColumn] = []
    if target.schema is not None:
        schema_written = AlignmentPlan(columns=[], write_schema=target.schema).written_columns()

    if frame is not None:
        if target.schema is not None:
            plan = plan_alignment(
                frame.schema,
                target.schema,
                table=target.name,
                last_column_id=target.last_column_id,
                allow_schema_evolution=spec.allow_schema_evolution,
            )
        else:
            plan = AlignmentPlan(
                columns=[ColumnPlan(source=f.name, target=f.name, cast_to=None) for f in frame.schema.fields],
                write_schema=spark_schema_to_iceberg(frame.schema),
            )
        target.check_partition_sources(plan.write_schema)
        aligned = frame.select(
            *[
                (F.col(_quote(c.source)).cast(c.cast_to) if c.cast_to is not None else F.col(_quote(c.source))).alias(
                    c.target
                )
                for c in plan.columns
            ]
        )
        keys = target.spark_sort_keys(plan.write_schema, {c.target for c in plan.columns})
        if keys:
            # Hash-partition by the partition values: each value goes to one task, so it becomes one
            # file (or a few, past the target size) instead of one per input split.
            writers = spec.writers or int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
            aligned = aligned.repartition(writers, *keys).sortWithinPartitions(*keys)
        elif spec.writers:
            aligned = aligned.repartition(spec.writers)
        config = FileWriteConfig(
            location=target.location,
            write_schema=plan.write_schema,
            spec=target.spec_for(plan.write_schema),
            partition_style=target.partition_style,
            table_properties=target.write_properties,
            io_properties=target.io_properties,
            checked_required=tuple(plan.checked_required),
            target_file_size=spec.target_file_size_bytes or target.target_file_size,
        )
        written.append(target.location)
        rows = aligned.mapInArrow(functools.partial(spark_task, config), f"{DESCRIPTOR_COLUMN} string").collect()
        descriptors = [DataFileDescriptor.model_validate_json(row[0]) for row in rows]
        schema_written = plan.written_columns()
        added_columns = plan.added_columns

    return PreCommit(
        sink_id=spec.sink_id,
        epoch=spec.epoch,
        write_id=spec.write_id,
        tables=[
            TableWrite(
                table=target.name,
                location=target.location,
                data_files=descriptors,
                schema_written=schema_written,
                added_columns=added_columns,
                spec_id=target.spec_id,
            )
        ],
        source_positions=source.source_positions,
    )


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Nulls|Mismatch|Failed|Table)): (.+)$")


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


def _remove_locations(locations: list[str]) -> None:
    for location in locations:
        try:
            fs, raw = fsspec.core.url_to_fs(location)
            if fs.exists(raw):
                fs.rm(raw, recursive=True)
        except Exception as exc:  # an orphan left behind is recovery's to remove
            print(f"could not remove the failed write's location {location}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
