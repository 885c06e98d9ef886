"""An upsert epoch against pyiceberg's ``Table.upsert`` and a rewrite of the touched partitions.

One table of ``--rows`` rows (``id``, a partition column ``part`` = ``id // (rows / 20)``, a payload),
built three times alike with pyiceberg. Each epoch changes a fraction of it (``--fractions``): nine
in ten changes update random existing keys, one in ten inserts a new key (no deletes:
``Table.upsert`` has none). The same changes go three ways:

1. this package: the changes landed as Parquet, the epoch writer's Spark job (``local[2]``,
   in-process: ``spark.epoch_writer.run``; with ``--spark connect``, as the write task's client of a
   Spark Connect server started here with the same settings: ``spark.connect_write``) applies them
   copy-on-write, then persist and commit through the coordinator (one overwrite snapshot);
2. ``Table.upsert(changes, join_cols=["id"])``, pyiceberg 0.12's own copy-on-write;
3. what a job does without either: read the touched partitions, apply the changes with pyarrow,
   ``Table.overwrite(rows, overwrite_filter=In("part", touched))``.

Measured per way: wall seconds (for 1, the Spark job and the commit apart), bytes written and
files removed (from the snapshots' summaries), bytes written per changed row. Every table is
checked equal to the others afterwards (row count and an order-free checksum). Ratios are of
times measured in the same run.

    uv run python -m bench.upsert_cost [--rows 1000000] [--fractions 0.01 0.1]
    uv run python -m bench.upsert_cost --rows 10000000          # the issue's size; about an hour here
    uv run python -m bench.upsert_cost --rows 10000000 --ways partition_rewrite   # without Table.upsert
    uv run python -m bench.upsert_cost --spark connect [--name NAME]

Writes bench/results/upsert_cost_<rows>[_connect].json and .png (or ``--name``'s).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import In
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from bench._world import RESULTS, save

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "part", LongType(), required=True),
    NestedField(3, "payload", StringType(), required=False),
    NestedField(4, "value", DoubleType(), required=False),
    identifier_field_ids=[1],
)
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "part"))
PARTITIONS = 20
CHUNK = 1_000_000
WAYS = ("exactly_once", "pyiceberg_upsert", "partition_rewrite")


def arrow_rows(ids: pa.Array, span: int, version: str) -> pa.Table:
    return pa.table(
        {
            "id": ids,
            "part": pc.divide(ids, pa.scalar(span, pa.int64())),
            "payload": pc.binary_join_element_wise(pa.scalar(version), pc.cast(ids, pa.string()), "-"),
            "value": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
        },
        schema=SCHEMA.as_arrow(),
    )


def build(catalog: SqlCatalog, name: str, rows: int, span: int) -> Table:
    table = catalog.create_table(f"bench.{name}", SCHEMA, partition_spec=SPEC)
    for start in range(0, rows, CHUNK):
        ids = pa.array(range(start, min(rows, start + CHUNK)), pa.int64())
        table.append(arrow_rows(ids, span, "v0"))
    return catalog.load_table(f"bench.{name}")


def changes_of(rng: random.Random, rows: int, count: int, span: int, epoch: int, next_id: int) -> pa.Table:
    updates = rng.sample(range(rows), count - count // 10)
    inserts = list(range(next_id, next_id + count // 10))
    return arrow_rows(pa.array(sorted(updates) + inserts, pa.int64()), span, f"v{epoch}")


def summary_totals(table: Table, since_id: int | None) -> dict[str, int]:
    """Bytes added and files removed by the snapshots after ``since_id``."""
    added = removed = snapshots = 0
    seen = since_id is None
    for snapshot in table.metadata.snapshots:
        if seen and snapshot.summary is not None:
            added += int(snapshot.summary.get("added-files-size", "0") or 0)
            removed += int(snapshot.summary.get("deleted-data-files", "0") or 0)
            snapshots += 1
        if snapshot.snapshot_id == since_id:
            seen = True
    return {"bytes_written": added, "files_removed": removed, "snapshots": snapshots}


def checksum(table: Table) -> tuple[int, int]:
    data = table.scan(selected_fields=("id", "payload")).to_arrow()
    hashed = pc.sum(pc.cast(pc.utf8_length(data.column("payload")), pa.int64())).as_py() or 0
    return data.num_rows, int(pc.sum(data.column("id")).as_py() or 0) * 31 + int(hashed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.01, 0.1])
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--ways", nargs="*", choices=WAYS, default=list(WAYS), help="which ways to run (exactly_once always runs)"
    )
    parser.add_argument("--spark", choices=["local", "connect"], default="local", help="in process, or Connect")
    parser.add_argument("--name", help="result file name (without extension)")
    args = parser.parse_args()
    ways = tuple(w for w in WAYS if w in args.ways or w == "exactly_once")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from airflow_provider_exactly_once.checkpoints.sources import MetaStoreCheckpointSource
    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.epochs import CheckpointStatus
    from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
    from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

    write, stop = _writer(args.spark)
    span = max(args.rows // PARTITIONS, 1)
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="eo-bench-upsert-") as tmp:
        root = Path(tmp)
        props = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'wh'}"}
        (root / "wh").mkdir()
        catalog = SqlCatalog("bench", **{k: v for k, v in props.items() if k != "type"})
        catalog.create_namespace("bench")
        started = time.perf_counter()
        for way in ways:
            build(catalog, way, args.rows, span)
        print(f"built 3 tables of {args.rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        store = SqlSinkStateStore(f"sqlite:///{root / 'meta.db'}")
        coordinator = TwoPhaseCommitCoordinator(
            store, {"bench-upsert": IcebergSinkCommitter(catalog)}, MetaStoreCheckpointSource(store.checkpoints)
        )
        next_id = args.rows
        # Warm the session up (JVM, Python workers) on a tiny table, untimed: otherwise the first
        # measured epoch pays for it and the fractions are not comparable.
        build(catalog, "warm_up", 1000, 100)
        warm = root / "warm-up"
        warm.mkdir()
        pq.write_table(arrow_rows(pa.array(range(0, 1000, 7), pa.int64()), 100, "w"), warm / "part-0.parquet")
        write(_spec(props, "bench.warm_up", 0, warm, root))
        for epoch, fraction in enumerate(args.fractions, start=1):
            count = max(int(args.rows * fraction), 10)
            changes = changes_of(rng, args.rows, count, span, epoch, next_id)
            next_id += count // 10
            landing = root / f"changes-{epoch}"
            landing.mkdir()
            pq.write_table(changes, landing / "part-0.parquet")
            before = {way: catalog.load_table(f"bench.{way}").metadata.current_snapshot_id for way in ways}
            seconds: dict[str, float] = {}

            # 1. this package: the Spark job, then persist and commit.
            spec = _spec(props, "bench.exactly_once", epoch, landing, root)
            t0 = time.perf_counter()
            pre_commit = write(spec)
            t1 = time.perf_counter()
            coordinator.persist(pre_commit)
            store.checkpoints.set_checkpoint("bench-upsert", epoch, CheckpointStatus.COMPLETED)
            coordinator.commit("bench-upsert", epoch)
            t2 = time.perf_counter()
            seconds["exactly_once"] = t2 - t0
            write_s, commit_s = t1 - t0, t2 - t1

            # 2. pyiceberg's Table.upsert.
            outcome = None
            if "pyiceberg_upsert" in ways:
                t0 = time.perf_counter()
                outcome = catalog.load_table("bench.pyiceberg_upsert").upsert(changes, join_cols=["id"])
                seconds["pyiceberg_upsert"] = time.perf_counter() - t0

            # 3. a rewrite of the touched partitions with pyarrow.
            if "partition_rewrite" in ways:
                t0 = time.perf_counter()
                table = catalog.load_table("bench.partition_rewrite")
                touched = sorted(set(changes.column("part").to_pylist()))
                current = table.scan(row_filter=In("part", touched)).to_arrow()
                kept = current.filter(pc.invert(pc.is_in(current.column("id"), value_set=changes.column("id"))))
                table.overwrite(pa.concat_tables([kept, changes]), overwrite_filter=In("part", touched))
                seconds["partition_rewrite"] = time.perf_counter() - t0

            sums = {way: checksum(catalog.load_table(f"bench.{way}")) for way in ways}
            assert len(set(sums.values())) == 1, f"the ways disagree: {sums}"
            assert sums["exactly_once"][0] == next_id, sums
            totals = {way: summary_totals(catalog.load_table(f"bench.{way}"), before[way]) for way in ways}
            changes_counts = pre_commit.tables[0].changes
            row: dict[str, Any] = {
                "fraction": fraction,
                "changed_rows": count,
                "table_rows_after": sums["exactly_once"][0],
                "seconds": seconds,
                "exactly_once_write_s": write_s,
                "exactly_once_commit_s": commit_s,
                **{
                    f"exactly_once_vs_{way}": seconds["exactly_once"] / seconds[way]
                    for way in ways
                    if way != "exactly_once"
                },
                "files_rewritten": len(pre_commit.tables[0].rewritten),
                "data_files_written": len(pre_commit.tables[0].data_files),
                "changes": None if changes_counts is None else changes_counts.model_dump(),
                "pyiceberg_upsert": None
                if outcome is None
                else {"rows_updated": outcome.rows_updated, "rows_inserted": outcome.rows_inserted},
                "written": totals,
                "bytes_per_changed_row": {way: totals[way]["bytes_written"] / count for way in ways},
            }
            results.append(row)
            print(
                f"{fraction:.0%} ({count:,} changes): exactly-once {seconds['exactly_once']:.1f} s "
                f"(Spark {write_s:.1f} s, commit {commit_s:.2f} s), "
                + ", ".join(f"{way} {seconds[way]:.1f} s" for way in ways if way != "exactly_once")
                + "; bytes per changed row "
                + ", ".join(f"{w} {v:.0f}" for w, v in row["bytes_per_changed_row"].items()),
                flush=True,
            )
        store.dispose()
        catalog.engine.dispose()
    stop()
    name = args.name or f"upsert_cost_{args.rows}" + ("_connect" if args.spark == "connect" else "")
    report = {"rows": args.rows, "partitions": PARTITIONS, "seed": args.seed, "spark": args.spark, "results": results}
    path = save(name, report)
    _plot(name, args.rows, results)
    print(f"wrote {path} and its PNG")


#: The Spark settings of either path: the in-process session's, or the Connect server's.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "6g",
}


def _writer(path: str) -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """The epoch write of a job spec, on a warm in-process session or through a Connect server
    (a session per write, as the write task opens one), and how to stop it."""
    from airflow_provider_exactly_once.spark.connect_write import write_through_connect
    from airflow_provider_exactly_once.spark.epoch_writer import run

    if path == "connect":
        from demo.servers import SparkConnectServer

        server = SparkConnectServer(Path(tempfile.mkdtemp(prefix="eo-bench-connect-"))).start(SPARK_CONF)
        return (lambda spec: write_through_connect(server.url, spec)), server.stop
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("eo-bench-upsert")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return (lambda spec: run(spark, spec, [])), spark.stop


def _spec(props: dict[str, str], table: str, epoch: int, landing: Path, root: Path) -> Any:
    from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

    return EpochJobSpec.model_validate(
        {
            "sink_id": "bench-upsert",
            "epoch": epoch,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": "2024-01-01T00:00:00Z",
            "data_interval_end": "2024-01-02T00:00:00Z",
            "input": {"kind": "files", "format": "parquet", "path": str(landing)},
            "target": {
                "kind": "iceberg",
                "catalog_name": "bench",
                "catalog_properties": props,
                "table": table,
                "upsert": {"key": ["id"]},
            },
            "output_path": str(root / f"out-{uuid.uuid4().hex[:8]}.json"),
        }
    )


def _plot(name: str, rows: int, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['fraction']:.0%}" for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.25
    for n, way in enumerate(WAYS):
        xs = [i + (n - 1) * width for i in range(len(results))]
        left.bar(xs, [r["seconds"].get(way, 0.0) for r in results], width, label=way.replace("_", " "))
        right.bar(xs, [r["bytes_per_changed_row"].get(way, 0.0) for r in results], width, label=way.replace("_", " "))
    for axis, title in ((left, "wall seconds"), (right, "bytes written per changed row")):
        axis.set_xticks(range(len(results)), labels)
        axis.set_xlabel(f"changed fraction of {rows:,} rows")
        axis.set_title(title)
        axis.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)


if __name__ == "__main__":
    main()
