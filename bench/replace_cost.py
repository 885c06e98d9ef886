"""Cost of replacing a committed epoch (a revision) against its first commit and pyiceberg's overwrite.

For each size, every round commits an epoch of N prebuilt files (persist + commit: the first commit),
then replaces it with another write of N files from a newer generation (persist opens the revision,
the commit is one overwrite snapshot removing the first write's files and adding the new ones). The
third path is what a job without this package does to redo an epoch: pyiceberg's
``Table.overwrite(df, overwrite_filter=epoch == e)`` of the same rows, which writes the data again
and makes two snapshots (a delete and an append). Its table holds the same epoch as the same N
files first (committed untimed, through a second sink), so both remove N files; pyiceberg then
writes the rows as few large files where the epoch writer had written N.

    uv run python -m bench.replace_cost [--backend sqlite|postgres|rest] [--rounds 3] [--sizes 1000 10000]

Writes bench/results/replace_cost_<backend>.json and .png. Ratios are of medians measured in the
same run, the three paths interleaved per round. Persist and commit are also timed apart: what a
persist prepares ahead (an append's manifest, a revision's manifests with the deleted entries) leaves
the commit alone, the step inside the catalog's contention window, to list them
(``*_commit_only_s``, ``replacement_commit_vs_first_commit``, ``replacement_commit_vs_pyiceberg_overwrite``).
"""

from __future__ import annotations

import argparse
import uuid

import pyarrow as pa
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from bench._world import BACKENDS, median, plot_cost, save, timed, world, write_files

SIZES = [1000, 10000]
ROWS_PER_FILE = 10
OLD, NEW = "2024-06-01T00:00:00.000000Z/0000000000", "2024-06-02T00:00:00.000000Z/0000000001"


