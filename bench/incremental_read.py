"""An incremental epoch's read of an upstream Iceberg table's snapshot range against a plain Spark
read of the same files (issue 37).

Two upstream tables in a pyiceberg SQL catalog (SQLite, local warehouse), one per shape
(``--shapes``, ``<snapshots>x<rows each>``): by default one append of 100,000 rows, and 100 appends
of 1,000 rows. Each table first gets a seed append of ``--seed-rows`` the range starts after, so
the range is the steady state's ``(after, to]`` (a range from the table's first snapshot would add
``check_from_first``'s reading of every manifest of its end). pyiceberg writes one data file per
append here: 1 file and 100 files.

In one ``local[2]`` session (the tests' settings), per shape and round, the two cases alternate
(the one going first switches every round), each forced with the same action (``--action``: a
``noop`` write by default, every row through Spark without collecting them; ``arrow``: ``toArrow()``
to the driver):

- ``incremental``: ``spark.inputs.read_snapshot_range`` over the range, timed from the
  call to the action's end, so the driver's planning is inside: the catalog and table load, the
  range walk and its checks, ``added_files`` (the range end's manifest list and its manifests), then the
  executors reading the files with pyiceberg's ``ArrowScan`` in a ``mapInArrow``;
- ``plain``: ``spark.read.schema(<the frame's schema>).parquet(<the same files' paths>)`` with the
  same action. Spark has no Iceberg runtime here, so this side is handed the file list and the
  schema for free: it is Spark's Parquet reader alone, a floor rather than another way to read the
  range. For the same reason Spark lists the given paths on the driver (``--plain-listing driver``,
  the default: ``spark.sql.sources.parallelPartitionDiscovery.threshold`` raised above the file
  count); with Spark's default threshold (``--plain-listing spark``) more than 32 paths are listed
  by a Spark job of their own, which an Iceberg runtime, planning from manifests, would not run.

Each case's time is split at the frame's creation (``driver_s``: until the call returned a frame;
``action_s``: the Spark job). After each pair, the driver's planning is timed once more on its own,
step by step (the same calls ``read_snapshot_range`` makes): ``load_s`` (catalog and table load),
``walk_s`` (``range_snapshots``), ``added_files_s`` (the manifests the range wrote), and the manifest
lists ``added_files`` read (``manifest_lists_read``, counted at pyiceberg's reader of them).
pyiceberg's process-wide ``ManifestFile`` cache is cleared before each incremental read and each
planning measurement (an epoch through ``spark-submit`` starts without it). Before the rounds, an
untimed check that both sides read the range's rows; then one warm-up round (Python workers, JIT),
not counted.

    uv run --frozen python -m bench.incremental_read [--shapes 1x100000 100x1000] [--rounds 10]
    uv run --frozen python -m bench.incremental_read --shapes 1x10000 40x250 --rounds 2   # a smoke run

Writes bench/results/incremental_read.json and .png (or ``--name``'s). Medians per case; the ratio
is incremental over plain (above 1: the incremental read is slower), of the medians and, for the
spread, per round.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg import manifest
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import clear_manifest_cache
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table
from airflow_provider_exactly_once.spark.inputs import (
    _at_schema_of,
    added_files,
    range_snapshots,
    read_snapshot_range,
)
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from bench._world import RESULTS, median, save

CATALOG = "bench"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "ts", TimestamptzType()),
    NestedField(4, "amount", DoubleType()),
)
START = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
CASES = ("incremental", "plain")
#: Above this many paths a file source lists them in a Spark job (Spark's default: 32).
LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
#: The tests' session (tests/spark/conftest.py), without the console progress bar.
SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
}


def _noop(frame: Any) -> None:
    frame.write.format("noop").mode("overwrite").save()


def _arrow(frame: Any) -> None:
    frame.toArrow()


ACTIONS: dict[str, Callable[[Any], None]] = {"noop": _noop, "arrow": _arrow}


@dataclass(frozen=True)
class Upstream:
    """One shape's upstream table and the range an epoch consumes: every append after the seed."""

    shape: str
    snapshots: int
    rows_each: int
    table: str
    after_snapshot_id: int
    to_snapshot_id: int
    #: The range's first row id (the seed's rows come before).
    first_id: int

    @property
    def rows(self) -> int:
        return self.snapshots * self.rows_each


def parse_shape(text: str) -> tuple[int, int]:
    snapshots, _, rows = text.lower().partition("x")
    try:
        parsed = int(snapshots), int(rows)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is <snapshots>x<rows each>, e.g. 100x1000") from None
    if min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one snapshot of one row")
    return parsed


