"""What the epoch writer costs against plain Spark, and where its per-file metadata comes from.

1. Throughput: rows/s of the epoch writer (``spark.epoch_writer.run``: align, shuffle by partition
   value, pyarrow write on the executors, descriptors from the writer's footer) against plain
   ``DataFrame.write.parquet`` (``partitionBy`` a day column for the partitioned case), at 1M and
   10M rows, unpartitioned and day-partitioned, in one ``local[2]`` session.
2. Descriptor computation at 1,000 and 10,000 files: on Spark executors reading each footer
   (``describe_parquet_file`` in a Spark job), in one process with pyiceberg's own footer reader
   (``parquet_file_to_data_file``, what ``add_files`` does), and from a footer already in memory
   (what the writer does right after closing a file: no storage read).
3. XCom size of the pre-commit metadata of the 10,000 real descriptors: compact JSON vs the
   compressed form the operator returns.

Run: ``.venv/bin/python bench/spark_writer.py [--quick]``; writes ``bench/results/spark_writer.json``
and ``bench/results/spark_writer.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def generate(spark: Any, context: Any) -> Any:
    """Input function for the epoch writer: ``rows`` synthetic rows, one every 0.1 s from the start."""
    from pyspark.sql import functions as F

    rows = int(context.options["rows"])
    return spark.range(0, rows, numPartitions=4).select(
        F.col("id"),
        F.concat(F.lit("customer-"), (F.col("id") % 9973).cast("string")).alias("name"),
        F.timestamp_micros(F.lit(int(START.timestamp() * 1_000_000)) + F.col("id") * 100_000).alias("ts"),
        (F.col("id") % 10_000 / 7.0).alias("amount"),
    )


def _session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("eo-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def throughput(spark: Any, work: Path, sizes: list[int]) -> list[dict[str, Any]]:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType
    from pyspark.sql import functions as F

    from airflow_provider_exactly_once.spark.epoch_writer import run
    from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "ts", TimestamptzType()),
        NestedField(4, "amount", DoubleType()),
    )
    props = {"type": "sql", "uri": f"sqlite:///{work / 'catalog.db'}", "warehouse": f"file://{work / 'warehouse'}"}
    (work / "warehouse").mkdir()
    catalog = load_catalog("bench", **props)
    catalog.create_namespace("b")
    catalog.create_table("b.flat", schema)
    catalog.create_table(
        "b.daily", schema, partition_spec=PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day"))
    )
    results = []
    # Warm-up, not measured: Python workers start and import pyarrow/pyiceberg on first use.
    for rows, measured in [(max(1000, sizes[0] // 100), False)] + [(n, True) for n in sizes]:
        context = type("Ctx", (), {"options": {"rows": rows}})()
        for layout, table in (("unpartitioned", "b.flat"), ("day-partitioned", "b.daily")):
            spec = EpochJobSpec.model_validate(
                {
                    "sink_id": "bench",
                    "epoch": 0,
                    "write_id": str(uuid.uuid4()),
                    "data_interval_start": START,
                    "data_interval_end": START + dt.timedelta(days=1),
                    "input": {"kind": "function", "callable": "bench.spark_writer:generate", "options": {"rows": rows}},
                    "target": {"kind": "iceberg", "catalog_name": "bench", "catalog_properties": props, "table": table},
                    "output_path": str(work / "out.json"),
                }
            )
            began = time.perf_counter()
            pre_commit = run(spark, spec, [])
            writer_s = time.perf_counter() - began
            assert pre_commit.record_count == rows

            frame = generate(spark, context)
            target = work / f"plain-{layout}-{rows}"
            began = time.perf_counter()
            if layout == "unpartitioned":
                frame.write.parquet(str(target))
            else:
                frame.withColumn("ts_day", F.to_date("ts")).write.partitionBy("ts_day").parquet(str(target))
            plain_s = time.perf_counter() - began
            files = len(list(target.rglob("*.parquet")))
            if not measured:
                continue
            result = {
                "rows": rows,
                "layout": layout,
                "epoch_writer_s": round(writer_s, 2),
                "epoch_writer_rows_per_s": round(rows / writer_s),
                "epoch_writer_files": len(pre_commit.tables[0].data_files),
                "plain_write_s": round(plain_s, 2),
                "plain_write_rows_per_s": round(rows / plain_s),
                "plain_write_files": files,
                "ratio": round(writer_s / plain_s, 2),
            }
            print(json.dumps(result), flush=True)
            results.append(result)
            shutil.rmtree(target, ignore_errors=True)
    return results


def descriptors(spark: Any, work: Path, counts: list[int]) -> tuple[list[dict[str, Any]], list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import PyArrowFileIO, parquet_file_to_data_file
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "amount", DoubleType()),
    )
    arrow_schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
            pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
            pa.field("amount", pa.float64(), metadata={b"PARQUET:field_id": b"3"}),
        ]
    )
    directory = work / "files"
    directory.mkdir()
    paths: list[str] = []
    last_descriptors: list[Any] = []
    results = []
    for count in counts:
        while len(paths) < count:
            i = len(paths)
            table = pa.table(
                {
                    "id": list(range(i * 100, i * 100 + 100)),
                    "name": [f"n{i}-{k}" for k in range(100)],
                    "amount": [k / 3 for k in range(100)],
                },
                schema=arrow_schema,
            )
            path = str(directory / f"{i:06d}-{uuid.uuid4().hex[:8]}.parquet")
            pq.write_table(table, path)
            paths.append(path)
        selected = paths[:count]

        def describe(path: str) -> str:
            return describe_parquet_file(path, table_schema=schema, partition={}).model_dump_json(exclude_defaults=True)

        spark.sparkContext.parallelize(selected[:4], 2).map(describe).collect()  # warm-up
        began = time.perf_counter()
        spark_rows = spark.sparkContext.parallelize(selected, 2).map(describe).collect()
        spark_s = time.perf_counter() - began

        metadata = new_table_metadata(schema, PartitionSpec(), _unsorted(), f"file://{work}/t", {})
        io = PyArrowFileIO()
        began = time.perf_counter()
        for path in selected:
            parquet_file_to_data_file(io, metadata, path)
        pyiceberg_s = time.perf_counter() - began

        footers = [pq.read_metadata(p) for p in selected[: min(count, 1000)]]
        began = time.perf_counter()
        for path, footer in zip(selected, footers, strict=False):
            describe_parquet_file(
                path, table_schema=schema, partition={}, parquet_metadata=footer, file_size_in_bytes=1
            )
        in_memory_per_file = (time.perf_counter() - began) / len(footers)

        result = {
            "files": count,
            "spark_executors_s": round(spark_s, 2),
            "pyiceberg_one_process_s": round(pyiceberg_s, 2),
            "from_writer_footer_ms_per_file": round(in_memory_per_file * 1000, 3),
        }
        print(json.dumps(result), flush=True)
        results.append(result)
        last_descriptors = spark_rows
    return results, last_descriptors


def _unsorted() -> Any:
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    return UNSORTED_SORT_ORDER


def xcom_size(descriptor_json: list[str], location: str) -> dict[str, Any]:
    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.operators.spark_precommit import xcom_value

    write_id = str(uuid.uuid4())
    write_location = f"{location}/data/_eo/{write_id}"
    data_files = []
    for i, text in enumerate(descriptor_json):
        descriptor = json.loads(text)
        descriptor["path"] = f"{write_location}/{i % 16:05d}-0-{uuid.uuid4().hex[:12]}.parquet"
        descriptor["writer"] = f"{i % 16:05d}-0"
        data_files.append(descriptor)
    pre_commit = PreCommit.parse(
        {
            "sink_id": "bench",
            "epoch": 0,
            "write_id": write_id,
            "tables": [{"table": "b.t", "location": write_location, "data_files": data_files}],
        }
    )
    value = xcom_value(pre_commit)
    return {
        "files": len(data_files),
        "full_json_bytes": len(pre_commit.to_json()),
        "compact_json_bytes": len(pre_commit.model_dump_json(exclude_defaults=True)),
        "xcom_bytes": len(value if isinstance(value, str) else json.dumps(value)),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['rows'] // 1_000_000}M {r['layout']}" for r in report["throughput"]]
    x = range(len(labels))
    left.bar(
        [i - 0.2 for i in x], [r["epoch_writer_rows_per_s"] for r in report["throughput"]], 0.4, label="epoch writer"
    )
    left.bar(
        [i + 0.2 for i in x],
        [r["plain_write_rows_per_s"] for r in report["throughput"]],
        0.4,
        label="DataFrame.write.parquet",
    )
    left.set_xticks(list(x), labels, rotation=15)
    left.set_ylabel("rows/s (local[2])")
    left.set_title("Write throughput")
    left.legend()
    files = [r["files"] for r in report["descriptors"]]
    right.plot(
        files, [r["spark_executors_s"] for r in report["descriptors"]], "o-", label="Spark executors (footer read)"
    )
    right.plot(
        files, [r["pyiceberg_one_process_s"] for r in report["descriptors"]], "s-", label="pyiceberg, one process"
    )
    right.set_xscale("log")
    right.set_xlabel("files")
    right.set_ylabel("seconds")
    right.set_title("Descriptor computation")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k/1M rows and 200/1,000 files")
    args = parser.parse_args()
    sizes = [100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000]
    counts = [200, 1_000] if args.quick else [1_000, 10_000]
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="eo-bench-"))
    spark = _session()
    try:
        report: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "master": "local[2]", "note": "cores shared with other jobs"},
            "throughput": throughput(spark, work, sizes),
        }
        report["descriptors"], last = descriptors(spark, work, counts)
        report["xcom"] = xcom_size(last, f"file://{work}/warehouse/b/t")
        print(json.dumps(report["xcom"]), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    suffix = "_quick" if args.quick else ""
    (RESULTS / f"spark_writer{suffix}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, RESULTS / f"spark_writer{suffix}.png")
    print(f"wrote {RESULTS / f'spark_writer{suffix}.json'} and .png")


if __name__ == "__main__":
    main()
