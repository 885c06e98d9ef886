"""The worker of the meta-store tests' concurrent first use (a module, not a conftest, so spawned workers can import it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tests.support.builders import make_pre_commit

if TYPE_CHECKING:
    from airflow_provider_exactly_once.store import SqlSinkStateStore


@contextmanager
def another_process(url: str) -> Iterator[SqlSinkStateStore]:
    """A store of its own on the same database, as a task in another process opens one: it knows
    none of the writes the test's store parsed or wrote, and reads their metadata from the database."""
    from airflow_provider_exactly_once.store import SqlSinkStateStore

    store = SqlSinkStateStore(url)
    try:
        yield store
    finally:
        store.dispose()


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
