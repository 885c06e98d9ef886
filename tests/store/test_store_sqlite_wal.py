"""A new SQLite meta store opened while another connection holds a lock on it waits, as for any
other busy moment, instead of failing at its switch to WAL (which SQLite answers at once)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from airflow_provider_exactly_once.store import SqlSinkStateStore


def test_opening_a_fresh_database_waits_for_a_lock_held_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x INTEGER)")  # a rollback-journal database, as a new file is
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other VALUES (1)")
    released = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    released.start()
    started = time.monotonic()
    try:
        store = SqlSinkStateStore(f"sqlite:///{path}", busy_timeout_s=10)
        try:
            assert store.now() is not None
        finally:
            store.dispose()
    finally:
        released.join()
        holder.close()
    assert time.monotonic() - started >= 0.4  # it waited for the lock, then switched and migrated
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
