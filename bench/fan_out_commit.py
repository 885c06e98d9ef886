"""A fan-out epoch's commit in one catalog transaction against one commit per table (design.md, D18):
on a SQL catalog (``--backend sqlite`` or ``postgres``: one database transaction moving every
table's pointer) or behind a REST catalog (``rest``, SeaweedFS's ``weed mini``, started here: one
``transactions/commit`` over the tables, asked for, since SeaweedFS does not list the route). The
per-table path is the same catalog with ``exactly-once.multi-table-commit: false``.

For 2 and 8 tables, each round writes an epoch of one small file per table and persists it, for
each path, then times ``coordinator.commit`` (the decision, the table loads and marker checks, the
catalog update or updates, the Committed mark). Two spans are read from the committer's fault points:

- ``visible_s``: from the commit's start to the catalog's answer to its last update, when every
  table shows the epoch;
- ``torn_s``: from the answer to its first table update to the answer to its last, while a reader
  sees the epoch in some tables only. One transaction has one answer, so it is 0 there by
  construction; on a REST catalog what remains inside the server (SeaweedFS moves the tables'
  pointers one after the other) is not seen from here, while a SQL catalog's one database
  transaction leaves nothing.

The paths alternate within a round, each on tables and a sink of its own, so they share the
machine's drift; the ratios (``transaction / per_table``, medians) are the result.

    uv run python -m bench.fan_out_commit [--backend sqlite|postgres|rest] [--tables 2 8] [--rounds 15]

Writes bench/results/fan_out_commit_<backend>.json and .png.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from pyiceberg.catalog import load_catalog

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.table_transactions import SETTING
from airflow_provider_exactly_once.sinks.iceberg.transaction import FAULT_AFTER_CATALOG_UPDATE
from bench._world import BACKENDS, World, median, save, world, write_files

PATHS = ("transaction", "per_table")
CATALOGS = {
    "sqlite": "SQL catalog on SQLite",
    "postgres": "SQL catalog on PostgreSQL",
    "rest": "rest (SeaweedFS weed mini)",
}


class Clock:
    """The committer's fault hook: when each catalog update was answered."""

    def __init__(self) -> None:
        self.answered: list[float] = []

    def __call__(self, point: str) -> None:
        if point == FAULT_AFTER_CATALOG_UPDATE:
            self.answered.append(time.perf_counter())


def _coordinator(w: World, path: str, sink_id: str, clock: Clock) -> TwoPhaseCommitCoordinator:
    # SeaweedFS does not list the route: the transaction path asks for it (docs/operations.md); a SQL
    # catalog takes it unasked. Named as the world's catalog: a SQL catalog's rows carry its name.
    setting = "true" if path == "transaction" else "false"
    catalog = load_catalog(w.catalog.name, **{**w.catalog.properties, SETTING: setting})
    committer = IcebergSinkCommitter(catalog, fault=clock)
    assert committer.transactions.offered is (path == "transaction")
    return TwoPhaseCommitCoordinator(w.store, {sink_id: committer}, w.checkpoints)


def _epoch(w: World, sink_id: str, names: list[str], epoch: int) -> PreCommit:
    write_id = str(uuid.uuid4())
    tables = []
    for name in names:
        table = w.catalog.load_table(name)
        location = f"{table.location()}/data/_eo/{write_id}"
        tables.append(
            TableWrite(table=name, location=location, data_files=write_files(table, location, 1, epoch=epoch))
        )
    return PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--tables", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with world(args.backend) as w:
        for count in args.tables:
            samples: dict[str, dict[str, list[float]]] = {
                p: {"commit_s": [], "visible_s": [], "torn_s": []} for p in PATHS
            }
            setups = {}
            for path in PATHS:
                names = [f"bench.{path}_{count}_{n}" for n in range(count)]
                for name in names:
                    w.table(name.split(".", 1)[1])
                sink_id = f"fan-out-{path}-{count}"
                clock = Clock()
                setups[path] = (names, sink_id, clock, _coordinator(w, path, sink_id, clock))
            for epoch in range(1, args.rounds + 1):
                for path in PATHS if epoch % 2 else reversed(PATHS):
                    names, sink_id, clock, coordinator = setups[path]
                    pre = _epoch(w, sink_id, names, epoch)
                    coordinator.persist(pre)
                    w.store.checkpoints.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
                    clock.answered.clear()
                    start = time.perf_counter()
                    coordinator.commit(sink_id, epoch)
                    took = time.perf_counter() - start
                    expected = 1 if path == "transaction" else count
                    assert len(clock.answered) == expected, (path, clock.answered)
                    samples[path]["commit_s"].append(took)
                    samples[path]["visible_s"].append(clock.answered[-1] - start)
                    samples[path]["torn_s"].append(clock.answered[-1] - clock.answered[0])
            row: dict[str, Any] = {"tables": count, "rounds": args.rounds}
            for path in PATHS:
                row[path] = {key: median(values) for key, values in samples[path].items()}
            row["commit_ratio"] = row["transaction"]["commit_s"] / row["per_table"]["commit_s"]
            row["visible_ratio"] = row["transaction"]["visible_s"] / row["per_table"]["visible_s"]
            results.append(row)
            print(
                f"{count} tables: commit {row['transaction']['commit_s'] * 1000:.0f} ms in one transaction, "
                f"{row['per_table']['commit_s'] * 1000:.0f} ms per table (ratio {row['commit_ratio']:.2f}); "
                f"all visible after {row['transaction']['visible_s'] * 1000:.0f} against "
                f"{row['per_table']['visible_s'] * 1000:.0f} ms (ratio {row['visible_ratio']:.2f}); "
                f"torn for {row['per_table']['torn_s'] * 1000:.0f} ms per epoch on the per-table path",
                flush=True,
            )
    name = f"fan_out_commit_{args.backend}"
    path = save(name, {"catalog": CATALOGS[args.backend], "results": results})
    _plot(name, CATALOGS[args.backend], results)
    print(f"wrote {path} and its PNG")


def _plot(name: str, catalog: str, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench._world import RESULTS

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    counts = [r["tables"] for r in results]
    for axis, key, title in zip(
        axes,
        ("commit_s", "visible_s", "torn_s"),
        ("commit (median)", "until every table shows it", "some tables only"),
        strict=True,
    ):
        for path, style in zip(PATHS, ("o-", "s--"), strict=True):
            axis.plot(counts, [r[path][key] * 1000 for r in results], style, label=path.replace("_", " "))
        axis.set_xlabel("tables in the fan-out")
        axis.set_ylabel("ms")
        axis.set_title(title)
        axis.set_xticks(counts)
        axis.legend()
    fig.suptitle(f"A fan-out epoch's commit, {catalog}: one transaction against one commit per table")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
