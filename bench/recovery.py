"""Recovery of 1,000 Pending epochs whose checkpoints completed (a long outage, then the recovery DAG).

Each epoch has its own small data file and its own Pending row; ``recover`` must commit every one
as its own snapshot. Measured on SQLite and on the PostgreSQL at 127.0.0.1:5432.

    uv run python -m bench.recovery [--epochs 1000] [--backends sqlite postgres]

Target (design): under 60 s on this 2-core machine, on both.
"""

from __future__ import annotations

import argparse
import time
import uuid

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.status import CheckpointStatus, EpochStatus
from bench._world import RESULTS, save, world, write_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--backends", nargs="*", default=["sqlite", "postgres"])
    args = parser.parse_args()
    results = []
    for backend in args.backends:
        with world(backend) as w:
            sink_id = "bench-recovery"
            table = w.table("recovered")
            coordinator = w.coordinator(sink_id)
            setup_start = time.perf_counter()
            for epoch in range(args.epochs):
                write_id = str(uuid.uuid4())
                location = f"{table.location()}/data/_eo/{write_id}"
                pre = PreCommit(
                    sink_id=sink_id,
                    epoch=epoch,
                    write_id=write_id,
                    tables=[
                        TableWrite(
                            table="bench.recovered", location=location, data_files=write_files(table, location, 1)
                        )
                    ],
                )
                coordinator.persist(pre)
                w.store.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
            setup_s = time.perf_counter() - setup_start

            start = time.perf_counter()
            report = coordinator.recover(sink_id)
            elapsed = time.perf_counter() - start
            assert report.ok and len(report.committed) == args.epochs, report.failed
            assert not w.store.epochs_with_status(sink_id, EpochStatus.PENDING)
            snapshots = len(w.catalog.load_table("bench.recovered").metadata.snapshots)
            assert snapshots == args.epochs
            row = {
                "backend": backend,
                "pending_epochs": args.epochs,
                "recover_s": elapsed,
                "epochs_per_s": args.epochs / elapsed,
                "setup_s": setup_s,
            }
            print(f"{backend}: recovered {args.epochs} epochs in {elapsed:.1f}s ({row['epochs_per_s']:.1f}/s)")
            results.append(row)
    path = save("recovery", {"results": results, "target_s": 60})
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r["backend"] for r in results], [r["recover_s"] for r in results])
    ax.axhline(60, color="red", linestyle=":", label="60 s target")
    ax.set_ylabel(f"seconds to recover {args.epochs} Pending epochs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "recovery.png", dpi=100)
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
