"""Whole small epochs (write, persist, wait, commit) through ``spark-submit`` and through a warm
Spark Connect server, in one run: the epochs per hour one Airflow worker gets from each.

Two exactly-once DAGs of the same shape (``bench.e2e_epoch.build_eo_dag``: the epoch writer, the
Pending row, the checkpoint sensor on the hour's ``_SUCCESS``, already there, and the commit) read
the same landed hour of ``--rows`` events into two tables of the example's day partitioning. One
writes through the connection ``spark_default`` (type ``spark``, ``local[2]``: a ``spark-submit`` per
epoch), the other through ``spark_connect_bench`` (type ``spark_connect``: a client of a Connect
server, ``local[2]``, started once by ``demo.servers.SparkConnectServer``). Each round runs both on
a fresh hour, alternating which goes first; both run through Airflow's ``dag.test()`` in this
process, so the time between tasks is Airflow's in-process loop, not a scheduler's. Every table is
read back afterwards: one marked snapshot per epoch, the hour's rows once each.

Reported: per path the median wall time of an epoch and its write task, the epochs per hour that
median allows, and the ratio of the two (Connect over spark-submit, per round, median).

    uv run --frozen python -m bench.connect_epoch [--rows 10000] [--rounds 4]

Writes bench/results/connect_epoch.json and .png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench._world import RESULTS, save
from bench.e2e_epoch import FIRST_HOUR, Landing, build_eo_dag, run

PATHS = {
    "spark_submit": ("spark_default", "bench_epoch_submit", "bench-epoch-submit", "bench.events_submit"),
    "connect": ("spark_connect_bench", "bench_epoch_connect", "bench-epoch-connect", "bench.events_connect"),
}


def create_tables(catalog: Any) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    from fault_harness.harness import EVENT_SCHEMA

    spec = PartitionSpec(PartitionField(4, 1000, DayTransform(), "event_day"))
    catalog.create_namespace_if_not_exists("bench")
    for _, _, _, table in PATHS.values():
        catalog.create_table(table, EVENT_SCHEMA, partition_spec=spec)


def check(catalog: Any, rows: int, epochs: int) -> None:
    """Each table: one marked snapshot per epoch, each adding the hour's rows."""
    for path, (_, _, _, name) in PATHS.items():
        snapshots = catalog.load_table(name).metadata.snapshots
        marked = [
            s for s in snapshots if s.summary is not None and "exactly-once.epoch" in s.summary.additional_properties
        ]
        added = [int(s.summary["added-records"]) for s in marked if s.summary is not None]
        assert added == [rows] * epochs, f"{path}: {name} added {added}, expected {rows} x {epochs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.rows < 1 or args.rounds < 1:
        parser.error("--rows and --rounds must be at least 1")
    from demo import world
    from demo.servers import SparkConnectServer

    with tempfile.TemporaryDirectory(prefix="eo-bench-connect-epoch-") as tmp:
        root = Path(tmp)
        server = SparkConnectServer(root / "spark-connect")
        server.start({"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"})
        try:
            connection = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server.port}
            world.enter(root, overrides={"AIRFLOW_CONN_SPARK_CONNECT_BENCH": json.dumps(connection)})
            create_tables(world.catalog())
            landing = Landing(str(root / "landing"))
            dags = {
                path: build_eo_dag(landing.root, dag_id, sink_id, table, spark_conn_id=conn_id)
                for path, (conn_id, dag_id, sink_id, table) in PATHS.items()
            }
            from tests.support.airflow_world import register  # after world.enter: it imports Airflow

            for dag in dags.values():
                register(dag)
            first = FIRST_HOUR
            landing.land(root / "staging", first, args.rows)
            # Not measured: the first epoch of each pays one-time imports, the server its Python workers.
            for dag in dags.values():
                run(dag, first)
            runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
            for k in range(1, args.rounds + 1):
                hour = first + dt.timedelta(hours=k)
                landing.copy(first, hour)
                order = list(PATHS) if k % 2 else list(reversed(PATHS))
                for path in order:
                    runs[path].append(run(dags[path], hour))
                    print(f"round {k}, {path}: {runs[path][-1]['wall_s']:.1f} s", flush=True)
            check(world.catalog(), args.rows, args.rounds + 1)
        finally:
            server.stop()
    ratios = [c["wall_s"] / s["wall_s"] for c, s in zip(runs["connect"], runs["spark_submit"], strict=True)]
    summary: dict[str, Any] = {}
    for path, measured in runs.items():
        wall = statistics.median(r["wall_s"] for r in measured)
        write = statistics.median(r["tasks"]["write"]["duration_s"] for r in measured)
        summary[path] = {"epoch_wall_s_median": wall, "write_task_s_median": write, "epochs_per_hour": 3600 / wall}
    summary["connect_over_submit_wall"] = statistics.median(ratios)
    summary["epochs_per_hour_gain"] = summary["connect"]["epochs_per_hour"] / summary["spark_submit"]["epochs_per_hour"]
    result = {"rows": args.rows, "rounds": args.rounds, "master": "local[2]", "summary": summary, "runs": runs}
    path = save("connect_epoch", result)
    _plot(runs, summary)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path} and its PNG")


def _plot(runs: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for path, measured in runs.items():
        ax.plot(range(1, len(measured) + 1), [r["wall_s"] for r in measured], marker="o", label=path)
    ax.set_xlabel("round")
    ax.set_ylabel("epoch wall time (s), dag.test()")
    gain = summary["epochs_per_hour_gain"]
    ax.set_title(f"Whole small epoch: Connect gives {gain:.1f}x the epochs per hour of spark-submit")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "connect_epoch.png", dpi=100)


if __name__ == "__main__":
    main()
