"""The meta store's database: its engine, its transactions, and the translation of driver errors.

The store and its companions (``sql.py``, ``registry.py``, ``checkpoints.py``, ``epochs.py``) each
hold this one object, so they share one connection pool and one rule for what a failure means: the
coordinator can tell "retry" (``MetaStoreUnavailable``) from "stop" (``StateConflict``) only if every
transaction translates storage errors the same way.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.extras import require
from airflow_provider_exactly_once.store import migrate
from airflow_provider_exactly_once.store.parsed_writes import PARSED, ParsedWrites

_WRITE = "exactly_once_write"
#: Off for a write whose loss in a crash of the database's host the package repairs by itself
#: (``transaction(..., durable=False)``); on by default.
_DURABLE = "exactly_once_durable"


class MetaStoreDatabase:
    """One SQLite or PostgreSQL database with the package's schema, migrated on construction.

    Construction applies the package's migrations (once per process per URL). Safe to share
    between threads; each process opens its own.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 10,
        busy_timeout_s: float = 30,
        echo: bool = False,
    ) -> None:
        for name, value in (("connect_timeout_s", connect_timeout_s), ("busy_timeout_s", busy_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidSinkConfig(f"meta store {name} must be a positive number of seconds, got {value!r}")
        if not isinstance(url, str) or not url.strip():
            raise InvalidSinkConfig(f"meta store URL must be a non-empty string, got {url!r}")
        try:
            self._url: URL = make_url(url)
        except ArgumentError:
            masked = mask_userinfo(url)
            raise InvalidSinkConfig(
                f"meta store URL {masked!r} is not a SQLAlchemy URL "
                "(expected e.g. sqlite:////path/meta.db or postgresql+psycopg2://user@host/db)"
            ) from None
        self._display = self._url.render_as_string(hide_password=True)
        self._busy_timeout_s = float(busy_timeout_s)
        backend = self._url.get_backend_name()
        self._sqlite_path: Path | None = None
        self._memory = False
        if backend == "sqlite":
            self._engine = self._sqlite_engine(busy_timeout_s, echo)
        elif backend == "postgresql":
            self._engine = self._postgresql_engine(connect_timeout_s, busy_timeout_s, echo)
        else:
            raise InvalidSinkConfig(
                f"meta store {self._display}: backend {backend!r} is not supported; use sqlite or postgresql"
            )
        self._postgresql = backend == "postgresql"
        # Writes go through this engine: on SQLite their transactions take the write lock up front.
        self._write_engine = self._engine.execution_options(**{_WRITE: True})
        self._lazy_write_engine = self._write_engine.execution_options(**{_DURABLE: False})
        #: The writes' metadata this database's sessions parsed or wrote (``parsed_writes.ParsedWrites``).
        self.parsed = ParsedWrites()
        try:
            self._ensure_schema()
        except BaseException:
            self._engine.dispose()
            raise

    # -- connection ------------------------------------------------------------------------------

    def _sqlite_engine(self, busy_timeout_s: float, echo: bool) -> Engine:
        database = self._url.database
        memory = not database or database == ":memory:" or "mode=memory" in database
        self._memory = memory
        if not memory and database is not None and not database.startswith("file:"):
            path = Path(database)
            if not path.parent.is_dir():
                raise MetaStoreUnavailable(
                    f"SQLite meta store {path}: the directory {path.parent} does not exist; "
                    "create it or point the connection at another path"
                )
            if path.is_dir():
                raise InvalidSinkConfig(f"SQLite meta store {path} is a directory, not a database file")
            self._sqlite_path = path
        engine = create_engine(
            self._url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_s},
            **({"poolclass": StaticPool} if memory else {"pool_timeout": busy_timeout_s}),
        )
        busy_ms = math.ceil(busy_timeout_s * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # pysqlite's own implicit BEGIN would defer the write lock to the first write, where a
            # busy database fails at once instead of waiting: transactions are begun below instead.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
                if not memory:
                    _set_wal(cursor, busy_timeout_s)
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(connection: Any) -> None:
            options = connection.get_execution_options()
            write = options.get(_WRITE, False)
            if write:
                # The level applies to the commit; it cannot change inside a transaction, and it stays
                # with the pooled connection, so every write sets the one it needs when it differs.
                level = "FULL" if options.get(_DURABLE, True) else "NORMAL"
                if connection.info.get(_DURABLE) != level:
                    connection.exec_driver_sql(f"PRAGMA synchronous = {level}")
                    connection.info[_DURABLE] = level
            connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def _postgresql_engine(self, connect_timeout_s: float, busy_timeout_s: float, echo: bool) -> Engine:
        if self._url.get_driver_name() == "psycopg2":
            require("psycopg2", extra="postgres", feature="a meta store on PostgreSQL")
        return create_engine(
            self._url,
            echo=echo,
            pool_pre_ping=True,
            pool_timeout=busy_timeout_s,
            connect_args={
                # libpq takes whole seconds and treats 1 as 2.
                "connect_timeout": max(2, math.ceil(connect_timeout_s)),
                # A CAS waiting on a row another transaction holds gives up like SQLite's busy timeout.
                "options": f"-c lock_timeout={math.ceil(busy_timeout_s * 1000)}",
            },
        )

    @property
    def url_for_display(self) -> str:
        return self._display

    @property
    def engine(self) -> Engine:
        return self._engine

    def dispose(self) -> None:
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"MetaStoreDatabase({self._display!r})"

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError) as exc:
            raise MetaStoreUnavailable(f"meta store {self._display} unavailable {action}: {_reason(exc)}") from exc
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            raise MetaStoreUnavailable(
                f"meta store {self._display} lost its connection {action}: {_reason(exc)}"
            ) from exc

    @contextmanager
    def transaction(self, action: str, *, write: bool, durable: bool = True) -> Iterator[Session]:
        """One transaction; ``write`` ones take SQLite's write lock up front (``BEGIN IMMEDIATE``),
        so a busy database waits at the start instead of failing at the first write.

        A write that is not ``durable`` returns from its commit without waiting for the disk: a crash
        of the database's host (not of a process) may lose it, never half of it, and never a
        durable write committed after it. Only for a write whose loss the package repairs by
        itself: the Committed mark, which the next commit attempt derives from the sink again.

        ``action`` completes the ``MetaStoreUnavailable`` message ("unavailable while ...").
        """
        engine = self._engine if not write else self._write_engine if durable else self._lazy_write_engine
        with (
            self._translated(action),
            Session(engine, expire_on_commit=False, info={PARSED: self.parsed}) as session,
            session.begin(),
        ):
            if write and not durable and self._postgresql:
                session.execute(text("SET LOCAL synchronous_commit = off"))
            yield session

    @contextmanager
    def reading(self, action: str) -> Iterator[Session]:
        """A read-only transaction, for queries kept outside the store's classes (``store/queries.py``:
        what the operations views list)."""
        with self.transaction(action, write=False) as session:
            yield session

    # -- schema ----------------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        # An in-memory SQLite database lives and dies with this engine: never "already migrated".
        key = None if self._memory else self._url.render_as_string(hide_password=False)
        if key is not None and migrate.already_applied(key):
            return
        where = self._display
        with self._translated("while reading its schema version"), self._engine.connect() as connection:
            revision = migrate.current_revision(connection)
        migrate.check_known(revision, where)
        if revision != migrate.head_revision():
            lock = (
                migrate.file_lock(
                    self._sqlite_path.with_name(self._sqlite_path.name + ".migrate.lock"),
                    self._busy_timeout_s,
                    where,
                )
                if self._sqlite_path is not None
                else nullcontext()
            )
            with (
                lock,
                self._translated("while migrating its schema"),
                self._write_engine.begin() as connection,
            ):
                migrate.upgrade_locked(connection, postgresql=self._postgresql)
        if key is not None:
            migrate.mark_applied(key)


def _reason(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else '(no message)'}"


def _set_wal(cursor: Any, timeout_s: float) -> None:
    """Put the database in WAL mode (a no-op once it is: the mode is kept in the file).

    Switching a fresh database's journal mode needs its exclusive lock, and SQLite answers "database
    is locked" at once, without its busy handler, while another connection holds a lock: processes
    opening a new database together (every task of a first run) would fail there. So the switch is
    tried again until the busy timeout, as the busy handler would have waited.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
