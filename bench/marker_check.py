"""Marker check on a table with 100 and with 10,000 earlier snapshots.

The table's metadata is real: a metadata file holding the history, registered in the SQL catalog
and loaded through it. The earlier snapshots are synthesised (cloned from one real snapshot with
older timestamps and a parent chain), because committing 10,000 snapshots one by one rewrites an
ever-growing metadata file 10,000 times and says nothing more about the walk.

Two figures per history size, each a median over many repetitions:
- ``walk``: the committer's marker look-up on the loaded metadata (what the design bounds);
- ``load_and_walk``: a fresh catalog load plus the walk (the load parses the whole metadata file,
  which is O(history) in any Iceberg client; reported so the walk's share is visible).

    uv run python -m bench.marker_check

Target (design): walk ratio 10,000 / 100 at most 1.2.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.markers import find_marker
from bench._world import RESULTS, median, save, world, write_files

HISTORIES = [100, 10_000]
SKEW_MS = int(timedelta(minutes=10).total_seconds() * 1000)


def main() -> None:
    results = []
    with world("sqlite") as w:
        sink_id = "bench-marker"
        for history in HISTORIES:
            table = w.table(f"history_{history}")
            # One real epoch committed through the coordinator: the snapshot whose marker we look for.
            location = f"{table.location()}/data/_eo/w"
            pre = PreCommit(
                sink_id=sink_id,
                epoch=history,
                write_id=str(uuid.uuid4()),
                tables=[
                    TableWrite(
                        table=f"bench.history_{history}", location=location, data_files=write_files(table, location, 1)
                    )
                ],
            )
            w.store.checkpoints.set_checkpoint(sink_id, history, CheckpointStatus.COMPLETED)
            coordinator = w.coordinator(sink_id)
            coordinator.persist(pre)
            coordinator.commit(sink_id, history)
            table = w.catalog.load_table(f"bench.history_{history}")
            real = table.metadata.snapshots[-1]

            # Synthesise `history` earlier snapshots (a day and more before the real one), then the
            # real marker snapshot on top of them, and register that metadata as a new table.
            earlier = []
            parent = None
            base_ts = real.timestamp_ms - 86_400_000 - history * 1000
            for n in range(history):
                clone = real.model_copy(
                    update={
                        "snapshot_id": 10_000_000 + n,
                        "parent_snapshot_id": parent,
                        "timestamp_ms": base_ts + n * 1000,
                        "summary": real.summary.model_copy(update={"additional_properties": {"note": "earlier"}}),
                    }
                )
                earlier.append(clone)
                parent = clone.snapshot_id
            head = real.model_copy(update={"parent_snapshot_id": parent})
            metadata = table.metadata.model_copy(
                update={
                    "snapshots": [*earlier, head],
                    "refs": {
                        "main": SnapshotRef(snapshot_id=head.snapshot_id, snapshot_ref_type=SnapshotRefType.BRANCH)
                    },
                    "snapshot_log": [],
                }
            )
            metadata_path = f"{table.location()}/metadata/bench-{history}.metadata.json"
            ToOutputFile.table_metadata(metadata, table.io.new_output(metadata_path), overwrite=True)
            name = f"bench.registered_{history}"
            w.catalog.register_table(name, metadata_path)
            loaded = w.catalog.load_table(name)
            assert len(loaded.metadata.snapshots) == history + 1
            not_before = head.timestamp_ms - SKEW_MS

            assert find_marker(loaded.metadata, sink_id, history, branch="main", not_before_ms=not_before) is not None
            walks, loads = [], []
            for _ in range(2000):
                start = time.perf_counter()
                find_marker(loaded.metadata, sink_id, history, branch="main", not_before_ms=not_before)
                walks.append(time.perf_counter() - start)
            for _ in range(10 if history > 1000 else 50):
                start = time.perf_counter()
                fresh = w.catalog.load_table(name)
                find_marker(fresh.metadata, sink_id, history, branch="main", not_before_ms=not_before)
                loads.append(time.perf_counter() - start)
            row = {"earlier_snapshots": history, "walk_s": median(walks), "load_and_walk_s": median(loads)}
            print(
                f"{history:>6} earlier snapshots: walk {row['walk_s'] * 1e6:.1f} us, load+walk {row['load_and_walk_s'] * 1e3:.1f} ms"
            )
            results.append(row)

    small, large = results
    ratios = {
        "walk_ratio": large["walk_s"] / small["walk_s"],
        "load_and_walk_ratio": large["load_and_walk_s"] / small["load_and_walk_s"],
    }
    print(f"walk ratio 10,000/100: {ratios['walk_ratio']:.3f}; load+walk ratio: {ratios['load_and_walk_ratio']:.1f}")
    path = save("marker_check", {"results": results, **ratios})
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [str(r["earlier_snapshots"]) for r in results]
    ax.bar([f"walk\n{label}" for label in labels], [r["walk_s"] * 1e6 for r in results], color="tab:blue")
    ax.set_ylabel("marker walk, microseconds (median)")
    ax.set_title(f"marker check: 10,000 vs 100 earlier snapshots, ratio {ratios['walk_ratio']:.2f}")
    fig.tight_layout()
    fig.savefig(RESULTS / "marker_check.png", dpi=100)
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
