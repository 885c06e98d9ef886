"""Recovery of 1,000 Pending epochs whose checkpoints completed (a long outage, then the recovery DAG).

Each epoch has its own small data file and its own Pending row; ``recover`` must commit every one
as its own snapshot with its own marker (``core/coordinator.py`` stacks up to 100 of them in one catalog
commit per table). Measured on SQLite and on the PostgreSQL at 127.0.0.1:5432, in two shapes:

- ``--sinks 1``: all epochs belong to one sink writing one table (the worst case: every Iceberg
  commit rewrites metadata that lists every earlier snapshot, so N commits on one table cost
  O(N^2) whoever makes them);
- ``--sinks 10``: the same number of epochs spread over ten sinks, one table each, recovered one
  sink after another (what the recovery DAG does, one mapped task per sink).

    uv run python -m bench.recovery [--epochs 1000] [--sinks 1] [--backends sqlite postgres] [--with-bare]

Target (issue 18): one sink, one table, under 30 s on this 2-core machine, on both.

``--with-bare`` also times the floor any pyiceberg client pays for the same commits: one plain
fast-append per epoch, in sequence, onto a second table per sink.
"""

from __future__ import annotations

import argparse
import time
import uuid

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from bench._world import RESULTS, World, save, world, write_files

TARGET_S = 30


def _bare_appends(w: World, sink_ids: list[str]) -> float:
    """The same commits as plain sequential fast-appends, onto one bare table per sink."""
    start = time.perf_counter()
    for sink_id in sink_ids:
        name = f"bench.bare_{sink_id.replace('-', '_')}"
        w.table(name.split(".", 1)[1])
        for row in w.store.epochs_with_status(sink_id, EpochStatus.PENDING):
            fresh = w.catalog.load_table(name)
            data_files = build_data_files(
                row.pre_commit.tables[0].data_files,
                schema=fresh.schema(),
                spec=fresh.spec(),
                spec_id=fresh.spec().spec_id,
                table=name,
            )
            with fresh.transaction() as tx, tx.update_snapshot().fast_append() as append:
                for data_file in data_files:
                    append.append_data_file(data_file)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--sinks", type=int, default=1, help="spread the epochs over this many sinks/tables")
    parser.add_argument("--backends", nargs="*", default=["sqlite", "postgres"])
    parser.add_argument("--with-bare", action="store_true", help="also time plain sequential fast-appends")
    args = parser.parse_args()
    results = []
    for backend in args.backends:
        with world(backend) as w:
            sink_ids = [f"bench-recovery-{k}" for k in range(args.sinks)]
            committer = IcebergSinkCommitter(w.catalog)
            coordinator = TwoPhaseCommitCoordinator(w.store, dict.fromkeys(sink_ids, committer), w.checkpoints)
            tables = {sink_id: w.table(f"recovered_{k}") for k, sink_id in enumerate(sink_ids)}
            setup_start = time.perf_counter()
            for epoch in range(args.epochs):
                sink_id = sink_ids[epoch % args.sinks]
                table = tables[sink_id]
                write_id = str(uuid.uuid4())
                location = f"{table.location()}/data/_eo/{write_id}"
                write = TableWrite(
                    table=".".join(table.name()), location=location, data_files=write_files(table, location, 1)
                )
                coordinator.persist(PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=[write]))
                w.store.checkpoints.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
            setup_s = time.perf_counter() - setup_start

            bare_s = _bare_appends(w, sink_ids) if args.with_bare else None

            start = time.perf_counter()
            reports = [coordinator.recover(sink_id) for sink_id in sink_ids]
            elapsed = time.perf_counter() - start
            assert all(r.ok for r in reports), [r.failed for r in reports if not r.ok]
            assert sum(len(r.committed) for r in reports) == args.epochs
            for sink_id in sink_ids:
                assert not w.store.epochs_with_status(sink_id, EpochStatus.PENDING)
            snapshots = sum(len(w.catalog.load_table(".".join(t.name())).metadata.snapshots) for t in tables.values())
            assert snapshots == args.epochs
            for sink_id, t in tables.items():  # one marked snapshot per epoch, in epoch order
                history = w.catalog.load_table(".".join(t.name())).metadata.snapshots
                epochs = [int(str(s.summary["exactly-once.epoch"])) for s in history if s.summary is not None]
                assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), sink_id
            row = {
                "backend": backend,
                "pending_epochs": args.epochs,
                "sinks": args.sinks,
                "recover_s": elapsed,
                "epochs_per_s": args.epochs / elapsed,
                "setup_s": setup_s,
                "bare_sequential_appends_s": bare_s,
                "ratio_vs_bare": None if bare_s is None else elapsed / bare_s,
            }
            print(f"{backend}: recovered {args.epochs} epochs over {args.sinks} sink(s) in {elapsed:.1f}s")
            if bare_s is not None:
                print(
                    f"{backend}: the same as bare sequential fast-appends took {bare_s:.1f}s; ratio {elapsed / bare_s:.2f}"
                )
            results.append(row)
    name = f"recovery_{args.epochs}_over_{args.sinks}" + ("_with_bare" if args.with_bare else "")
    path = save(name, {"results": results, "target_s": TARGET_S})
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([r["backend"] for r in results], [r["recover_s"] for r in results], label="recover")
    if args.with_bare:
        ax.bar(
            [f"{r['backend']}\nbare appends" for r in results],
            [r["bare_sequential_appends_s"] for r in results],
            label="bare sequential fast-appends",
        )
    ax.axhline(TARGET_S, color="red", linestyle=":", label=f"{TARGET_S} s target")
    ax.set_ylabel("seconds")
    ax.set_title(f"recovery of {args.epochs} Pending epochs over {args.sinks} sink(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
