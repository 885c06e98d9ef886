"""The worker of the meta-store tests' concurrent first use (a module, not a conftest, so spawned workers can import it)."""

from __future__ import annotations

from typing import Any

from tests.support.builders import make_pre_commit


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
