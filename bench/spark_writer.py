"""What the epoch writer costs against plain Spark, and the whole epoch against doing it by hand.

1. Epochs, at 1M and 10M rows, unpartitioned, identity-partitioned (8 regions) and day-partitioned,
   in one ``local[2]`` session, in alternated pairs (the side that goes first switches each pair):

   - ours: ``spark.epoch_writer.run`` (Spark's Parquet writer with field ids, descriptors from the
     footers on the executors), then persist, checkpoint and commit through the coordinator (SQLite
     catalog and meta store);
   - plain: ``df.write.partitionBy(<the same partition values>).parquet(...)`` into the table's data
     folder, then pyiceberg's ``Table.add_files``, which reads every footer again to commit.

   Two ratios per layout, each the median of the per-pair ratios: the writer's throughput against
   the plain write's, and the whole epoch's against write + ``add_files``.
2. Descriptor computation at 1,000 and 10,000 files: on Spark executors reading each footer
   (``describe_parquet_file`` in a Spark job), in one process with pyiceberg's own footer reader
   (``parquet_file_to_data_file``, what ``add_files`` does), and from a footer already in memory.
3. XCom size of the pre-commit metadata of the 10,000 real descriptors: compact JSON vs the
   compressed form the operator returns.

Run: ``.venv/bin/python -m bench.spark_writer [--quick] [--pairs N] [--spark connect]``; writes
``bench/results/spark_writer.json`` and ``bench/results/spark_writer.png``. With ``--spark connect``
both sides of part 1 run as clients of one Spark Connect server (``local[2]``, the same settings,
started here and warmed up like the in-process session): the same writer code on the other path.
Parts 2 and 3 are the in-process session's alone (they call the executors through an RDD); the
results go to ``spark_writer_connect.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
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
    """Input function for the epoch writer: ``rows`` synthetic rows, one every 0.1 s from the start,
    in eight regions."""
    from pyspark.sql import functions as F

    rows = int(context.options["rows"])
    return spark.range(0, rows, numPartitions=4).select(
        F.col("id"),
        F.concat(F.lit("customer-"), (F.col("id") % 9973).cast("string")).alias("name"),
        F.concat(F.lit("region-"), (F.col("id") % 8).cast("string")).alias("region"),
        F.timestamp_micros(F.lit(int(START.timestamp() * 1_000_000)) + F.col("id") * 100_000).alias("ts"),
        (F.col("id") % 10_000 / 7.0).alias("amount"),
    )


#: The session's settings, on both paths. What a do-it-yourself write needs for add_files: Iceberg's
#: timestamps and default codec.
SETTINGS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "zstd",
}


def _session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("eo-bench").config("spark.ui.enabled", "false")
    builder = builder.config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
    for key, value in SETTINGS.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _connect_session(work: Path) -> tuple[Any, Any]:
    """A client session of a Connect server started here with the in-process session's settings."""
    from pyspark.sql import SparkSession

    from demo.servers import SparkConnectServer

    server = SparkConnectServer(work / "spark-connect").start({**SETTINGS, "spark.driver.memory": "2g"})
    return SparkSession.builder.remote(server.url).getOrCreate(), server


