"""The builders every test folder shares: pre-commits and meta-store rows without data, free ports.

A module, not a conftest, so that processes the tests spawn can import it too.
"""

from __future__ import annotations

import json
import socket
import uuid
import zlib
from typing import Any

import sqlalchemy as sa

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store.rows import head_of
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

#: Positions persist accepted before it refused what parses as no range (issue 54): a range with no end.
OPEN_RANGE = {"kind": "iceberg_snapshots", "table": "up.events", "after_snapshot_id": 5}


def make_pre_commit(
    sink_id: str,
    epoch: int,
    *,
    write_id: str | None = None,
    tables: tuple[str, ...] = ("db.events",),
    files: int = 2,
) -> PreCommit:
    """A valid pre-commit with ``files`` data files per table under a location unique to the write."""
    write_id = write_id or str(uuid.uuid4())
    table_writes: list[dict[str, Any]] = []
    for table in tables:
        location = f"file:///warehouse/{table}/_staging/{epoch}/{write_id}"
        table_writes.append(
            {
                "table": table,
                "location": location,
                "data_files": [
                    {
                        "path": f"{location}/part-{n:05d}.parquet",
                        "record_count": 10 + n,
                        "file_size_in_bytes": 1000 + n,
                        "partition": {"day": 19000 + n % 7},
                        "value_counts": {"id": 10 + n},
                        "lower_bounds": {"id": "AQAAAAAAAAA="},
                        "upper_bounds": {"id": "ZAAAAAAAAAA="},
                        "writer": f"task-{n % 16}",
                    }
                    for n in range(files)
                ],
            }
        )
    return PreCommit.parse({"sink_id": sink_id, "epoch": epoch, "write_id": write_id, "tables": table_writes})


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plant_stored_write(engine: sa.Engine, pre: PreCommit, **changes: Any) -> None:
    """Rewrite the stored metadata of ``pre``'s persisted row, and its head, as an older release or a
    hand edit left them: ``pre``'s JSON with ``changes``, never validated (persist refuses such now)."""
    text = json.dumps({**json.loads(pre.to_json()), **changes})
    head = json.loads(zlib.decompress(head_of(pre)))
    head["write"].update(changes)
    with engine.begin() as connection:
        changed = connection.execute(
            sa.text(
                "UPDATE epoch_metadata SET metadata = NULL, metadata_zlib = :packed, metadata_bytes = :size, "
                "head_zlib = :head WHERE sink_id = :sink AND epoch = :epoch AND write_id = :write"
            ),
            {
                "packed": zlib.compress(text.encode()),
                "size": len(text.encode()),
                "head": zlib.compress(json.dumps(head).encode()),
                "sink": pre.sink_id,
                "epoch": pre.epoch,
                "write": pre.write_id,
            },
        )
        assert changed.rowcount == 1, f"no stored write {pre.write_id} of sink {pre.sink_id!r} epoch {pre.epoch}"