def rows(first: int, count: int) -> pa.Table:
    """Rows ``first`` .. ``first + count - 1``: a name from 13 (one in 11 null), a row every 7
    minutes, an amount."""
    ids = pa.array(np.arange(first, first + count, dtype=np.int64))
    names = pc.binary_join_element_wise("name-", pc.cast(pc.remainder(ids, 13), pa.string()), "")
    start_us = int(START.timestamp() * 1_000_000)
    return pa.Table.from_pydict(
        {
            "id": ids,
            "name": pc.if_else(pc.equal(pc.remainder(ids, 11), 0), pa.scalar(None, pa.string()), names),
            "ts": pc.cast(pc.add(pc.multiply(ids, 7 * 60 * 1_000_000), start_us), pa.timestamp("us", tz="UTC")),
            "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.25),
        },
        schema=SCHEMA.as_arrow(),
    )


def build(catalog: SqlCatalog, snapshots: int, rows_each: int, seed_rows: int) -> Upstream:
    shape = f"{snapshots}x{rows_each}"
    name = f"bench.upstream_{shape}"
    table = catalog.create_table(name, SCHEMA)
    table.append(rows(0, seed_rows))
    after = table.current_snapshot()
    assert after is not None
    first = seed_rows
    for _ in range(snapshots):
        table.append(rows(first, rows_each))
        first += rows_each
    to = table.current_snapshot()
    assert to is not None
    return Upstream(shape, snapshots, rows_each, name, after.snapshot_id, to.snapshot_id, seed_rows)


def job_spec(props: dict[str, str], up: Upstream) -> EpochJobSpec:
    """An epoch of an incremental input over ``up``'s range; its target is never written here."""
    return EpochJobSpec.model_validate(
        {
            "sink_id": f"bench-{up.shape}",
            "epoch": 1,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": START,
            "data_interval_end": START + dt.timedelta(days=1),
            "input": {"kind": "iceberg_table", "table": up.table},
            "target": {"kind": "iceberg", "catalog_name": CATALOG, "catalog_properties": props, "table": "bench.sink"},
            "input_range": {
                "table": up.table,
                "after_snapshot_id": up.after_snapshot_id,
                "to_snapshot_id": up.to_snapshot_id,
            },
            "input_catalog_name": CATALOG,
            "input_catalog_properties": props,
        }
    )


def incremental(spark: Any, job: EpochJobSpec, action: Callable[[Any], None]) -> dict[str, float]:
    clear_manifest_cache()
    began = time.perf_counter()
    frame, _ = read_snapshot_range(spark, job)
    planned = time.perf_counter()
    assert frame is not None
    action(frame)
    done = time.perf_counter()
    return {"total_s": done - began, "driver_s": planned - began, "action_s": done - planned}


def plain(spark: Any, paths: list[str], schema: Any, action: Callable[[Any], None]) -> dict[str, float]:
    began = time.perf_counter()
    frame = spark.read.schema(schema).parquet(*paths)
    planned = time.perf_counter()
    action(frame)
    done = time.perf_counter()
    return {"total_s": done - began, "driver_s": planned - began, "action_s": done - planned}


def planning(job: EpochJobSpec) -> tuple[dict[str, float], list[str], int]:
    """The driver's steps of ``read_snapshot_range`` before Spark, each timed; the files' paths; and
    how many manifest lists ``added_files`` read (pyiceberg's reader of them counted)."""
    assert job.input_range is not None
    clear_manifest_cache()
    began = time.perf_counter()
    table = load_table(load_catalog(job.input_catalog_name, **job.input_catalog_properties), job.input_range.table)
    loaded = time.perf_counter()
    snapshots = range_snapshots(table.metadata, job.input_range, "bench")
    walked = time.perf_counter()
    with _counting_manifest_lists() as lists:
        files = added_files(table, _at_schema_of(table.metadata, snapshots[-1]), job.input_range, snapshots, "bench")
    done = time.perf_counter()
    times = {"load_s": loaded - began, "walk_s": walked - loaded, "added_files_s": done - walked}
    return times, sorted(files), len(lists)


@contextmanager
def _counting_manifest_lists() -> Iterator[list[str]]:
    """The manifest lists read inside the block (``Snapshot.manifests`` reads its list on every call)."""
    read: list[str] = []
    reader = manifest.read_manifest_list

    def counted(input_file: Any) -> Any:
        read.append(input_file.location)
        return reader(input_file)

    manifest.read_manifest_list = counted
    try:
        yield read
    finally:
        manifest.read_manifest_list = reader


