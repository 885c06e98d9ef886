"""Meta-store rows for tests that need rows rather than data: listings, permissions, leaks."""

from __future__ import annotations

import uuid

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore


def empty_write(sink_id: str, epoch: int, table: str, location: str) -> PreCommit:
    """A write with no files, under a write location of its own."""
    return PreCommit(
        sink_id=sink_id,
        epoch=epoch,
        write_id=str(uuid.uuid4()),
        tables=[TableWrite(table=table, location=f"{location}/_eo/{uuid.uuid4()}")],
    )


def register_file_sink_with_root(
    store: SqlSinkStateStore, sink_id: str, root: str, *, epoch: int, dag_id: str, run_id: str
) -> PreCommit:
    """A file sink registered with ``root`` as is (as before credentials in roots were refused), its
    marker checkpoint under the same root, and a Pending epoch of one file under it."""
    store.registry.register_sink(
        sink_id,
        {"kind": "files", "sink_id": sink_id, "root": root, "storage_options": {}},
        {"kind": "markers", "path_template": f"{root}/_landing/{{sink_id}}/{{epoch}}"},
    )
    pre = PreCommit(
        sink_id=sink_id,
        epoch=epoch,
        write_id=str(uuid.uuid4()),
        tables=[
            TableWrite(
                table=root,
                location=f"{root}/_eo/w1",
                data_files=[{"path": f"{root}/_eo/w1/part-0.parquet", "record_count": 1, "file_size_in_bytes": 9}],
            )
        ],
    )
    store.insert_pending(pre, run_id=run_id, try_number=1, dag_id=dag_id)
    return pre
