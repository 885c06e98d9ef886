"""Migrations on first use, concurrent first use, connection settings and storage-error translation."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine
from store_helpers import open_store_and_persist

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import (
    current_revision,
    file_lock,
    forget_applied,
    head_revision,
    known_revisions,
    scripted_head_revision,
)
from airflow_provider_exactly_once.store.models import VERSION_TABLE, Base
from tests.support.builders import make_pre_commit

TABLES = {
    "pending_sink_state",
    "epoch_metadata",
    "sink_cleanup",
    "checkpoint_state",
    "epoch_allocation",
    "sink_registry",
    "sink_lock",
    VERSION_TABLE,
}
EPOCH = 1_700_000_000_000


class _Statements:
    """Every SQL statement any engine in this process runs while it is active."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(" ".join(statement.split()))

    @property
    def ddl(self) -> list[str]:
        return [s for s in self.seen if s.split(" ", 1)[0].upper() in {"CREATE", "ALTER", "DROP"}]


@pytest.fixture
def statements() -> Iterator[_Statements]:
    recorder = _Statements()
    sa.event.listen(Engine, "before_cursor_execute", recorder)
    yield recorder
    sa.event.remove(Engine, "before_cursor_execute", recorder)


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_run_on_first_use_and_match_the_models(fresh_url: str, statements: _Statements) -> None:
    assert not _tables(fresh_url) & TABLES
    store = SqlSinkStateStore(fresh_url)
    try:
        assert _tables(fresh_url) >= TABLES
        assert any(s.startswith("CREATE TABLE pending_sink_state") for s in statements.ddl)
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, Base.metadata) == [], "models and migrations disagree"
        # The CHECK constraint is in the database, not only in the code.
        with pytest.raises(sa.exc.IntegrityError, match="ck_pending_sink_state_status"), store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id) VALUES ('s', 1, 'Done', 'w')"
                )
            )
    finally:
        store.dispose()


def test_the_declared_head_is_the_scripted_head() -> None:
    assert head_revision() == scripted_head_revision()
    assert known_revisions() == {
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
        "0011",
        "0012",
        "0013",
        "0014",
        "0015",
    }


def test_a_second_open_does_no_ddl(fresh_url: str, statements: _Statements) -> None:
    SqlSinkStateStore(fresh_url).dispose()
    forget_applied()  # as in a new process
    statements.seen.clear()
    SqlSinkStateStore(fresh_url).dispose()
    assert statements.seen, "a new process looks at the schema version once"
    assert statements.ddl == []
    assert not [s for s in statements.seen if "advisory" in s], "no lock is taken when nothing is to do"

    statements.seen.clear()
    store = SqlSinkStateStore(fresh_url)  # same process, same URL: not even a look
    assert statements.seen == []
    store.dispose()


def test_concurrent_first_use_from_four_processes(fresh_url: str) -> None:
    sink_id = f"sink-{uuid.uuid4().hex[:10]}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    workers = [
        context.Process(target=open_store_and_persist, args=(fresh_url, sink_id, EPOCH + n, barrier)) for n in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    store = SqlSinkStateStore(fresh_url)
    try:
        assert [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.PENDING)] == [
            EPOCH + n for n in range(4)
        ]
    finally:
        store.dispose()


def test_a_database_from_a_newer_package_is_refused(fresh_url: str) -> None:
    SqlSinkStateStore(fresh_url).dispose()
    engine = sa.create_engine(fresh_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    forget_applied()
    with pytest.raises(InvalidSinkConfig, match=r"schema revision '9999'.*upgrade the package"):
        SqlSinkStateStore(fresh_url)


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'wal.db'}", busy_timeout_s=7)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7000
    finally:
        store.dispose()


def test_in_memory_sqlite_works_and_each_store_is_its_own_database(sink_id: str) -> None:
    for _ in range(2):
        store = SqlSinkStateStore("sqlite://")
        try:
            assert store.get(sink_id, EPOCH) is None
            store.insert_pending(make_pre_commit(sink_id, EPOCH), run_id=None, try_number=None)
            assert store.get(sink_id, EPOCH) is not None
        finally:
            store.dispose()


# -- unreachable and busy stores -----------------------------------------------------------------


def test_unreachable_postgresql_is_unavailable_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(MetaStoreUnavailable) as raised:
        SqlSinkStateStore("postgresql+psycopg2://eo:s3cret@127.0.0.1:1/meta", connect_timeout_s=2)
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert "postgresql+psycopg2://eo:***@127.0.0.1:1/meta" in message and "s3cret" not in message
    assert raised.value.retryable


def test_sqlite_in_a_missing_directory_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "meta.db"
    with pytest.raises(MetaStoreUnavailable) as raised:
        SqlSinkStateStore(f"sqlite:///{path}")
    assert f"SQLite meta store {path}: the directory {path.parent} does not exist" in str(raised.value)
    assert not path.parent.exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a SQLAlchemy URL"),
        ("mysql://u:pw@h/db", r"mysql://u:\*\*\*@h/db: backend 'mysql' is not supported"),
        ("", "non-empty"),
    ],
)
def test_bad_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=message):
        SqlSinkStateStore(url)


def test_bad_timeouts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSinkConfig, match="busy_timeout_s must be a positive number"):
        SqlSinkStateStore(f"sqlite:///{tmp_path / 'm.db'}", busy_timeout_s=0)
    with pytest.raises(InvalidSinkConfig, match="connect_timeout_s"):
        SqlSinkStateStore(f"sqlite:///{tmp_path / 'm.db'}", connect_timeout_s=-1)


def test_url_for_display_masks_the_password(tmp_path: Path) -> None:
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'm.db'}")
    assert store.url_for_display == f"sqlite:///{tmp_path / 'm.db'}"
    store.dispose()


def test_a_locked_database_is_unavailable_not_half_written(meta_url: str, backend: str, sink_id: str) -> None:
    SqlSinkStateStore(meta_url).insert_pending(make_pre_commit(sink_id, EPOCH), run_id=None, try_number=None)
    store = SqlSinkStateStore(meta_url, busy_timeout_s=0.3)
    if backend == "sqlite":
        holder: Any = sqlite3.connect(sa.make_url(meta_url).database, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:
        holder = sa.create_engine(meta_url).connect()
        holder.execute(sa.text("SELECT * FROM pending_sink_state WHERE sink_id = :s FOR UPDATE"), {"s": sink_id})
    try:
        row = store.get(sink_id, EPOCH)  # readers are not blocked by a writer
        assert row is not None
        started = time.monotonic()
        with pytest.raises(MetaStoreUnavailable) as raised:
            store.mark_aborted(sink_id, EPOCH, write_id=row.write_id, reason="r")
        assert time.monotonic() - started < 5
        assert store.url_for_display in str(raised.value)
        assert ("database is locked" if backend == "sqlite" else "lock timeout") in str(raised.value)
    finally:
        holder.rollback()
        holder.close()
    assert store.get(sink_id, EPOCH) == row and store.cleanups(sink_id) == []
    store.dispose()


def test_the_sqlite_migration_lock_excludes_and_times_out(tmp_path: Path) -> None:
    lock = tmp_path / "meta.db.migrate.lock"
    with file_lock(lock, 1, "here"):
        started = time.monotonic()
        with (
            pytest.raises(MetaStoreUnavailable, match=re.escape(f"migration lock {lock} for more than 0.2s")),
            file_lock(lock, 0.2, "here"),
        ):
            pass  # pragma: no cover - must not be reached
        assert 0.2 <= time.monotonic() - started < 2
    with file_lock(lock, 0.2, "here"):  # released: free again
        pass
    assert lock.exists()
