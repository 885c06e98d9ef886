"""Applying the package's Alembic migrations on first use, safely from many processes at once.

Every task of every DAG run opens the store, often several at the same moment on a fresh database.
So the upgrade is serialised across processes (an advisory lock on PostgreSQL, a lock file next to
the database on SQLite), checked again once the lock is held, and skipped without any DDL or lock
when the database is already at head.

Alembic itself is imported only when there is something to migrate: every Airflow task opens the
store, and the up-to-date check is one plain query.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.store.models import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: The newest revision under ``migrations/versions`` (a test keeps the two in step).
HEAD_REVISION = "0014"

#: ``pg_advisory_xact_lock`` key of the upgrade ("EOMS" as bytes); advisory keys are per database.
PG_MIGRATION_LOCK_KEY = 0x454F4D53

_applied: set[str] = set()
_applied_lock = threading.Lock()


def alembic_config(connection: Connection | None = None) -> Config:
    """A config pointing into the installed package, so no ``alembic.ini`` has to be shipped."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    return HEAD_REVISION


def scripted_head_revision() -> str | None:
    """The head as Alembic computes it from the revision files."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return None if head is None else str(head)


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The database's revision, read without Alembic (see the module docstring)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    revisions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(revisions) > 1:
        raise InvalidSinkConfig(
            f"{VERSION_TABLE} holds several heads {revisions}; this package has one line of revisions"
        )
    return str(revisions[0]) if revisions else None


def already_applied(key: str) -> bool:
    with _applied_lock:
        return key in _applied


def mark_applied(key: str) -> None:
    with _applied_lock:
        _applied.add(key)


def forget_applied() -> None:
    """Make the next store construction look at the database again (tests of first use)."""
    with _applied_lock:
        _applied.clear()


def check_known(revision: str | None, where: str) -> None:
    """Refuse a database migrated by a newer version of the package rather than guess at its schema.

    A database at this package's head is known without asking Alembic: that is every task start
    once the store exists, and walking the revision files costs Alembic's import.
    """
    if revision is None or revision == head_revision():
        return
    if revision not in known_revisions():
        raise InvalidSinkConfig(
            f"meta store {where} is at schema revision {revision!r}, which this version of "
            "airflow-provider-exactly-once does not know; upgrade the package"
        )


def upgrade_locked(connection: Connection, *, postgresql: bool) -> bool:
    """Upgrade to head inside the caller's transaction; returns whether anything was applied.

    On PostgreSQL the transaction-scoped advisory lock makes concurrent first users queue here; the
    revision is read again under it, so the losers of the race find the work done and do no DDL.
    """
    if postgresql:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
    revision = current_revision(connection)
    if revision == head_revision():
        return False
    from alembic import command

    command.upgrade(alembic_config(connection), "head")
    return True


@contextmanager
def file_lock(path: Path, timeout_s: float, where: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for at most ``timeout_s``.

    The file is left in place afterwards: removing a lock file lets a waiter lock an unlinked inode
    while a newcomer locks a fresh one, and both would migrate.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MetaStoreUnavailable(
                        f"meta store {where}: another process held the migration lock {path} "
                        f"for more than {timeout_s:g}s"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
