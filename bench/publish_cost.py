"""Cost of publishing an audited epoch (design.md D23) against a plain commit of the same epoch.

For each size, every round persists two writes of N prebuilt files into two tables: one of a plain
sink, committed as usual (``commit``), one of an audited sink, committed to its audit branch and
then published: what the ``publish`` task does (``commit`` with the audit's passed checks, which
records them with the commit decision, commits to ``main`` and retires the audit branch and
snapshot in the same catalog transaction). The two are
timed alternately in each round.

    uv run python -m bench.publish_cost [--backend sqlite|postgres|rest] [--rounds 5] [--sizes 1000 10000]

Writes bench/results/publish_cost_<backend>.json and .png. Target (issue 58): publish at most 1.2x
the plain commit at 1k and 10k files. The audit commit before it (the write onto its audit branch)
is timed too, against the same plain commit.
"""

from __future__ import annotations

import argparse
import uuid

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import AuditCheck, CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from bench._world import BACKENDS, median, plot_cost, save, timed, tree_named, world, write_files

SIZES = [1000, 10000]
ROWS_PER_FILE = 10
PLAIN, AUDITED = "bench-plain", "bench-audited"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()

    from pathlib import Path

    results = []
    with world(args.backend) as w:
        committer = IcebergSinkCommitter(w.catalog)
        coordinator = TwoPhaseCommitCoordinator(
            w.store, {PLAIN: committer, AUDITED: committer}, w.checkpoints, audited=[AUDITED]
        )
        epoch = 0
        for size in args.sizes:
            tables = {sink: w.table(f"{sink.replace('-', '_')}_{size}") for sink in (PLAIN, AUDITED)}
            commits: list[float] = []
            publishes: list[float] = []
            audit_commits: list[float] = []  # the step before the audit: the write onto its audit branch
            for n in range(args.rounds):
                epoch += 1
                writes: dict[str, PreCommit] = {}
                for sink, table in tables.items():
                    write_id = str(uuid.uuid4())
                    location = iceberg_write_location(iceberg_data_root(table.location(), table.properties), write_id)
                    files = write_files(table, location, size, ROWS_PER_FILE, epoch=epoch)
                    name = f"bench.{sink.replace('-', '_')}_{size}"
                    writes[sink] = PreCommit(
                        sink_id=sink,
                        epoch=epoch,
                        write_id=write_id,
                        tables=[TableWrite(table=name, location=location, data_files=files)],
                    )
                    w.store.checkpoints.set_checkpoint(sink, epoch, CheckpointStatus.COMPLETED)
                    coordinator.persist(writes[sink])

                def audit_commit(epoch: int = epoch) -> None:
                    coordinator.commit_audit(AUDITED, epoch)

                audit_commits.append(timed(audit_commit))

                def publish(epoch: int = epoch) -> None:
                    checks = [AuditCheck(name="audit_checks", passed=True)]
                    coordinator.commit(AUDITED, epoch, audit_checks=checks)

                def commit(epoch: int = epoch) -> None:
                    coordinator.commit(PLAIN, epoch)

                if n % 2:  # alternated: neither path always runs on the warmer catalog
                    publishes.append(timed(publish))
                    commits.append(timed(commit))
                else:
                    commits.append(timed(commit))
                    publishes.append(timed(publish))
            row = {
                "files": size,
                "plain_commit_s": median(commits),
                "publish_s": median(publishes),
                "publish_vs_commit": median(publishes) / median(commits),
                "audit_commit_s": median(audit_commits),
                "audit_commit_vs_commit": median(audit_commits) / median(commits),
                "plain_commit_all_s": commits,
                "publish_all_s": publishes,
                "audit_commit_all_s": audit_commits,
            }
            print(
                f"{size:>6} files: commit {row['plain_commit_s']:.3f}s  publish {row['publish_s']:.3f}s  "
                f"ratio {row['publish_vs_commit']:.2f}  (audit commit {row['audit_commit_s']:.3f}s, "
                f"{row['audit_commit_vs_commit']:.2f}x)"
            )
            results.append(row)
    name = f"publish_cost_{args.backend}"
    save(name, {"backend": args.backend, "rounds": args.rounds, "tree": tree_named(Path.cwd()), "results": results})
    sizes = [r["files"] for r in results]
    plot_cost(
        name,
        f"publish vs commit ({args.backend})",
        sizes,
        [
            ("plain commit", [r["plain_commit_s"] for r in results], "o-"),
            ("publish", [r["publish_s"] for r in results], "s-"),
            ("audit commit", [r["audit_commit_s"] for r in results], "^-"),
        ],
        [
            ("publish / commit", [r["publish_vs_commit"] for r in results], "o-"),
            ("audit commit / commit", [r["audit_commit_vs_commit"] for r in results], "^-"),
        ],
        ratio_label="ratio",
        lines=[(1.2, "red", "target 1.2x")],
    )


if __name__ == "__main__":
    main()