def write_location(table: Table, write_id: str) -> str:
    """Where the epoch writer would put this write's files in the table (``sinks.layout``)."""
    return iceberg_write_location(iceberg_data_root(table.location(), table.properties), write_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()

    results = []
    with world(args.backend) as w:
        sink_id = "bench-replace"
        bare_sink = "bench-overwritten"
        committer = IcebergSinkCommitter(w.catalog)
        coordinator = TwoPhaseCommitCoordinator(
            w.store,
            {sink_id: committer, bare_sink: committer},
            w.checkpoints,
            on_reprocess={sink_id: "replace"},
        )
        epoch = 0
        for size in args.sizes:
            eo_table = w.table(f"replace_{size}")
            w.table(f"overwrite_{size}")
            first_times, replace_times, overwrite_times = [], [], []
            first_commits: list[float] = []
            replace_commits: list[float] = []
            for _ in range(args.rounds):
                epoch += 1
                w.store.checkpoints.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
                writes = []
                for generation in (OLD, NEW):
                    write_id = str(uuid.uuid4())
                    location = write_location(eo_table, write_id)
                    descriptors = write_files(eo_table, location, size, ROWS_PER_FILE, epoch=epoch)
                    writes.append(
                        PreCommit(
                            sink_id=sink_id,
                            epoch=epoch,
                            write_id=write_id,
                            generation=generation,
                            tables=[
                                TableWrite(table=f"bench.replace_{size}", location=location, data_files=descriptors)
                            ],
                        )
                    )

                def commit(pre: PreCommit, commits: list[float]) -> None:
                    coordinator.persist(pre)
                    commits.append(timed(lambda: coordinator.commit(pre.sink_id, pre.epoch)))

                rows = pa.table(
                    {
                        "id": pa.array(range(size * ROWS_PER_FILE), pa.int64()),
                        "epoch": pa.array([epoch] * size * ROWS_PER_FILE, pa.int64()),
                        "payload": pa.array(["x" * 16] * size * ROWS_PER_FILE, pa.string()),
                    },
                    schema=pa.schema(
                        [
                            pa.field("id", pa.int64(), nullable=False),
                            pa.field("epoch", pa.int64()),
                            pa.field("payload", pa.string()),
                        ]
                    ),
                )
                # The overwritten table holds the same epoch as the same N files, committed untimed.
                bare_table = w.catalog.load_table(f"bench.overwrite_{size}")
                bare_id = str(uuid.uuid4())
                bare_location = write_location(bare_table, bare_id)
                bare_write = PreCommit(
                    sink_id=bare_sink,
                    epoch=epoch,
                    write_id=bare_id,
                    generation=OLD,
                    tables=[
                        TableWrite(
                            table=f"bench.overwrite_{size}",
                            location=bare_location,
                            data_files=write_files(bare_table, bare_location, size, ROWS_PER_FILE, epoch=epoch),
                        )
                    ],
                )
                w.store.checkpoints.set_checkpoint(bare_sink, epoch, CheckpointStatus.COMPLETED)
                coordinator.persist(bare_write)
                coordinator.commit(bare_sink, epoch)

                def overwrite(epoch: int = epoch, rows: pa.Table = rows, size: int = size) -> None:
                    table = w.catalog.load_table(f"bench.overwrite_{size}")
                    table.overwrite(rows, overwrite_filter=EqualTo("epoch", epoch))

                first, second = writes
                first_times.append(timed(lambda first=first, into=first_commits: commit(first, into)))  # type: ignore[misc]
                replace_times.append(timed(lambda second=second, into=replace_commits: commit(second, into)))  # type: ignore[misc]
                overwrite_times.append(timed(overwrite))
                redone = w.catalog.load_table(f"bench.overwrite_{size}").scan(row_filter=EqualTo("epoch", epoch))
                assert len(redone.to_arrow()) == size * ROWS_PER_FILE, "the overwrite must replace, not add"
            row = {
                "files": size,
                "rows": size * ROWS_PER_FILE,
                "first_commit_s": median(first_times),
                "replacement_s": median(replace_times),
                "pyiceberg_overwrite_s": median(overwrite_times),
                "replacement_vs_first": median(replace_times) / median(first_times),
                "replacement_vs_pyiceberg_overwrite": median(replace_times) / median(overwrite_times),
                "first_commit_only_s": median(first_commits),
                "replacement_commit_only_s": median(replace_commits),
                "replacement_commit_vs_first_commit": median(replace_commits) / median(first_commits),
                "replacement_commit_vs_pyiceberg_overwrite": median(replace_commits) / median(overwrite_times),
                "first_all_s": first_times,
                "first_commit_only_all_s": first_commits,
                "replacement_commit_only_all_s": replace_commits,
                "replacement_all_s": replace_times,
                "pyiceberg_overwrite_all_s": overwrite_times,
            }
            print(
                f"{size:>6} files: first commit {row['first_commit_s']:.3f}s  replacement {row['replacement_s']:.3f}s "
                f"(x{row['replacement_vs_first']:.2f})  pyiceberg overwrite {row['pyiceberg_overwrite_s']:.3f}s "
                f"(replacement x{row['replacement_vs_pyiceberg_overwrite']:.2f} of it); commit alone: first "
                f"{row['first_commit_only_s']:.3f}s, replacement {row['replacement_commit_only_s']:.3f}s "
                f"(x{row['replacement_commit_vs_first_commit']:.2f}, "
                f"x{row['replacement_commit_vs_pyiceberg_overwrite']:.2f} of pyiceberg's overwrite)"
            )
            results.append(row)

    path = save(f"replace_cost_{args.backend}", {"backend": args.backend, "rounds": args.rounds, "results": results})
    files = [r["files"] for r in results]
    plot_cost(
        f"replace_cost_{args.backend}",
        f"replacement cost ({args.backend})",
        files,
        [
            ("first commit (persist + commit)", [r["first_commit_s"] for r in results], "o-"),
            ("replacement (revision: persist + overwrite)", [r["replacement_s"] for r in results], "s-"),
            ("pyiceberg overwrite(df, filter)", [r["pyiceberg_overwrite_s"] for r in results], "^:"),
            ("first commit alone, after persist", [r["first_commit_only_s"] for r in results], "o--"),
            ("replacement commit alone, after persist", [r["replacement_commit_only_s"] for r in results], "s--"),
        ],
        [
            ("replacement / first commit", [r["replacement_vs_first"] for r in results], "o-"),
            ("replacement / pyiceberg overwrite", [r["replacement_vs_pyiceberg_overwrite"] for r in results], "^-"),
            ("commit alone: replacement / first", [r["replacement_commit_vs_first_commit"] for r in results], "o--"),
            (
                "commit alone: replacement / pyiceberg overwrite",
                [r["replacement_commit_vs_pyiceberg_overwrite"] for r in results],
                "^--",
            ),
        ],
        ratio_label="ratio",
        lines=[(1.0, "grey", None)],
    )
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
