"""Builders shared by the meta-store tests (a module, not a conftest, so spawned workers can import it)."""

from __future__ import annotations

import uuid
from typing import Any

from airflow_provider_exactly_once.core.precommit import PreCommit


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


def open_store_and_persist(url: str, sink_id: str, epoch: int, barrier: Any) -> None:
    """Worker of the concurrent first-use test: every process opens a fresh store at the same moment."""
    import alembic.command  # noqa: F401 - loaded up front so that no process gets a head start

    from airflow_provider_exactly_once.store import SqlSinkStateStore

    barrier.wait(timeout=60)
    store = SqlSinkStateStore(url)
    try:
        store.insert_pending(make_pre_commit(sink_id, epoch), run_id=f"run-{epoch}", try_number=1)
    finally:
        store.dispose()
