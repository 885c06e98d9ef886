"""Snapshots per epoch: one coordinated commit against every Spark task committing its own files.

The Iceberg Kafka Connect design names the n-times-m problem: if each of n writers commits its own
files, every commit round costs n snapshots (and n catalog CASes that conflict with each other),
and the table's metadata grows n times faster. This provider commits once per table per epoch.

For each n (the number of Spark tasks, each having written one Parquet file):

- **exactly-once**: the n files are one write; ``persist`` then ``commit`` through the coordinator
  (checkpoint already COMPLETED): one snapshot carrying the marker;
- **naive**: n worker processes (one per task, started and warmed before timing) each build the
  ``DataFile`` of its own file and fast-append it through pyiceberg, at the same moment, with
  pyiceberg's own conflict retry (table defaults: 4 retries, backoff from 100 ms); a task whose
  retries run out is retried whole, as Spark would, and counted.

Each n runs ``--epochs`` epochs on a fresh pair of tables, alternating which side goes first, and
reports the medians of the commit wall time, snapshots added per epoch, bytes added under the
table's ``metadata/`` directory per epoch (metadata JSON, manifest lists, manifests), commit
conflicts and whole-task retries. The catalog is PostgreSQL by default: a SQLite catalog serialises
writers on its file lock, which hides the conflicts this benchmark is about.

    uv run python -m bench.e2e_snapshots [--tasks 2 4 8 16] [--epochs 5] [--backend postgres]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from bench._world import RESULTS, World, save, world, write_files

SINK_ID = "bench-e2e-snapshots"
ROWS_PER_FILE = 1000
_TASK_RETRIES = 20

# -- the naive Spark task, run in its own process -------------------------------------------------

_catalog: SqlCatalog | None = None
_conflicts = 0


class _CountConflicts(logging.Handler):
    """pyiceberg logs each conflict it retries; counting the lines counts the lost CASes."""

    def emit(self, record: logging.LogRecord) -> None:
        global _conflicts
        if "concurrent update" in record.getMessage():
            _conflicts += 1


def _init_worker(uri: str, warehouse: str) -> None:
    global _catalog
    _catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    logging.getLogger("pyiceberg.table").addHandler(_CountConflicts())


def _warm(table_name: str) -> int:
    assert _catalog is not None
    _catalog.load_table(table_name)
    time.sleep(0.3)  # hold this worker so that the next warm-up starts another one
    return 0


def _naive_task_commit(table_name: str, descriptor_json: str, start_at: float) -> dict[str, Any]:
    """What a Spark task does in the naive design: commit its own file as its own snapshot."""
    global _conflicts
    assert _catalog is not None
    descriptor = DataFileDescriptor.model_validate_json(descriptor_json)
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)  # every task commits at the same moment, as tasks finishing together do
    _conflicts = 0
    task_retries = 0
    began = time.perf_counter()
    while True:
        table = _catalog.load_table(table_name)
        data_files = build_data_files(
            [descriptor],
            schema=table.schema(),
            spec=table.spec(),
            spec_id=table.spec().spec_id,
            table=table_name,
        )
        try:
            with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                for data_file in data_files:
                    append.append_data_file(data_file)
            break
        except CommitFailedException:
            task_retries += 1
            if task_retries > _TASK_RETRIES:
                raise
    return {"seconds": time.perf_counter() - began, "conflicts": _conflicts, "task_retries": task_retries}


# -- measurement ----------------------------------------------------------------------------------


def _metadata_bytes(table: Table) -> int:
    root = Path(table.location().removeprefix("file://")) / "metadata"
    return sum(p.stat().st_size for p in root.iterdir() if p.is_file())


def _snapshots(w: World, name: str) -> int:
    return len(w.catalog.load_table(name).metadata.snapshots)


def _ours(w: World, table: Table, epoch: int, tasks: int) -> dict[str, Any]:
    coordinator = w.coordinator(SINK_ID)
    name = ".".join(table.name())
    write_id = str(uuid.uuid4())
    location = f"{table.location()}/data/_eo/{write_id}"
    files = write_files(table, location, tasks, rows_per_file=ROWS_PER_FILE)
    before_snapshots, before_bytes = _snapshots(w, name), _metadata_bytes(table)
    w.store.checkpoints.set_checkpoint(SINK_ID, epoch, CheckpointStatus.COMPLETED)
    began = time.perf_counter()
    coordinator.persist(
        PreCommit(
            sink_id=SINK_ID,
            epoch=epoch,
            write_id=write_id,
            tables=[TableWrite(table=name, location=location, data_files=files)],
        )
    )
    coordinator.commit(SINK_ID, epoch)
    elapsed = time.perf_counter() - began
    return {
        "commit_s": elapsed,
        "snapshots": _snapshots(w, name) - before_snapshots,
        "metadata_bytes": _metadata_bytes(table) - before_bytes,
        "conflicts": 0,
        "task_retries": 0,
    }


def _naive(w: World, pool: ProcessPoolExecutor, table: Table, tasks: int) -> dict[str, Any]:
    name = ".".join(table.name())
    location = f"{table.location()}/data/naive-{uuid.uuid4().hex[:8]}"
    files = write_files(table, location, tasks, rows_per_file=ROWS_PER_FILE)
    before_snapshots, before_bytes = _snapshots(w, name), _metadata_bytes(table)
    start_at = time.time() + 0.5
    futures = [pool.submit(_naive_task_commit, name, f.model_dump_json(), start_at) for f in files]
    outcomes = [f.result() for f in futures]
    elapsed = max(o["seconds"] for o in outcomes)
    return {
        "commit_s": elapsed,
        "snapshots": _snapshots(w, name) - before_snapshots,
        "metadata_bytes": _metadata_bytes(table) - before_bytes,
        "conflicts": sum(o["conflicts"] for o in outcomes),
        "task_retries": sum(o["task_retries"] for o in outcomes),
    }


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rounds))


def measure(w: World, tasks: int, epochs: int) -> dict[str, Any]:
    ours_table, naive_table = w.table(f"ours_{tasks}"), w.table(f"naive_{tasks}")
    uri, warehouse = w.catalog.properties["uri"], w.catalog.properties["warehouse"]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(tasks, mp_context=context, initializer=_init_worker, initargs=(uri, warehouse)) as pool:
        list(pool.map(_warm, [".".join(naive_table.name())] * tasks))
        ours: list[dict[str, Any]] = []
        naive: list[dict[str, Any]] = []
        for epoch in range(epochs):
            if epoch % 2:
                naive.append(_naive(w, pool, naive_table, tasks))
                ours.append(_ours(w, ours_table, tasks * 1000 + epoch, tasks))
            else:
                ours.append(_ours(w, ours_table, tasks * 1000 + epoch, tasks))
                naive.append(_naive(w, pool, naive_table, tasks))
    for side in (ours, naive):
        assert all(r["snapshots"] == (1 if side is ours else tasks) for r in side), side
    row: dict[str, Any] = {"tasks": tasks, "epochs": epochs}
    for label, rounds in (("exactly_once", ours), ("naive", naive)):
        row[label] = {
            "snapshots_per_epoch": _median(rounds, "snapshots"),
            "commit_s_median": _median(rounds, "commit_s"),
            "metadata_bytes_per_epoch_median": _median(rounds, "metadata_bytes"),
            "conflicts_total": sum(r["conflicts"] for r in rounds),
            "task_retries_total": sum(r["task_retries"] for r in rounds),
            "rounds": rounds,
        }
    row["snapshot_ratio"] = row["naive"]["snapshots_per_epoch"] / row["exactly_once"]["snapshots_per_epoch"]
    row["commit_time_ratio_naive_over_ours"] = row["naive"]["commit_s_median"] / row["exactly_once"]["commit_s_median"]
    row["metadata_bytes_ratio_naive_over_ours"] = (
        row["naive"]["metadata_bytes_per_epoch_median"] / row["exactly_once"]["metadata_bytes_per_epoch_median"]
    )
    print(
        f"n={tasks}: snapshots/epoch 1 vs {row['naive']['snapshots_per_epoch']:.0f}; commit "
        f"{row['exactly_once']['commit_s_median']:.3f}s vs {row['naive']['commit_s_median']:.3f}s; "
        f"metadata bytes/epoch {row['exactly_once']['metadata_bytes_per_epoch_median']:.0f} vs "
        f"{row['naive']['metadata_bytes_per_epoch_median']:.0f}; naive conflicts "
        f"{row['naive']['conflicts_total']}, task retries {row['naive']['task_retries_total']}",
        flush=True,
    )
    return row


def plot(results: list[dict[str, Any]], backend: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    n = [r["tasks"] for r in results]
    for label, key in (("exactly-once (1 commit)", "exactly_once"), ("naive (each task commits)", "naive")):
        axes[0].plot(n, [r[key]["snapshots_per_epoch"] for r in results], "o-", label=label)
        axes[1].plot(n, [r[key]["commit_s_median"] for r in results], "o-", label=label)
        axes[2].plot(n, [r[key]["metadata_bytes_per_epoch_median"] / 1024 for r in results], "o-", label=label)
    for ax, title, unit in zip(
        axes,
        ("snapshots per epoch", "commit wall time per epoch (median)", "metadata added per epoch (median)"),
        ("snapshots", "seconds", "KiB"),
        strict=True,
    ):
        ax.set_xlabel("Spark tasks (files) per epoch")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"one commit per epoch against one commit per task ({backend} catalog)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, nargs="*", default=[2, 4, 8, 16])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="postgres")
    args = parser.parse_args()
    for value in [*args.tasks, args.epochs]:
        if value < 1:
            parser.error(f"--tasks and --epochs must be at least 1, got {value}")
    with world(args.backend) as w:
        results = [measure(w, tasks, args.epochs) for tasks in args.tasks]
    name = f"e2e_snapshots_{args.backend}"
    path = save(
        name,
        {
            "backend": args.backend,
            "rows_per_file": ROWS_PER_FILE,
            "naive_retry": "pyiceberg table defaults (4 retries, 100 ms doubling), then whole-task retry",
            "results": results,
        },
    )
    plot(results, args.backend, RESULTS / f"{name}.png")
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