#: Each layout: the table's partition spec (field, transform, name) and how the plain write
#: partitions the same rows (a computed column, so its files keep every column as ours do and
#: ``add_files`` can read their partition from them).
LAYOUTS: dict[str, Any] = {
    "unpartitioned": (None, None),
    "identity-partitioned": (("region", "identity", "region"), ("region_p", "region")),
    "day-partitioned": (("ts", "day", "ts_day"), ("ts_day", "to_date(ts)")),
}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class _Epochs:
    """The two sides of one layout: tables, meta store and committer, fresh for every epoch."""

    def __init__(self, work: Path, layout: str) -> None:
        from pyiceberg.catalog import load_catalog

        from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
        from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
        from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
        from airflow_provider_exactly_once.store import SqlSinkStateStore

        self.layout = layout
        self.warehouse = work / f"warehouse-{layout}"
        self.warehouse.mkdir()
        self.props = {
            "type": "sql",
            "uri": f"sqlite:///{work / f'catalog-{layout}.db'}",
            "warehouse": f"file://{self.warehouse}",
        }
        self.catalog = load_catalog("bench", **self.props)
        self.catalog.create_namespace("b")
        self.store = SqlSinkStateStore(f"sqlite:///{work / f'meta-{layout}.db'}")
        self.coordinator = TwoPhaseCommitCoordinator(
            self.store, {layout: IcebergSinkCommitter(self.catalog)}, MetaStoreCheckpointSource(self.store.checkpoints)
        )

    def fresh(self, name: str) -> Any:
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.transforms import DayTransform, IdentityTransform
        from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

        schema = Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "name", StringType()),
            NestedField(3, "region", StringType()),
            NestedField(4, "ts", TimestamptzType()),
            NestedField(5, "amount", DoubleType()),
        )
        partitioning, _ = LAYOUTS[self.layout]
        spec = PartitionSpec()
        if partitioning is not None:
            source, transform, field_name = partitioning
            transforms = {"identity": IdentityTransform(), "day": DayTransform()}
            spec = PartitionSpec(
                PartitionField(schema.find_field(source).field_id, 1000, transforms[transform], field_name)
            )
        identifier = f"b.{name}"
        if self.catalog.table_exists(identifier):
            self.catalog.drop_table(identifier)
        shutil.rmtree(self.warehouse / "b" / name, ignore_errors=True)
        return self.catalog.create_table(identifier, schema, partition_spec=spec)

    def ours(self, spark: Any, rows: int, epoch: int, output: Path) -> dict[str, Any]:
        """The exactly-once epoch: the write, then persist, checkpoint and commit."""
        from airflow_provider_exactly_once.core.epochs import CheckpointStatus
        from airflow_provider_exactly_once.core.outcomes import CommitOutcome
        from airflow_provider_exactly_once.spark.epoch_writer import run
        from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

        self.fresh("ours")
        spec = EpochJobSpec.model_validate(
            {
                "sink_id": self.layout,
                "epoch": epoch,
                "write_id": str(uuid.uuid4()),
                "data_interval_start": START,
                "data_interval_end": START + dt.timedelta(days=1),
                "input": {"kind": "function", "callable": "bench.spark_writer:generate", "options": {"rows": rows}},
                "target": {
                    "kind": "iceberg",
                    "catalog_name": "bench",
                    "catalog_properties": self.props,
                    "table": "b.ours",
                },
                "output_path": str(output),
            }
        )
        began = time.perf_counter()
        pre_commit = run(spark, spec, [])
        written = time.perf_counter()
        self.coordinator.persist(pre_commit)
        self.store.checkpoints.set_checkpoint(self.layout, epoch, CheckpointStatus.COMPLETED)
        outcome = self.coordinator.commit(self.layout, epoch).outcome
        done = time.perf_counter()
        assert outcome is CommitOutcome.COMMITTED, outcome
        assert _table_rows(self.catalog.load_table("b.ours")) == rows == pre_commit.record_count
        return {"write_s": written - began, "commit_s": done - written, "files": len(pre_commit.tables[0].data_files)}

    def plain(self, spark: Any, rows: int) -> dict[str, Any]:
        """What a user would do without the provider: a plain Spark write into the table's data
        folder, then pyiceberg's ``add_files``, which reads every footer to describe the files."""
        from pyspark.sql import functions as F

        location = f"{self.fresh('plain').location()}/data/{uuid.uuid4()}"
        _, partition_by = LAYOUTS[self.layout]
        began = time.perf_counter()
        frame = generate(spark, type("Ctx", (), {"options": {"rows": rows}})())
        if partition_by is None:
            frame.write.parquet(location)
        else:
            column, expression = partition_by
            frame.withColumn(column, F.expr(expression)).write.partitionBy(column).parquet(location)
        written = time.perf_counter()
        files = sorted(f"file://{p}" for p in Path(location.removeprefix("file://")).rglob("*.parquet"))
        self.catalog.load_table("b.plain").add_files(files)
        done = time.perf_counter()
        assert _table_rows(self.catalog.load_table("b.plain")) == rows
        return {"write_s": written - began, "commit_s": done - written, "files": len(files)}

    def close(self) -> None:
        self.store.dispose()


def _table_rows(table: Any) -> int:
    return int(table.current_snapshot().summary["total-records"])


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def epochs(spark: Any, work: Path, sizes: list[int], pairs: int) -> list[dict[str, Any]]:
    """``pairs`` epochs of each side per size and layout, alternated, the side that goes first
    switching from pair to pair, so that load from other jobs on the machine and the JVM warming up
    fall on both sides; medians of each side and of the per-pair ratios."""
    sides = {layout: _Epochs(work, layout) for layout in LAYOUTS}
    results = []
    epoch = 0
    try:
        for side in sides.values():  # warm-up, not measured: Python workers, JIT, catalogs
            for rows in (20_000, sizes[0]):
                epoch += 1
                side.ours(spark, rows, epoch, work / "out.json")
                side.plain(spark, rows)
        for rows in sizes:
            for layout, side in sides.items():
                measured: list[dict[str, Any]] = []
                for pair in range(pairs):
                    epoch += 1
                    load_before = _load()
                    if pair % 2:
                        plain = side.plain(spark, rows)
                        ours = side.ours(spark, rows, epoch, work / "out.json")
                    else:
                        ours = side.ours(spark, rows, epoch, work / "out.json")
                        plain = side.plain(spark, rows)
                    measured.append({"ours": ours, "plain": plain, "load": [load_before, _load()]})
                    print(json.dumps({"rows": rows, "layout": layout, **measured[-1]}), flush=True)
                result = _summary(rows, layout, measured)
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        for side in sides.values():
            side.close()
    return results


