"""The write task's wall time for a small epoch: a warm Spark Connect server against ``spark-submit``.

Hourly and daily epochs are mostly small, and through ``spark-submit`` each pays a JVM, a
SparkContext and the executors' Python workers. Through Connect the task is a client of a server
started once (``local[2]`` both): the write is the same code (``spark.epoch_writer.run``).

Each round writes the same landed epoch (``--rows`` rows in two Parquet files, one unpartitioned
table of a SQLite catalog) once each way, alternating which goes first, with a fresh write id each:

- ``spark-submit``: the epoch writer application with its job spec, as the write task runs it;
- ``connect``: ``spark.connect_write.write_through_connect``, a new session per write, as the task
  runs it. The server's first write (its Python workers starting) is a warm-up, not counted.

Nothing is committed: this is the write task alone. The ratio is the median of the per-round ratios.

    uv run --frozen python -m bench.connect_write [--rows 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from airflow_provider_exactly_once.spark.connect_write import write_through_connect
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from bench._world import RESULTS, save
from demo.servers import SparkConnectServer

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "amount", DoubleType()),
)
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}


def spec_for(root: Path, catalog: dict[str, str], landing: Path) -> EpochJobSpec:
    return EpochJobSpec.model_validate(
        {
            "sink_id": "bench",
            "epoch": int(START.timestamp() * 1000),
            "write_id": str(uuid.uuid4()),
            "data_interval_start": START,
            "data_interval_end": START + dt.timedelta(days=1),
            "input": {"kind": "files", "format": "parquet", "path": str(landing)},
            "target": {"kind": "iceberg", "catalog_properties": catalog, "table": "ns.small"},
            "output_path": str(root / f"out-{uuid.uuid4().hex[:8]}.json"),
        }
    )


def through_submit(spec: EpochJobSpec, root: Path) -> float:
    spec_file = root / f"spec-{spec.write_id}.json"
    spec_file.write_text(spec.to_json())
    application = Path(__file__).resolve().parents[1] / "airflow_provider_exactly_once" / "spark" / "epoch_writer.py"
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]"]
    for key, value in {**SPARK_CONF, "spark.pyspark.python": sys.executable}.items():
        command += ["--conf", f"{key}={value}"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    start = time.perf_counter()
    done = subprocess.run([*command, str(application), str(spec_file)], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError((done.stdout + done.stderr)[-3000:])
    return elapsed


def through_connect(spec: EpochJobSpec, url: str) -> float:
    start = time.perf_counter()
    pre_commit = write_through_connect(url, spec)
    elapsed = time.perf_counter() - start
    assert pre_commit.record_count > 0
    return elapsed


def plot(rounds: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    numbers = list(range(1, len(rounds) + 1))
    left.plot(numbers, [r["spark_submit_s"] for r in rounds], "o-", label="spark-submit")
    left.plot(numbers, [r["connect_s"] for r in rounds], "s-", label="Spark Connect (warm server)")
    left.set_xlabel("round")
    left.set_ylabel("write task wall time (s)")
    left.set_ylim(bottom=0)
    left.legend()
    right.plot(numbers, [r["ratio"] for r in rounds], "d-", label="connect / spark-submit")
    right.axhline(0.2, color="red", linestyle=":", label="target 0.2x")
    right.set_xlabel("round")
    right.set_ylim(bottom=0)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eo-bench-connect-") as tmp:
        root = Path(tmp)
        (root / "warehouse").mkdir()
        catalog = {
            "type": "sql",
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": f"file://{root / 'warehouse'}",
        }
        load_catalog("default", **catalog).create_namespace("ns")
        load_catalog("default", **catalog).create_table("ns.small", SCHEMA)
        landing = root / "landing"
        landing.mkdir()
        half = args.rows // 2
        for part, first in enumerate((0, half)):
            ids = list(range(first, args.rows if part else half))
            rows = {"id": ids, "name": [f"n{i % 17}" for i in ids], "amount": [i * 0.5 for i in ids]}
            pq.write_table(pa.table(rows), landing / f"part-{part}.parquet")
        server = SparkConnectServer(root / "connect").start(
            {k: v for k, v in SPARK_CONF.items() if k != "spark.ui.enabled"}
        )
        try:
            warm_up = through_connect(spec_for(root, catalog, landing), server.url)
            rounds = []
            for number in range(args.rounds):
                first, second = ("submit", "connect") if number % 2 == 0 else ("connect", "submit")
                measured: dict[str, float] = {}
                for side in (first, second):
                    spec = spec_for(root, catalog, landing)
                    if side == "submit":
                        measured["spark_submit_s"] = through_submit(spec, root)
                    else:
                        measured["connect_s"] = through_connect(spec, server.url)
                measured["ratio"] = measured["connect_s"] / measured["spark_submit_s"]
                rounds.append(measured)
                print(f"round {number + 1}: {measured}", flush=True)
        finally:
            server.stop()
    result = {
        "rows": args.rows,
        "rounds": rounds,
        "connect_warm_up_s": warm_up,
        "spark_submit_median_s": statistics.median(r["spark_submit_s"] for r in rounds),
        "connect_median_s": statistics.median(r["connect_s"] for r in rounds),
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
        "target_ratio_at_most": 0.2,
    }
    path = save("connect_write", result)
    plot(rounds, RESULTS / "connect_write.png")
    print(
        f"connect {result['connect_median_s']:.2f} s, spark-submit {result['spark_submit_median_s']:.2f} s: "
        f"ratio {result['ratio_median']:.3f} (target at most 0.2); {path}"
    )
    return result


if __name__ == "__main__":
    main()
