"""Cost of an upsert's commit once its persist wrote the manifests (issue 33 item 3), against the same
commit writing them itself (the path before).

For each size N and round, two keyed tables (``id`` the identifier field) each get an epoch of N
prebuilt files (committed untimed, as appends), then an upsert epoch that rewrote all N files and
writes N new ones: persisted and committed through the coordinator, once with the committer staging
its manifests at persist (``prepared``) and once with a committer that stages nothing (``own``, its
commit looks the rewritten files up and writes every manifest, as every upsert did before). The two
are interleaved per round; ratios are of medians measured in the same run.

    uv run python -m bench.upsert_commit_cost [--backend sqlite|postgres] [--rounds 3] [--sizes 1000 10000]

Writes bench/results/upsert_commit_cost_<backend>.json and .png.
"""

from __future__ import annotations

import argparse
import base64
import uuid

from pyiceberg.conversions import to_bytes
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RewrittenFile
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.layout import iceberg_data_root, iceberg_write_location
from bench._world import SCHEMA, World, median, plot_cost, save, timed, world, write_files

SIZES = [1000, 10000]
ROWS_PER_FILE = 10
KEYED = Schema(*SCHEMA.fields, identifier_field_ids=[1])


class _Unstaged(IcebergSinkCommitter):
    """The committer as it was for upserts before: nothing written at persist."""

    def stage(self, plan: CommitPlan) -> PreCommit:
        return plan.pre_commit


def _bound(value: int) -> str:
    return base64.b64encode(to_bytes(LongType(), value)).decode("ascii")


def _location(table: Table, write_id: str) -> str:
    return iceberg_write_location(iceberg_data_root(table.location(), table.properties), write_id)


def _round(
    w: World, coordinator: TwoPhaseCommitCoordinator, sink: str, name: str, epoch: int, size: int
) -> tuple[float, float]:
    """An epoch of ``size`` files appended, then an upsert epoch that rewrote them all: (persist, commit) seconds."""
    table = w.catalog.load_table(name)
    base_id = str(uuid.uuid4())
    base = write_files(table, _location(table, base_id), size, ROWS_PER_FILE, epoch=epoch)
    pre = PreCommit(
        sink_id=f"{sink}-base",
        epoch=epoch,
        write_id=base_id,
        tables=[TableWrite(table=name, location=_location(table, base_id), data_files=base)],
    )
    w.store.checkpoints.set_checkpoint(pre.sink_id, epoch, CheckpointStatus.COMPLETED)
    coordinator.persist(pre)
    coordinator.commit(pre.sink_id, epoch)
    table = w.catalog.load_table(name)
    write_id = str(uuid.uuid4())
    location = _location(table, write_id)
    upsert = PreCommit(
        sink_id=sink,
        epoch=epoch,
        write_id=write_id,
        tables=[
            TableWrite(
                table=name,
                location=location,
                data_files=write_files(table, location, size, ROWS_PER_FILE, epoch=epoch),
                rewritten=[RewrittenFile(path=d.path, record_count=ROWS_PER_FILE) for d in base],
                read_snapshot_id=table.metadata.current_snapshot_id,
                changes=ChangeCounts(inserted=0, updated=size * ROWS_PER_FILE, deleted=0, deletes_of_absent_keys=0),
                key_lower_bounds={"id": _bound(0)},
                key_upper_bounds={"id": _bound(size * ROWS_PER_FILE - 1)},
            )
        ],
    )
    w.store.checkpoints.set_checkpoint(sink, epoch, CheckpointStatus.COMPLETED)
    persist = timed(lambda: coordinator.persist(upsert))
    commit = timed(lambda: coordinator.commit(sink, epoch))
    return persist, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()

    results = []
    with world(args.backend) as w:
        paths = {"prepared": IcebergSinkCommitter(w.catalog), "own": _Unstaged(w.catalog)}
        coordinators = {
            path: TwoPhaseCommitCoordinator(
                w.store, {f"bench-{path}": committer, f"bench-{path}-base": committer}, w.checkpoints
            )
            for path, committer in paths.items()
        }
        epoch = 0
        for size in args.sizes:
            w.catalog.create_namespace_if_not_exists("bench")
            for path in paths:
                w.catalog.create_table(f"bench.upsert_{path}_{size}", schema=KEYED)
            timings: dict[str, dict[str, list[float]]] = {p: {"persist": [], "commit": []} for p in paths}
            for _ in range(args.rounds):
                epoch += 1
                for path, coordinator in coordinators.items():
                    persist, commit = _round(
                        w, coordinator, f"bench-{path}", f"bench.upsert_{path}_{size}", epoch, size
                    )
                    timings[path]["persist"].append(persist)
                    timings[path]["commit"].append(commit)
            row = {
                "files": size,
                **{f"{p}_{step}_s": median(t[step]) for p, t in timings.items() for step in ("persist", "commit")},
                **{f"{p}_{step}_all_s": t[step] for p, t in timings.items() for step in ("persist", "commit")},
            }
            row["prepared_commit_vs_own"] = row["prepared_commit_s"] / row["own_commit_s"]
            row["prepared_total_vs_own"] = (row["prepared_persist_s"] + row["prepared_commit_s"]) / (
                row["own_persist_s"] + row["own_commit_s"]
            )
            print(
                f"{size:>6} files: commit prepared {row['prepared_commit_s']:.3f}s, own {row['own_commit_s']:.3f}s "
                f"(x{row['prepared_commit_vs_own']:.2f}); persist+commit x{row['prepared_total_vs_own']:.2f}"
            )
            results.append(row)
        if len(results) > 1:
            flat = results[-1]["prepared_commit_s"] / results[0]["prepared_commit_s"]
            print(f"prepared commit, {results[-1]['files']} files against {results[0]['files']}: x{flat:.2f}")

    path = save(
        f"upsert_commit_cost_{args.backend}", {"backend": args.backend, "rounds": args.rounds, "results": results}
    )
    files = [r["files"] for r in results]
    plot_cost(
        f"upsert_commit_cost_{args.backend}",
        f"upsert commit ({args.backend})",
        files,
        [
            ("commit, manifests prepared at persist", [r["prepared_commit_s"] for r in results], "o-"),
            ("commit, manifests written at commit", [r["own_commit_s"] for r in results], "s--"),
        ],
        [("prepared / own (commit)", [r["prepared_commit_vs_own"] for r in results], "o-")],
        ratio_label="ratio (same run)",
        lines=[(1.0, "grey", None)],
    )
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