def check_same_rows(spark: Any, job: EpochJobSpec, up: Upstream, paths: list[str]) -> Any:
    """Untimed: both sides read the range's rows, every one once; the incremental frame's schema."""
    from pyspark.sql import functions as F

    frame, positions = read_snapshot_range(spark, job)
    assert frame is not None
    assert (positions["snapshots"], positions["files"], positions["records"]) == (up.snapshots, len(paths), up.rows)
    aggregates = (F.count("*"), F.sum("id"), F.min("id"), F.max("id"))
    ours = frame.agg(*aggregates).first()
    theirs = spark.read.schema(frame.schema).parquet(*paths).agg(*aggregates).first()
    assert ours is not None and theirs is not None
    first, last = up.first_id, up.first_id + up.rows - 1
    assert tuple(ours) == tuple(theirs) == (up.rows, (first + last) * up.rows // 2, first, last), (ours, theirs)
    return frame.schema


def environment(spark: Any) -> dict[str, Any]:
    import pyiceberg
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    return {
        "spark": spark.version,
        "pyspark": pyspark.__version__,
        "pyiceberg": pyiceberg.__version__,
        "pyarrow": pa.__version__,
        "java": java[0] if java else "unknown",
        "master": "local[2], in process",
        "settings": SETTINGS,
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("eo-bench-incremental-read")
    for key, value in SETTINGS.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def summary(up: Upstream, files: int, lists: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    def med(case: str, key: str) -> float:
        return median([s[case][key] for s in samples])

    per_round = [s["incremental"]["total_s"] / s["plain"]["total_s"] for s in samples]
    result: dict[str, Any] = {
        "shape": up.shape,
        "snapshots": up.snapshots,
        "rows_per_snapshot": up.rows_each,
        "rows": up.rows,
        "files": files,
        #: Manifest lists ``added_files`` read (the same in every round: the planning does not vary).
        "manifest_lists_read": lists,
        "rounds": len(samples),
    }
    for case in CASES:
        result[case] = {key: med(case, key) for key in ("total_s", "driver_s", "action_s")}
    result["planning"] = {key: med("planning", key) for key in ("load_s", "walk_s", "added_files_s")}
    result["planning"]["total_s"] = median([sum(s["planning"].values()) for s in samples])
    result["ratio"] = result["incremental"]["total_s"] / result["plain"]["total_s"]
    result["ratio_per_round"] = per_round
    result["ratio_median_of_rounds"] = median(per_round)
    result["samples"] = samples
    return result


def measure(
    spark: Any, props: dict[str, str], ups: list[Upstream], rounds: int, action: str, listing: str
) -> list[dict[str, Any]]:
    act = ACTIONS[action]
    jobs = {up.shape: job_spec(props, up) for up in ups}
    planned = {up.shape: planning(jobs[up.shape]) for up in ups}
    paths = {shape: files for shape, (_, files, _) in planned.items()}
    lists = {shape: count for shape, (_, _, count) in planned.items()}
    if listing == "driver":  # every plain read's paths listed on the driver, as a runtime would not list
        spark.conf.set(LISTING_THRESHOLD, str(max(32, *(len(p) + 1 for p in paths.values()))))
    schemas = {up.shape: check_same_rows(spark, jobs[up.shape], up, paths[up.shape]) for up in ups}
    samples: dict[str, list[dict[str, Any]]] = {up.shape: [] for up in ups}
    for round_ in range(rounds + 1):  # round 0: the warm-up, not counted
        for up in ups:
            job, files, schema = jobs[up.shape], paths[up.shape], schemas[up.shape]
            sample: dict[str, Any] = {"round": round_, "first": CASES[round_ % 2], "load_1min": [_load()]}
            for case in CASES if round_ % 2 == 0 else reversed(CASES):
                if case == "incremental":
                    sample[case] = incremental(spark, job, act)
                else:
                    sample[case] = plain(spark, files, schema, act)
            sample["planning"], _, sample["manifest_lists_read"] = planning(job)
            sample["load_1min"].append(_load())
            print(f"{up.shape} {'warm-up' if round_ == 0 else f'round {round_}'}: {_line(sample)}", flush=True)
            if round_:
                samples[up.shape].append(sample)
    results = [summary(up, len(paths[up.shape]), lists[up.shape], samples[up.shape]) for up in ups]
    for r in results:
        print(
            f"{r['shape']} ({r['rows']:,} rows, {r['files']} file(s)): incremental {r['incremental']['total_s']:.3f} s "
            f"(driver {r['incremental']['driver_s']:.3f}), plain {r['plain']['total_s']:.3f} s, "
            f"ratio {r['ratio']:.2f} (per round, median {r['ratio_median_of_rounds']:.2f}); planning "
            f"{r['planning']['total_s'] * 1000:.0f} ms (load {r['planning']['load_s'] * 1000:.0f}, walk "
            f"{r['planning']['walk_s'] * 1000:.0f}, added_files {r['planning']['added_files_s'] * 1000:.0f}, "
            f"{r['manifest_lists_read']} manifest list(s) read)",
            flush=True,
        )
    return results


def _line(sample: dict[str, Any]) -> str:
    ours, theirs, plan = sample["incremental"], sample["plain"], sample["planning"]
    return (
        f"incremental {ours['total_s']:.3f} s (driver {ours['driver_s']:.3f}), plain {theirs['total_s']:.3f} s "
        f"(driver {theirs['driver_s']:.3f}), planning {sum(plan.values()) * 1000:.0f} ms"
    )


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def plot(name: str, results: list[dict[str, Any]], action: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.6))
    labels = [
        f"{r['snapshots']} x {r['rows_per_snapshot']:,}\n({r['files']} file{'s' if r['files'] != 1 else ''})"
        for r in results
    ]
    x = np.arange(len(results))
    width = 0.36
    for offset, case, colour in ((-width / 2, "incremental", "tab:blue"), (width / 2, "plain", "tab:orange")):
        driver = [r[case]["driver_s"] for r in results]
        spark_job = [r[case]["action_s"] for r in results]
        left.bar(x + offset, driver, width, color=colour, alpha=0.45, label=f"{case}: until the frame")
        bars = left.bar(x + offset, spark_job, width, bottom=driver, color=colour, label=f"{case}: the {action} job")
        left.bar_label(bars, labels=[f"{r[case]['total_s']:.2f}" for r in results], fontsize=8)
    left.set_xticks(x, labels)
    left.set_ylabel(f"seconds (median of {results[0]['rounds']} rounds)")
    left.set_title("Read of the range, forced by a noop write" if action == "noop" else "Read of the range, toArrow()")
    left.legend(fontsize=8)

    bars = middle.bar(x, [r["ratio"] for r in results], 0.5, color="tab:blue")
    middle.bar_label(bars, fmt="%.2f")
    for i, r in enumerate(results):
        middle.plot([i] * len(r["ratio_per_round"]), r["ratio_per_round"], "k.", alpha=0.6)
    middle.axhline(1.0, color="black", linewidth=0.8)
    middle.set_xticks(x, labels)
    middle.set_ylabel("incremental / plain (dots: per round)")
    middle.set_title("Ratio of the medians")

    bottom = np.zeros(len(results))
    for key, label in (("load_s", "catalog + table load"), ("walk_s", "range walk"), ("added_files_s", "added_files")):
        values = np.array([r["planning"][key] * 1000 for r in results])
        right.bar(x, values, 0.5, bottom=bottom, label=label)
        bottom += values
    right.set_xticks(x, labels)
    right.set_ylabel("ms (median of each step)")
    right.set_title("The driver's planning, step by step")
    right.legend(fontsize=8)
    fig.suptitle("An incremental epoch's snapshot-range read against spark.read.parquet of the same files")
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", type=parse_shape, nargs="+", default=[(1, 100_000), (100, 1_000)], help="<snapshots>x<rows each>"
    )
    parser.add_argument("--rounds", type=int, default=10, help="counted rounds, after one warm-up round")
    parser.add_argument("--seed-rows", type=int, default=1_000, help="the append before the range")
    parser.add_argument("--action", choices=sorted(ACTIONS), default="noop", help="what forces the rows, both sides")
    parser.add_argument(
        "--plain-listing",
        choices=["driver", "spark"],
        default="driver",
        help="the plain read's listing of its paths: on the driver, or Spark's default (a Spark job above 32 paths)",
    )
    parser.add_argument("--name", default="incremental_read", help="result files' name in bench/results/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eo-bench-") as tmp:
        root = Path(tmp)
        (root / "warehouse").mkdir()
        props = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'warehouse'}"}
        catalog = SqlCatalog(CATALOG, **{k: v for k, v in props.items() if k != "type"})
        catalog.create_namespace("bench")
        began = time.perf_counter()
        ups = [build(catalog, snapshots, each, args.seed_rows) for snapshots, each in args.shapes]
        print(f"built {', '.join(up.shape for up in ups)} in {time.perf_counter() - began:.1f} s", flush=True)
        spark = _session()
        try:
            env = environment(spark)
            results = measure(spark, props, ups, args.rounds, args.action, args.plain_listing)
            env["settings"] = {**SETTINGS, LISTING_THRESHOLD: spark.conf.get(LISTING_THRESHOLD)}
            env["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            spark.stop()
            catalog.engine.dispose()
    path = save(
        args.name,
        {
            "environment": env,
            "action": args.action,
            "seed_rows": args.seed_rows,
            "plain_listing": args.plain_listing,
            "note": (
                "incremental: read_snapshot_range (catalog/table load, range walk, added_files, then "
                "pyiceberg's ArrowScan in mapInArrow) timed from the call to the action's end; plain: "
                "spark.read.schema(...).parquet(<the same paths>), given the file list and schema for free "
                "(no Iceberg runtime in this Spark), its paths listed as plain_listing says; ratio = "
                "incremental / plain medians; planning measured on its own after each pair"
            ),
            "results": results,
        },
    )
    plot(args.name, results, args.action)
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