def _summary(rows: int, layout: str, measured: list[dict[str, Any]]) -> dict[str, Any]:
    def times(side: str, *parts: str) -> list[float]:
        return [sum(m[side][p] for p in parts) for m in measured]

    ours_write, plain_write = times("ours", "write_s"), times("plain", "write_s")
    ours_epoch, plain_epoch = times("ours", "write_s", "commit_s"), times("plain", "write_s", "commit_s")
    return {
        "rows": rows,
        "layout": layout,
        "pairs": len(measured),
        "epoch_writer_s": _median(ours_write),
        "plain_write_s": _median(plain_write),
        #: Throughput of the epoch writer as a fraction of the plain write's (above 1: faster).
        "writer_ratio": _median([p / o for p, o in zip(plain_write, ours_write, strict=True)]),
        "epoch_s": _median(ours_epoch),
        "commit_s": _median(times("ours", "commit_s")),
        "diy_epoch_s": _median(plain_epoch),
        "add_files_s": _median(times("plain", "commit_s")),
        #: The whole epoch's throughput as a fraction of write.parquet + add_files (above 1: faster).
        "epoch_ratio": _median([p / o for p, o in zip(plain_epoch, ours_epoch, strict=True)]),
        "epoch_writer_files": measured[-1]["ours"]["files"],
        "plain_write_files": measured[-1]["plain"]["files"],
        "epoch_writer_rows_per_s": round(rows / statistics.median(ours_write)),
        "plain_write_rows_per_s": round(rows / statistics.median(plain_write)),
        "load_1min": [m["load"] for m in measured],
    }


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

    described = report.get("descriptors")
    fig, axes = plt.subplots(1, 3 if described else 2, figsize=(17 if described else 11.5, 4.8))
    left, middle = axes[0], axes[1]
    epochs = report["epochs"]
    labels = [f"{r['rows'] // 1_000_000}M\n{r['layout'].replace('-partitioned', '')}" for r in epochs]
    x = list(range(len(labels)))
    for axis, key, title in (
        (left, "writer_ratio", "Epoch writer / df.write.parquet (throughput)"),
        (middle, "epoch_ratio", "Epoch (write + commit) / write.parquet + add_files"),
    ):
        bars = axis.bar(x, [r[key] for r in epochs], 0.6)
        axis.bar_label(bars, fmt="%.2f")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.axhline(0.95, color="red", linestyle="--", linewidth=0.8, label="0.95 target")
        axis.set_xticks(x, labels)
        axis.set_ylim(0, max(1.3, max(r[key] for r in epochs) + 0.15))
        axis.set_title(title, fontsize=10)
        axis.legend(loc="lower right")
    left.set_ylabel(f"median of {epochs[0]['pairs']} alternated pairs ({report['machine']['master']})")
    if described:
        _plot_descriptors(axes[2], described)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_descriptors(right: Any, described: list[dict[str, Any]]) -> None:
    files = [r["files"] for r in described]
    right.plot(files, [r["spark_executors_s"] for r in described], "o-", label="Spark executors (footer read)")
    right.plot(files, [r["pyiceberg_one_process_s"] for r in described], "s-", label="pyiceberg, one process")
    right.set_xscale("log")
    right.set_xlabel("files")
    right.set_ylabel("seconds")
    right.set_title("Describing files from their footers", fontsize=10)
    right.legend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k/1M rows, 2 pairs, 200/1,000 files")
    parser.add_argument("--pairs", type=int, default=5, help="alternated pairs per size and layout")
    parser.add_argument(
        "--spark", choices=["local", "connect"], default="local", help="in process, or a Connect server"
    )
    args = parser.parse_args()
    connect = args.spark == "connect"
    sizes = [100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000]
    counts = [200, 1_000] if args.quick else [1_000, 10_000]
    pairs = 2 if args.quick else args.pairs
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="eo-bench-"))
    spark, server = _connect_session(work) if connect else (_session(), None)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        report: dict[str, Any] = {
            "machine": {
                "cpus": os.cpu_count(),
                "master": "local[2]" + (", a Spark Connect server's" if connect else ", in process"),
                "note": "cores shared with other jobs; load_1min per pair is the 1-minute load before and after",
                "uptime_at_start": uptime,
            },
            "epochs": epochs(spark, work, sizes, pairs),
        }
        if not connect:
            report["descriptors"], last = descriptors(spark, work, counts)
            report["xcom"] = xcom_size(last, f"file://{work}/warehouse/b/t")
            print(json.dumps(report["xcom"]), flush=True)
        report["machine"]["uptime_at_end"] = subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    suffix = ("_connect" if connect else "") + ("_quick" if args.quick else "")
    (RESULTS / f"spark_writer{suffix}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, RESULTS / f"spark_writer{suffix}.png")
    print(f"wrote {RESULTS / f'spark_writer{suffix}.json'} and .png")


if __name__ == "__main__":
    main()
