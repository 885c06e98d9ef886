"""Commit cost through a REST catalog on object storage: the coordinator against a bare pyiceberg
fast-append of the same prebuilt files, both on SeaweedFS (``weed mini``: REST catalog and S3).

What the local benchmark (``bench.commit_cost``) cannot show: every catalog call is an HTTP round
trip, every existence check a request, every manifest a PUT. The coordinator's extra work over
the bare append is its meta-store rows, the marker walk and the data files' existence check (one
listing of the write's location).

    uv run python -m bench.commit_cost_rest [--sizes 100 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import s3fs
from pyiceberg.catalog import load_catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter, describe_parquet_file
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.store import SqlSinkStateStore
from bench._world import SCHEMA, median, plot_cost, save, timed
from demo.servers import SeaweedFS

SIZES = [100, 1000]
ARROW = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("epoch", pa.int64()), pa.field("payload", pa.string())]
)


def put_files(fs: s3fs.S3FileSystem, table: Table, location: str, count: int) -> list[DataFileDescriptor]:
    """``count`` small Parquet objects, described from the writer's footer (as the Spark writer does)."""

    def put(n: int) -> DataFileDescriptor:
        ids = list(range(n * 10, n * 10 + 10))
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": ids, "epoch": [0] * 10, "payload": ["x" * 16] * 10}, schema=ARROW), buffer)
        payload = buffer.getvalue()
        path = f"{location}/part-{n:06d}.parquet"
        fs.pipe_file(path, payload)
        return describe_parquet_file(
            path,
            table_schema=table.schema(),
            partition={},
            writer=str(n),
            parquet_metadata=pq.read_metadata(io.BytesIO(payload)),
            file_size_in_bytes=len(payload),
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(put, range(count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="eo-bench-rest-") as tmp:
        server = SeaweedFS(Path(tmp) / "weed").start()
        try:
            catalog = load_catalog("bench", **server.catalog_properties())
            catalog.create_namespace("bench")
            fs = s3fs.S3FileSystem(**server.s3fs_options(), skip_instance_cache=True)
            store = SqlSinkStateStore(f"sqlite:///{Path(tmp) / 'meta.db'}")
            sink_id = "bench-commit-rest"
            coordinator = TwoPhaseCommitCoordinator(
                store, {sink_id: IcebergSinkCommitter(catalog)}, MetaStoreCheckpointSource(store.checkpoints)
            )
            epoch = 0
            for size in args.sizes:
                eo_table = catalog.create_table(f"bench.eo_{size}", schema=SCHEMA)
                catalog.create_table(f"bench.bare_{size}", schema=SCHEMA)
                location = f"{eo_table.location()}/data/_eo/prebuilt"
                descriptors = put_files(fs, eo_table, location, size)
                prebuilt: list[DataFile] = build_data_files(
                    descriptors,
                    schema=eo_table.schema(),
                    spec=eo_table.spec(),
                    spec_id=eo_table.spec().spec_id,
                    table=f"eo_{size}",
                )
                eo_times: list[float] = []
                bare_times: list[float] = []
                commit_times: list[float] = []  # the commit alone, after the persist that wrote its manifest
                for round_ in range(args.rounds):
                    epoch += 1
                    pre = PreCommit(
                        sink_id=sink_id,
                        epoch=epoch,
                        write_id=str(uuid.uuid4()),
                        tables=[TableWrite(table=f"bench.eo_{size}", location=location, data_files=descriptors)],
                    )
                    store.checkpoints.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)

                    def exactly_once(
                        pre: PreCommit = pre, commits: list[float] = commit_times, totals: list[float] = eo_times
                    ) -> None:
                        persisted = timed(lambda: coordinator.persist(pre))
                        commits.append(timed(lambda: coordinator.commit(pre.sink_id, pre.epoch)))
                        totals.append(persisted + commits[-1])

                    def bare(size: int = size, prebuilt: list[DataFile] = prebuilt) -> None:
                        table = catalog.load_table(f"bench.bare_{size}")
                        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                            for data_file in prebuilt:
                                append.append_data_file(data_file)

                    order: list[tuple[Callable[[], None], list[float] | None]] = [
                        (exactly_once, None),
                        (bare, bare_times),
                    ]
                    for action, sink in order if round_ % 2 == 0 else reversed(order):
                        if sink is None:
                            action()  # times its persist and its commit itself
                        else:
                            sink.append(timed(action))
                row = {
                    "files": size,
                    "exactly_once_s": median(eo_times),
                    "bare_fast_append_s": median(bare_times),
                    "ratio": median(eo_times) / median(bare_times),
                    "commit_s": median(commit_times),
                    "commit_ratio": median(commit_times) / median(bare_times),
                    "commit_all_s": commit_times,
                    "exactly_once_all_s": eo_times,
                    "bare_all_s": bare_times,
                }
                print(
                    f"{size:>6} files: exactly-once {row['exactly_once_s']:.3f}s  "
                    f"bare fast-append {row['bare_fast_append_s']:.3f}s  ratio {row['ratio']:.3f}  "
                    f"the commit alone after persist {row['commit_s']:.3f}s ratio {row['commit_ratio']:.3f}"
                )
                results.append(row)
            store.dispose()
        finally:
            server.stop()

    path = save(
        "commit_cost_rest", {"catalog": "rest (SeaweedFS weed mini)", "rounds": args.rounds, "results": results}
    )
    files = [r["files"] for r in results]
    plot_cost(
        "commit_cost_rest",
        "commit cost (REST catalog + S3, SeaweedFS)",
        files,
        [
            ("coordinator (persist + commit)", [r["exactly_once_s"] for r in results], "o-"),
            ("the commit alone, after persist", [r["commit_s"] for r in results], "P-"),
            ("bare fast-append, prebuilt DataFile", [r["bare_fast_append_s"] for r in results], "s--"),
        ],
        [
            ("coordinator / bare", [r["ratio"] for r in results], "o-"),
            ("the commit alone / bare", [r["commit_ratio"] for r in results], "P-"),
        ],
        ratio_label="coordinator / bare",
        lines=[(1.15, "orange", "1.15 target at 1,000 (local)")],
    )
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
