"""The meta store's database: its engine and transactions, the translation of driver errors, the
Alembic migrations applied on first use under a lock, and the writes a store parsed (design.md,
"The meta store").

Every store class holds this one object, so they share one connection pool, one rule for what a
failure means (``MetaStoreUnavailable`` is "retry", ``StateConflict`` is "stop"), and one cache of
parsed writes.
"""

from __future__ import annotations

import fcntl
import math
import os
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    mask_userinfo,
)
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.extras import require
from airflow_provider_exactly_once.store.models import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

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
        #: The writes' metadata this database's sessions parsed or wrote (``ParsedWrites``).
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
        if key is not None and already_applied(key):
            return
        where = self._display
        with self._translated("while reading its schema version"), self._engine.connect() as connection:
            revision = current_revision(connection)
        check_known(revision, where)
        if revision != head_revision():
            lock = (
                file_lock(
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
                upgrade_locked(connection, postgresql=self._postgresql)
        if key is not None:
            mark_applied(key)


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


MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: The newest revision under ``migrations/versions`` (a test keeps the two in step).
HEAD_REVISION = "0015"

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


class _Stored(Protocol):
    """A row naming a write and holding its metadata (``epoch_metadata``, ``sink_cleanup``, or
    ``pending_sink_state`` read with its write's)."""

    @property
    def sink_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def write_id(self) -> str: ...
    @property
    def metadata_json(self) -> str | None: ...
    @property
    def metadata_zlib(self) -> bytes | None: ...
    @property
    def metadata_bytes(self) -> int | None: ...


#: Refuse to inflate more than this: real metadata is megabytes, a damaged value could be anything.
_MAX_INFLATED = 1024 * 1024 * 1024
#: Where a session of the store's database finds its ``ParsedWrites`` (``Session.info``).
PARSED = "exactly_once_parsed_writes"


def parsed_writes(session: Session) -> ParsedWrites:
    """The ``ParsedWrites`` of the database the session belongs to (``MetaStoreDatabase.transaction``);
    a session of no store parses afresh."""
    found = session.info.get(PARSED)
    return found if isinstance(found, ParsedWrites) else ParsedWrites()


class ParsedWrites:
    """The writes' metadata one store parsed or wrote, each parsed once for as long as the store lives.

    A write's metadata never changes once written (a new write gets a new write id), so it is named
    by its sink, epoch, write id and size; an epoch of 10,000 files would otherwise be re-validated
    on every read of its row (get, decide, mark), which costs more than the Iceberg commit itself.
    The store's database owns one (``MetaStoreDatabase.parsed``); a new store, as a new process,
    knows none. Safe to share between threads, as the store is.
    """

    #: Writes kept: a commit reads a few epochs at a time, and each may be megabytes of objects.
    CAPACITY = 8

    def __init__(self) -> None:
        self._writes: OrderedDict[tuple[str, int, str, int], PreCommit] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, str, int]) -> PreCommit | None:
        with self._lock:
            found = self._writes.get(key)
            if found is not None:
                self._writes.move_to_end(key)
            return found

    def put(self, key: tuple[str, int, str, int], pre_commit: PreCommit) -> None:
        with self._lock:
            self._writes[key] = pre_commit
            self._writes.move_to_end(key)
            while len(self._writes) > self.CAPACITY:
                self._writes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._writes.clear()

    def stored(self, row: _Stored, head: Callable[[], PreCommit] | None = None) -> PreCommit:
        """The metadata of the write a row names, in whichever form the row holds it."""
        return self.pre_commit(
            row.sink_id,
            int(row.epoch),
            row.write_id,
            row.metadata_json,
            packed=row.metadata_zlib,
            size=row.metadata_bytes,
            head=head,
        )

    def pre_commit(
        self,
        sink_id: str,
        epoch: int,
        write_id: str,
        text: str | None,
        *,
        packed: bytes | None,
        size: int | None,
        head: Callable[[], PreCommit] | None = None,
    ) -> PreCommit:
        """The write's metadata from its text, or from its deflated form (``packed``, whose JSON is
        ``size`` bytes), parsed unless known; or, where the row was read with its write's head and
        not its metadata, from ``head`` (``rows.from_head``), under the same name.

        The deflated form is only ever written by this package, after the write passed every check, so
        it is parsed as trusted (``PreCommit.parse``); zlib's checksum refuses a damaged one, and a form
        that inflates to another write's metadata is refused too."""
        if head is not None and size is not None:
            known = self.get((sink_id, epoch, write_id, int(size)))
            if known is None:
                known = head()
                self.put((sink_id, epoch, write_id, int(size)), known)
            return known
        if text is None and packed is None:
            raise InvalidPreCommit(
                f"sink {sink_id!r} epoch {epoch}: the meta store holds no metadata of write {write_id}"
            )
        if size is None and text is not None:
            size = size_of(text)
        if size is not None:
            known = self.get((sink_id, epoch, write_id, int(size)))
            if known is not None:
                return known
        if packed is not None:
            raw = _inflated(packed, sink_id, epoch, write_id)
            try:
                pre_commit = PreCommit.parse(raw, recorded=True, trusted=True)
            except InvalidPreCommit as exc:
                raise _unreadable(sink_id, epoch, write_id, str(exc)) from None
            if (pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id) != (sink_id, epoch, write_id):
                raise _unreadable(sink_id, epoch, write_id, f"it describes {pre_commit.describe()}")
            size = len(raw)
        else:
            assert text is not None
            pre_commit = PreCommit.from_json(text, recorded=True)
        self.put((sink_id, epoch, write_id, int(size or 0)), pre_commit)
        return pre_commit


def size_of(text: str) -> int:
    """The text's size in UTF-8 bytes (``epoch_metadata.metadata_bytes``); O(1) for ASCII, which
    metadata JSON nearly always is."""
    return len(text) if text.isascii() else len(text.encode())


def _inflated(packed: bytes, sink_id: str, epoch: int, write_id: str) -> bytes:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(bytes(packed), _MAX_INFLATED)
        complete = inflater.eof and not inflater.unconsumed_tail
    except zlib.error as exc:
        raise _unreadable(sink_id, epoch, write_id, f"its deflated form does not inflate ({exc})") from None
    if not complete:
        raise _unreadable(
            sink_id, epoch, write_id, f"its deflated form is cut short or inflates past {_MAX_INFLATED} bytes"
        )
    return raw


def _unreadable(sink_id: str, epoch: int, write_id: str, why: str) -> InvalidPreCommit:
    """What a row's metadata that this package did not write, or that was damaged since, raises."""
    return InvalidPreCommit(
        f"sink {sink_id!r} epoch {epoch}: the meta store's metadata of write {write_id} (table epoch_metadata) "
        f"cannot be read: {why}; nothing about the epoch can be decided from it: restore that row from a backup "
        "of the meta store (the write's files stay in its location until the epoch is aborted)"
    )
