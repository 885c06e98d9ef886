"""Commit cost of the coordinator against a bare pyiceberg fast-append of the same prebuilt files.

The coordinator's path is everything an epoch pays for exactly-once: persist (validate, insert the
Pending row), the commit decision, a fresh table load, the marker walk, the existence check of every
data file, DataFile entries built from the descriptors, one append, and the Committed mark. The
bare path is what an at-least-once job does: load the table, fast-append prebuilt DataFile objects.

    uv run python -m bench.commit_cost [--backend sqlite|postgres] [--rounds 3]

Targets (design): at most 1.15x at 1,000 files and 1.05x at 10,000; cost linear in files.
"""

from __future__ import annotations

import argparse
import uuid

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from bench._world import median, plot_cost, save, timed, world, write_files

SIZES = [10, 100, 1000, 10000]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()

    results = []
    with world(args.backend) as w:
        sink_id = "bench-commit"
        coordinator = w.coordinator(sink_id)
        epoch = 0
        for size in args.sizes:
            eo_table, bare_table = w.table(f"eo_{size}"), w.table(f"bare_{size}")
            location = f"{eo_table.location()}/data/_eo/prebuilt"
            descriptors = write_files(eo_table, location, size)

            def data_files(table: Table, descriptors: list[DataFileDescriptor] = descriptors) -> list[DataFile]:
                return build_data_files(
                    descriptors,
                    schema=table.schema(),
                    spec=table.spec(),
                    spec_id=table.spec().spec_id,
                    format_version=table.format_version,
                    table=table.name()[-1],
                )

            prebuilt = data_files(bare_table)
            eo_times, bare_times, built_times = [], [], []
            for round_ in range(args.rounds):
                epoch += 1
                pre = PreCommit(
                    sink_id=sink_id,
                    epoch=epoch,
                    write_id=str(uuid.uuid4()),
                    tables=[TableWrite(table=f"bench.eo_{size}", location=location, data_files=descriptors)],
                )
                w.store.checkpoints.set_checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)

                def exactly_once(pre: PreCommit = pre) -> None:
                    coordinator.persist(pre)
                    coordinator.commit(pre.sink_id, pre.epoch)

                def bare(size: int = size, prebuilt: list[DataFile] = prebuilt) -> None:
                    table = w.catalog.load_table(f"bench.bare_{size}")
                    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                        for data_file in prebuilt:
                            append.append_data_file(data_file)

                def bare_built(size: int = size) -> None:
                    table = w.catalog.load_table(f"bench.bare_{size}")
                    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                        for data_file in data_files(table):
                            append.append_data_file(data_file)

                order = [(exactly_once, eo_times), (bare, bare_times), (bare_built, built_times)]
                for action, sink in order if round_ % 2 == 0 else reversed(order):
                    sink.append(timed(action))
            row = {
                "files": size,
                "exactly_once_s": median(eo_times),
                "bare_fast_append_s": median(bare_times),
                "bare_built_fast_append_s": median(built_times),
                "ratio": median(eo_times) / median(bare_times),
                "ratio_vs_built": median(eo_times) / median(built_times),
                "exactly_once_all_s": eo_times,
                "bare_all_s": bare_times,
                "bare_built_all_s": built_times,
            }
            print(
                f"{size:>6} files: exactly-once {row['exactly_once_s']:.3f}s  "
                f"bare(prebuilt DataFile) {row['bare_fast_append_s']:.3f}s ratio {row['ratio']:.3f}  "
                f"bare(DataFile from descriptors) {row['bare_built_fast_append_s']:.3f}s ratio {row['ratio_vs_built']:.3f}"
            )
            results.append(row)

    path = save(f"commit_cost_{args.backend}", {"backend": args.backend, "rounds": args.rounds, "results": results})
    files = [r["files"] for r in results]
    plot_cost(
        f"commit_cost_{args.backend}",
        f"commit cost ({args.backend})",
        files,
        [
            ("coordinator (persist + commit)", [r["exactly_once_s"] for r in results], "o-"),
            ("bare fast-append, prebuilt DataFile", [r["bare_fast_append_s"] for r in results], "s--"),
            ("bare fast-append, DataFile built", [r["bare_built_fast_append_s"] for r in results], "^:"),
        ],
        [
            ("vs prebuilt DataFile", [r["ratio"] for r in results], "o-"),
            ("vs DataFile built from descriptors", [r["ratio_vs_built"] for r in results], "^-"),
        ],
        ratio_label="coordinator / bare",
        lines=[(1.15, "orange", "1.15 target at 1,000"), (1.05, "red", "1.05 target at 10,000")],
    )
    print(f"wrote {path} and its PNG")


if __name__ == "__main__":
    main()
