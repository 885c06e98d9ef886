"""Recovery time after a crash that left 10, 100 and 1,000 epochs half finished.

``bench.recovery`` measures the easy case (every epoch Pending with its checkpoint completed). A real
crash leaves a mix, and each kind costs recovery something different. Here the epochs are driven
through the real coordinator and stopped dead (``SimulatedCrash`` from the fault hook, the way the
crash tests do it) at the point that leaves them in one of five states, round-robin:

- ``checkpoint-completed``: persisted, checkpoint COMPLETED, no commit attempt yet (recovery commits);
- ``commit-decided``: crashed right after the durable commit decision (recovery commits);
- ``visible-not-marked``: crashed after the snapshot became visible, before the row said Committed
  (recovery finds the marker, appends nothing, marks the row);
- ``checkpoint-failed``: persisted, checkpoint FAILED (recovery aborts and deletes the files);
- ``aborted-with-files``: crashed after the row became Aborted, before its files were deleted
  (recovery runs the queued clean-up).

Then ``coordinator.recover`` runs for every sink, one after another (the recovery DAG runs one
mapped task per sink), and is timed. The result is checked: nothing Pending, one snapshot per
committed epoch, every aborted write's files gone.

    uv run python -m bench.e2e_recovery [--epochs 10 100 1000] [--sinks 10] [--backends sqlite postgres]

The epochs are spread over ``--sinks`` sinks, one table each (at most one sink per epoch). With
``--sinks 1`` every commit lands on one table, where each Iceberg commit rewrites metadata listing
every earlier snapshot (O(N^2) in any client; see ``bench.recovery``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from bench._world import RESULTS, World, save, world, write_files

STATES = ("checkpoint-completed", "commit-decided", "visible-not-marked", "checkpoint-failed", "aborted-with-files")
_CRASH_AT = {
    "commit-decided": "commit.decided",
    "visible-not-marked": "commit.visible",
    "aborted-with-files": "abort.marked",
}
FILES_PER_WRITE = 2


class _CrashAt:
    """A fault hook armed for one call: stops the attempt dead at ``point``, like a killed worker."""

    def __init__(self) -> None:
        self.point: str | None = None

    def __call__(self, point: str) -> None:
        if point == self.point:
            self.point = None
            raise SimulatedCrash(point)


def _leave_half_finished(w: World, epochs: int, sinks: int) -> tuple[TwoPhaseCommitCoordinator, dict[str, Any]]:
    """Drive ``epochs`` epochs into the five half-finished states through the real coordinator."""
    sink_ids = [f"bench-e2e-recovery-{k}" for k in range(sinks)]
    committer = IcebergSinkCommitter(w.catalog)
    crash = _CrashAt()
    crashing = TwoPhaseCommitCoordinator(w.store, dict.fromkeys(sink_ids, committer), w.checkpoints, fault=crash)
    tables = {sink_id: w.table(f"e2e_recovered_{k}") for k, sink_id in enumerate(sink_ids)}
    states: Counter[str] = Counter()
    aborted_paths: list[Path] = []
    for epoch in range(epochs):
        sink_id, state = sink_ids[epoch % sinks], STATES[epoch % len(STATES)]
        table = tables[sink_id]
        write_id = str(uuid.uuid4())
        location = f"{table.location()}/data/_eo/{write_id}"
        files = write_files(table, location, FILES_PER_WRITE)
        write = TableWrite(table=".".join(table.name()), location=location, data_files=files)
        crashing.persist(PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=[write]))
        failed = state in ("checkpoint-failed", "aborted-with-files")
        w.store.checkpoints.set_checkpoint(
            sink_id, epoch, CheckpointStatus.FAILED if failed else CheckpointStatus.COMPLETED
        )
        if state in _CRASH_AT:
            crash.point = _CRASH_AT[state]
            try:
                if failed:
                    crashing.abort(sink_id, epoch, reason="bench: checkpoint FAILED")
                else:
                    crashing.commit(sink_id, epoch)
            except SimulatedCrash:
                pass
            else:
                raise AssertionError(f"epoch {epoch} ({state}) did not reach its crash point {_CRASH_AT[state]}")
        if failed:
            aborted_paths += [Path(f.path.removeprefix("file://")) for f in files]
        states[state] += 1
    recovering = TwoPhaseCommitCoordinator(w.store, dict.fromkeys(sink_ids, committer), w.checkpoints)
    return recovering, {"sink_ids": sink_ids, "tables": tables, "states": dict(states), "aborted_paths": aborted_paths}


def measure(backend: str, epochs: int, sinks: int) -> dict[str, Any]:
    sinks = min(sinks, epochs)
    with world(backend) as w:
        setup_start = time.perf_counter()
        coordinator, made = _leave_half_finished(w, epochs, sinks)
        setup_s = time.perf_counter() - setup_start
        expected_visible_before = made["states"].get("visible-not-marked", 0)
        start = time.perf_counter()
        reports = [coordinator.recover(sink_id) for sink_id in made["sink_ids"]]
        elapsed = time.perf_counter() - start

        assert all(r.ok for r in reports), [r.failed for r in reports if not r.ok]
        for sink_id in made["sink_ids"]:
            assert not w.store.epochs_with_status(sink_id, EpochStatus.PENDING), sink_id
        to_commit = sum(made["states"].get(s, 0) for s in STATES[:3])
        assert sum(len(r.committed) for r in reports) == to_commit
        assert sum(len(r.aborted) for r in reports) == made["states"].get("checkpoint-failed", 0)
        snapshots = sum(
            len(w.catalog.load_table(".".join(t.name())).metadata.snapshots) for t in made["tables"].values()
        )
        assert snapshots == to_commit, (snapshots, to_commit)  # at most once: no second snapshot for a visible epoch
        left = [p for p in made["aborted_paths"] if p.exists()]
        assert not left, f"{len(left)} aborted files survived recovery"
        deleted = sum(r.files_deleted for r in reports)
        row = {
            "backend": backend,
            "half_finished_epochs": epochs,
            "sinks": sinks,
            "states": made["states"],
            "recover_s": elapsed,
            "epochs_per_s": epochs / elapsed,
            "committed": to_commit,
            "already_visible_marked": expected_visible_before,
            "aborted_or_cleaned": epochs - to_commit,
            "files_deleted": deleted,
            "setup_s": setup_s,
        }
        print(
            f"{backend}: {epochs} half-finished epochs over {sinks} sink(s): recovered in {elapsed:.2f}s "
            f"({to_commit} committed, {deleted} files deleted; setup {setup_s:.1f}s)",
            flush=True,
        )
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--sinks", type=int, default=10, help="spread the epochs over this many sinks/tables")
    parser.add_argument("--backends", nargs="*", default=["sqlite", "postgres"])
    args = parser.parse_args()
    for count in [*args.epochs, args.sinks]:
        if count < 1:
            parser.error(f"--epochs and --sinks must be at least 1, got {count}")
    results = [measure(backend, epochs, args.sinks) for epochs in args.epochs for backend in args.backends]
    name = f"e2e_recovery_over_{args.sinks}"
    path = save(name, {"results": results, "states": list(STATES), "files_per_write": FILES_PER_WRITE, "target_s": 60})
    fig, ax = plt.subplots(figsize=(7, 4))
    for backend in args.backends:
        mine = [r for r in results if r["backend"] == backend]
        ax.plot([r["half_finished_epochs"] for r in mine], [r["recover_s"] for r in mine], "o-", label=backend)
    ax.axhline(60, color="red", linestyle=":", label="60 s target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("half-finished epochs (5 states, round-robin)")
    ax.set_ylabel("recovery seconds")
    ax.set_title(f"recovery after a crash, epochs over {args.sinks} sink(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
