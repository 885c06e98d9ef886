"""The meta store on SQLAlchemy: SQLite as the embedded default, PostgreSQL in production.

Modelled on pyiceberg's SQL catalog: every status change is a compare-and-swap ``UPDATE`` whose
``WHERE`` names the status and write it expects, followed by a row-count check (invariant 5), so a
zombie attempt's late transition fails loudly instead of overwriting a newer decision. Each public
method is one transaction, and storage errors are translated into the domain's errors here, so the
coordinator can tell "retry" (``MetaStoreUnavailable``) from "stop" (``StateConflict``).
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Engine,
    Update,
    create_engine,
    event,
    func,
    insert,
    select,
    union,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import (
    EpochNotFound,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    StateConflict,
)
from airflow_provider_exactly_once.core.identifiers import EPOCH_MAX, check_epoch, check_sink_id, check_write_id
from airflow_provider_exactly_once.core.ports import CleanupTask, CommittedTables, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.core.status import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.store import migrate
from airflow_provider_exactly_once.store.models import (
    CHECKPOINT_NAME_LENGTH,
    DAG_ID_LENGTH,
    LOCK_HOLDER_LENGTH,
    RUN_ID_LENGTH,
    CheckpointState,
    EpochAllocation,
    PendingSinkState,
    SinkCleanup,
    SinkLock,
    SinkRegistry,
    db_now,
)

_WRITE = "exactly_once_write"
_ALLOCATION_ATTEMPTS = 50
_CHECKPOINT_ATTEMPTS = 5
_FINAL_CHECKPOINTS = (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)
#: The epoch an orphaned write is queued under: nothing on storage says which epoch an abandoned,
#: never-persisted write was for. ``write_discarded`` matches it for every epoch, so a very late
#: persist of a write removed as an orphan fails instead of pointing at deleted files.
ORPHAN_EPOCH = EPOCH_MAX
#: Write ids asked about per query by ``known_writes`` (bind-parameter limits of the databases).
_KNOWN_WRITES_CHUNK = 500


class EpochRowMissing(StateConflict, EpochNotFound):
    """A compare-and-swap found no row at all: both a conflict and "never persisted"."""


class SqlSinkStateStore:
    """``core.ports.SinkStateStore`` on a SQL database, plus checkpoints and run-keyed epochs.

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
                    cursor.execute("PRAGMA journal_mode = WAL")
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(connection: Any) -> None:
            write = connection.get_execution_options().get(_WRITE, False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def _postgresql_engine(self, connect_timeout_s: float, busy_timeout_s: float, echo: bool) -> Engine:
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
        return f"SqlSinkStateStore({self._display!r})"

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
    def _transaction(self, action: str, *, write: bool) -> Iterator[Session]:
        with (
            self._translated(action),
            Session(self._write_engine if write else self._engine, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextmanager
    def reading(self, action: str) -> Iterator[Session]:
        """A read-only transaction with this store's error translation, for queries kept outside
        this class (``store/queries.py``: what the operations views list)."""
        with self._transaction(action, write=False) as session:
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

    # -- reads -----------------------------------------------------------------------------------

    def now(self) -> datetime:
        with self._transaction("reading its clock", write=False) as session:
            return _scalar_datetime(session)

    def get(self, sink_id: str, epoch: int) -> EpochRecord | None:
        check_sink_id(sink_id)
        check_epoch(epoch)
        with self._transaction(f"reading sink {sink_id!r} epoch {epoch}", write=False) as session:
            row = _load(session, sink_id, epoch)
            return None if row is None else _record(row)

    def epochs_with_status(self, sink_id: str, status: EpochStatus) -> Sequence[EpochRecord]:
        check_sink_id(sink_id)
        status = _epoch_status(status)
        with self._transaction(f"listing {status} epochs of sink {sink_id!r}", write=False) as session:
            rows = session.scalars(
                select(PendingSinkState)
                .where(PendingSinkState.sink_id == sink_id, PendingSinkState.status == status.value)
                .order_by(PendingSinkState.epoch)
            )
            return [_record(row) for row in rows]

    def sink_ids(self) -> Sequence[str]:
        with self._transaction("listing sinks", write=False) as session:
            query = union(select(PendingSinkState.sink_id), select(SinkCleanup.sink_id))
            return sorted(str(s) for s in session.scalars(select(query.subquery().c.sink_id)))

    def cleanups(self, sink_id: str, epoch: int | None = None) -> Sequence[CleanupTask]:
        check_sink_id(sink_id)
        conditions: list[ColumnElement[bool]] = [
            SinkCleanup.sink_id == sink_id,
            SinkCleanup.done_at.is_(None),
        ]
        if epoch is not None:
            conditions.append(SinkCleanup.epoch == check_epoch(epoch))
        with self._transaction(f"listing clean-ups of sink {sink_id!r}", write=False) as session:
            rows = session.scalars(select(SinkCleanup).where(*conditions).order_by(SinkCleanup.id))
            return [_cleanup(row) for row in rows]

    # -- transitions -----------------------------------------------------------------------------

    def insert_pending(
        self, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None = None
    ) -> EpochRecord:
        pre_commit = PreCommit.parse(pre_commit)
        _check_run(run_id, try_number)
        dag_id = _dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"persisting {pre_commit.describe()}"
        existing: EpochRecord | PendingSinkState | None
        try:
            with self._transaction(action, write=True) as session:
                existing = _load(session, sink_id, epoch)
                if existing is None:
                    now = db_now()
                    session.execute(
                        insert(PendingSinkState).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            status=EpochStatus.PENDING.value,
                            write_id=pre_commit.write_id,
                            metadata_json=_remembered_json(pre_commit),
                            run_id=run_id,
                            try_number=try_number,
                            dag_id=dag_id,
                            created_at=now,
                            updated_at=now,
                        )
                    )
                    row = _load(session, sink_id, epoch)
                    assert row is not None
                    return _record(row)
        except IntegrityError:
            # A concurrent attempt inserted between our read and our insert; report what it wrote.
            existing = self._reload(sink_id, epoch, action)
            if existing is None:  # pragma: no cover - an insert lost to a row that vanished again
                raise
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot persist write {pre_commit.write_id} "
            "as a new Pending row, "
            f"the row already exists: {_holds(existing)}"
        )

    def insert_aborted(self, pre_commit: PreCommit, *, reason: str, dag_id: str | None = None) -> EpochRecord:
        """``(none) -> Aborted``: a tombstone for a write aborted before it was ever persisted.

        Row and clean-up are written in one transaction; the primary key settles a race with a
        concurrent persist of the same epoch (the loser gets ``StateConflict``).
        """
        pre_commit = PreCommit.parse(pre_commit)
        reason = _text(reason, "abort reason")
        dag_id = _dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"recording the abort of unpersisted {pre_commit.describe()}"
        try:
            with self._transaction(action, write=True) as session:
                if _load(session, sink_id, epoch) is None:
                    now, metadata_json = db_now(), _remembered_json(pre_commit)
                    session.execute(
                        insert(PendingSinkState).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            status=EpochStatus.ABORTED.value,
                            write_id=pre_commit.write_id,
                            metadata_json=metadata_json,
                            dag_id=dag_id,
                            created_at=now,
                            updated_at=now,
                            error=reason,
                        )
                    )
                    session.execute(
                        insert(SinkCleanup).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            write_id=pre_commit.write_id,
                            metadata_json=metadata_json,
                            reason=reason,
                            created_at=now,
                        )
                    )
                    return self._reloaded(session, sink_id, epoch)
        except IntegrityError:
            pass  # a concurrent persist inserted first
        existing = self._reload(sink_id, epoch, action)
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot record write {pre_commit.write_id} as aborted, "
            f"the row already exists: {_holds(existing)}"
        )

    def write_discarded(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether the write was ever queued for clean-up; done clean-ups count (they are the record)."""
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        with self._transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
            found = session.scalar(
                select(SinkCleanup.id)
                .where(
                    SinkCleanup.sink_id == sink_id,
                    SinkCleanup.epoch.in_(sorted({epoch, ORPHAN_EPOCH})),
                    SinkCleanup.write_id == write_id,
                )
                .limit(1)
            )
        return found is not None

    def replace_write(
        self,
        pre_commit: PreCommit,
        *,
        expected_status: EpochStatus,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
    ) -> EpochRecord:
        pre_commit = PreCommit.parse(pre_commit)
        expected_status = _epoch_status(expected_status)
        expected_write_id = check_write_id(expected_write_id)
        _check_run(run_id, try_number)
        dag_id = _dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"replace write {expected_write_id} ({expected_status}) by write {pre_commit.write_id}"
        if expected_status is EpochStatus.COMMITTED:
            raise StateConflict(
                f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: a Committed epoch is final, "
                "only a Pending or Aborted one can take a new write"
            )
        if pre_commit.write_id == expected_write_id:
            # Its files are (or, for an aborted write, are queued to be) cleaned up as the old write's.
            raise StateConflict(
                f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: a replacing write needs a new write id"
            )
        pending = expected_status is EpochStatus.PENDING
        with self._transaction(f"replacing the write of sink {sink_id!r} epoch {epoch}", write=True) as session:
            old = _load(session, sink_id, epoch, for_update=True)
            now = db_now()
            values: dict[str, Any] = {
                "status": EpochStatus.PENDING.value,
                "write_id": pre_commit.write_id,
                "metadata_json": _remembered_json(pre_commit),
                "run_id": run_id,
                "try_number": try_number,
                "dag_id": dag_id,
                "updated_at": now,
                "error": None,
            }
            if not pending:
                values.update(commit_decided_at=None, committed=None)
            self._cas(
                session,
                _cas_update(sink_id, epoch, expected_status, expected_write_id, undecided=pending).values(**values),
                sink_id,
                epoch,
                f"{wanted}{' while no commit is decided' if pending else ''}",
            )
            if pending:
                assert old is not None  # the CAS matched it
                session.execute(
                    insert(SinkCleanup).values(
                        sink_id=sink_id,
                        epoch=epoch,
                        write_id=old.write_id,
                        metadata_json=old.metadata_json,
                        reason=f"replaced by write {pre_commit.write_id}",
                        created_at=now,
                    )
                )
            return self._reloaded(session, sink_id, epoch)

    def reopen_committed(
        self,
        pre_commit: PreCommit,
        *,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
        reason: str,
    ) -> EpochRecord:
        """``Committed -> Pending`` with a new write, for an epoch whose tables were re-created.

        The earlier commit went into a table that no longer exists under its name, so it proves
        nothing for the new one; the earlier write is not queued for clean-up (its files belong to
        the dropped table's history, which nothing here can check). ``created_at`` starts afresh:
        the new table's snapshots are all younger than the earlier commit.
        """
        pre_commit = PreCommit.parse(pre_commit)
        expected_write_id = check_write_id(expected_write_id)
        _check_run(run_id, try_number)
        dag_id = _dag_id(dag_id)
        reason = _text(reason, "re-open reason")
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"re-open Committed write {expected_write_id} with write {pre_commit.write_id}"
        if pre_commit.write_id == expected_write_id:
            raise StateConflict(f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: it needs a new write id")
        with self._transaction(f"re-opening sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            self._cas(
                session,
                _cas_update(sink_id, epoch, EpochStatus.COMMITTED, expected_write_id).values(
                    status=EpochStatus.PENDING.value,
                    write_id=pre_commit.write_id,
                    metadata_json=_remembered_json(pre_commit),
                    run_id=run_id,
                    try_number=try_number,
                    dag_id=dag_id,
                    created_at=now,
                    updated_at=now,
                    commit_decided_at=None,
                    committed=None,
                    table_uuids=None,
                    error=None,
                    warning=reason,
                ),
                sink_id,
                epoch,
                wanted,
            )
            return self._reloaded(session, sink_id, epoch)

    def record_warning(self, sink_id: str, epoch: int, *, warning: str) -> None:
        """Keep a warning on the row whatever its status; it decides nothing, operators read it."""
        sink_id, epoch = check_sink_id(sink_id), check_epoch(epoch)
        warning = _text(warning, "warning")
        with self._transaction(f"recording a warning on sink {sink_id!r} epoch {epoch}", write=True) as session:
            session.execute(
                update(PendingSinkState)
                .where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
                .values(warning=warning, updated_at=db_now())
                .execution_options(synchronize_session=False)
            )

    def decide_commit(self, sink_id: str, epoch: int, *, write_id: str) -> EpochRecord:
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        with self._transaction(f"deciding the commit of sink {sink_id!r} epoch {epoch}", write=True) as session:
            statement = _cas_update(sink_id, epoch, EpochStatus.PENDING, write_id, undecided=True).values(
                commit_decided_at=db_now(), updated_at=db_now()
            )
            if _rowcount(session, statement) != 1:
                row = _load(session, sink_id, epoch)
                already = (
                    row is not None
                    and row.status == EpochStatus.PENDING.value
                    and row.write_id == write_id
                    and row.commit_decided_at is not None
                )
                if not already:
                    raise _conflict(row, sink_id, epoch, f"decide to commit Pending write {write_id}")
            return self._reloaded(session, sink_id, epoch)

    def mark_committed(
        self,
        sink_id: str,
        epoch: int,
        *,
        write_id: str,
        committed: CommittedTables,
        identities: Mapping[str, str] | None = None,
    ) -> EpochRecord:
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        committed_json = _committed_json(committed, sink_id, epoch)
        identities_json = _identities_json(identities or {}, sink_id, epoch)
        with self._transaction(f"marking sink {sink_id!r} epoch {epoch} committed", write=True) as session:
            self._cas(
                session,
                _cas_update(sink_id, epoch, EpochStatus.PENDING, write_id).values(
                    status=EpochStatus.COMMITTED.value,
                    committed=committed_json,
                    table_uuids=identities_json,
                    error=None,
                    updated_at=db_now(),
                ),
                sink_id,
                epoch,
                f"mark Pending write {write_id} Committed",
            )
            record = self._reloaded(session, sink_id, epoch)
            tables = {t.table for t in record.pre_commit.tables}
            if set(committed) != tables:
                # Raising here rolls the CAS back: an epoch is Committed only when every table is.
                raise InvalidPreCommit(
                    f"sink {sink_id!r} epoch {epoch}: committed tables {sorted(committed)} are not the "
                    f"write's tables {sorted(tables)}"
                )
            return record

    def mark_aborted(
        self, sink_id: str, epoch: int, *, write_id: str, reason: str, decided: bool = False
    ) -> EpochRecord:
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        reason = _text(reason, "abort reason")
        with self._transaction(f"aborting sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            self._cas(
                session,
                _cas_update(
                    sink_id, epoch, EpochStatus.PENDING, write_id, undecided=not decided, decided=decided
                ).values(status=EpochStatus.ABORTED.value, error=reason, updated_at=now),
                sink_id,
                epoch,
                f"abort Pending write {write_id} "
                + ("whose commit is decided" if decided else "while no commit is decided"),
            )
            row = _load(session, sink_id, epoch)
            assert row is not None
            session.execute(
                insert(SinkCleanup).values(
                    sink_id=sink_id,
                    epoch=epoch,
                    write_id=write_id,
                    metadata_json=row.metadata_json,
                    reason=reason,
                    created_at=now,
                )
            )
            return _record(row)

    def record_error(self, sink_id: str, epoch: int, *, write_id: str, error: str) -> None:
        """Only on a row of this write that is not Committed: committing clears the error for good."""
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        error = _text(error, "error")
        with self._transaction(f"recording an error on sink {sink_id!r} epoch {epoch}", write=True) as session:
            session.execute(
                update(PendingSinkState)
                .where(
                    PendingSinkState.sink_id == sink_id,
                    PendingSinkState.epoch == epoch,
                    PendingSinkState.write_id == write_id,
                    PendingSinkState.status != EpochStatus.COMMITTED.value,
                )
                .values(error=error, updated_at=db_now())
                .execution_options(synchronize_session=False)
            )

    # -- clean-up queue --------------------------------------------------------------------------

    def enqueue_cleanup(self, pre_commit: PreCommit, *, reason: str) -> CleanupTask:
        pre_commit = PreCommit.parse(pre_commit)
        reason = _text(reason, "clean-up reason")
        with self._transaction(f"queuing the clean-up of {pre_commit.describe()}", write=True) as session:
            cleanup_id = session.execute(
                insert(SinkCleanup)
                .values(
                    sink_id=pre_commit.sink_id,
                    epoch=pre_commit.epoch,
                    write_id=pre_commit.write_id,
                    metadata_json=_remembered_json(pre_commit),
                    reason=reason,
                    created_at=db_now(),
                )
                .returning(SinkCleanup.id)
            ).scalar_one()
            row = session.get_one(SinkCleanup, cleanup_id)
            return _cleanup(row)

    def complete_cleanup(self, cleanup_id: int) -> None:
        """Idempotent: completing a done clean-up again is a no-op; an unknown id is refused."""
        if isinstance(cleanup_id, bool) or not isinstance(cleanup_id, int):
            raise InvalidPreCommit(f"cleanup_id must be an integer, got {type(cleanup_id).__name__}")
        with self._transaction(f"completing clean-up {cleanup_id}", write=True) as session:
            statement = (
                update(SinkCleanup)
                .where(SinkCleanup.id == cleanup_id, SinkCleanup.done_at.is_(None))
                .values(done_at=db_now())
                .execution_options(synchronize_session=False)
            )
            if _rowcount(session, statement) != 1 and session.get(SinkCleanup, cleanup_id) is None:
                raise StateConflict(f"meta store {self._display}: there is no clean-up {cleanup_id}")

    # -- the recovery DAG: sink registry, orphans, per-sink lock ----------------------------------

    def register_sink(
        self, sink_id: str, sink_config: Mapping[str, Any], checkpoint_config: Mapping[str, Any] | None
    ) -> None:
        """Record (or update) how to rebuild a sink's coordinator; idempotent.

        Written by the epoch operators, so the registry follows the DAG's current configuration;
        an unchanged registration writes nothing (no lock, no ``updated_at`` churn). A
        ``checkpoint_config`` of ``None`` means "not known to this caller" (persist is not given the
        checkpoint) and keeps a registered one: clearing it would make recovery consult the wrong
        checkpoint source.
        """
        sink_id = check_sink_id(sink_id)
        sink_json = _config_json(sink_config, f"sink {sink_id!r} configuration")
        if sink_config.get("sink_id", sink_id) != sink_id:
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: the configuration to register names sink {sink_config.get('sink_id')!r}"
            )
        checkpoint_json = (
            None
            if checkpoint_config is None
            else _config_json(checkpoint_config, f"sink {sink_id!r} checkpoint configuration")
        )
        action = f"registering sink {sink_id!r}"
        with self._transaction(action, write=False) as session:
            current = session.get(SinkRegistry, sink_id)
            if (
                current is not None
                and current.sink_config == sink_json
                and checkpoint_json in (None, current.checkpoint_config)
            ):
                return
        for attempt in range(2):
            try:
                with self._transaction(action, write=True) as session:
                    statement = (
                        update(SinkRegistry)
                        .where(SinkRegistry.sink_id == sink_id)
                        .values(
                            sink_config=sink_json,
                            updated_at=db_now(),
                            **({} if checkpoint_json is None else {"checkpoint_config": checkpoint_json}),
                        )
                        .execution_options(synchronize_session=False)
                    )
                    if _rowcount(session, statement) == 0:
                        now = db_now()
                        session.execute(
                            insert(SinkRegistry).values(
                                sink_id=sink_id,
                                sink_config=sink_json,
                                checkpoint_config=checkpoint_json,
                                registered_at=now,
                                updated_at=now,
                            )
                        )
                    return
            except IntegrityError:
                if attempt == 1:  # pragma: no cover - a second insert race on the same sink
                    raise  # a concurrent registration inserted first: the update path now applies

    def registered_sinks(self) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """Every registered sink as ``(sink_id, sink_config, checkpoint_config)``, by sink id."""
        with self._transaction("listing registered sinks", write=False) as session:
            rows = session.scalars(select(SinkRegistry).order_by(SinkRegistry.sink_id)).all()
            return [
                (
                    row.sink_id,
                    json.loads(row.sink_config),
                    None if row.checkpoint_config is None else json.loads(row.checkpoint_config),
                )
                for row in rows
            ]

    def registered_sink(self, sink_id: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """One sink's registered ``(sink_config, checkpoint_config)``, or ``None`` if never registered."""
        sink_id = check_sink_id(sink_id)
        with self._transaction(f"reading the registration of sink {sink_id!r}", write=False) as session:
            row = session.get(SinkRegistry, sink_id)
            if row is None:
                return None
            return json.loads(row.sink_config), (
                None if row.checkpoint_config is None else json.loads(row.checkpoint_config)
            )

    def known_writes(self, sink_id: str, write_ids: Sequence[str]) -> set[str]:
        """The given write ids the store still answers for: the row's write of a Pending or Committed
        epoch, or a write queued for a clean-up not yet done. Any other write found on storage is
        an orphan candidate (served by the ``(sink_id, write_id)`` indexes)."""
        sink_id = check_sink_id(sink_id)
        ids = sorted({check_write_id(w) for w in write_ids})
        known: set[str] = set()
        with self._transaction(f"looking up {len(ids)} write(s) of sink {sink_id!r}", write=False) as session:
            for start in range(0, len(ids), _KNOWN_WRITES_CHUNK):
                chunk = ids[start : start + _KNOWN_WRITES_CHUNK]
                known.update(
                    session.scalars(
                        select(PendingSinkState.write_id).where(
                            PendingSinkState.sink_id == sink_id,
                            PendingSinkState.write_id.in_(chunk),
                            PendingSinkState.status.in_([EpochStatus.PENDING.value, EpochStatus.COMMITTED.value]),
                        )
                    )
                )
                known.update(
                    session.scalars(
                        select(SinkCleanup.write_id).where(
                            SinkCleanup.sink_id == sink_id,
                            SinkCleanup.write_id.in_(chunk),
                            SinkCleanup.done_at.is_(None),
                        )
                    )
                )
        return known

    def enqueue_orphan_cleanup(self, pre_commit: PreCommit, *, reason: str, written_since: datetime) -> CleanupTask:
        """Queue an orphaned write (epoch ``ORPHAN_EPOCH``) for the coordinator's clean-up path.

        Its ``created_at`` is ``written_since`` (the oldest of its files) when that is earlier than
        now: the coordinator hands ``created_at`` to the committer as the earliest moment the write
        could have become visible, and the Iceberg committer looks for references from there on.
        Refused when the write is not an orphan by the store's own records, in the same transaction.
        """
        pre_commit = PreCommit.parse(pre_commit)
        if pre_commit.epoch != ORPHAN_EPOCH:
            raise InvalidPreCommit(f"{pre_commit.describe()}: an orphan is queued under epoch {ORPHAN_EPOCH}")
        if written_since.tzinfo is None:
            raise InvalidPreCommit(f"written_since {written_since.isoformat()} must be timezone-aware")
        reason = _text(reason, "clean-up reason")
        sink_id, write_id = pre_commit.sink_id, pre_commit.write_id
        with self._transaction(f"queuing orphaned write {write_id} of sink {sink_id!r}", write=True) as session:
            owner = session.scalar(
                select(PendingSinkState.epoch)
                .where(
                    PendingSinkState.sink_id == sink_id,
                    PendingSinkState.write_id == write_id,
                    PendingSinkState.status != EpochStatus.ABORTED.value,
                )
                .limit(1)
            )
            if owner is not None:
                raise StateConflict(f"sink {sink_id!r}: write {write_id} is the write of epoch {owner}, not an orphan")
            created_at = min(_scalar_datetime(session), written_since)
            cleanup_id = session.execute(
                insert(SinkCleanup)
                .values(
                    sink_id=sink_id,
                    epoch=ORPHAN_EPOCH,
                    write_id=write_id,
                    metadata_json=_remembered_json(pre_commit),
                    reason=reason,
                    created_at=created_at,
                )
                .returning(SinkCleanup.id)
            ).scalar_one()
            return _cleanup(session.get_one(SinkCleanup, cleanup_id))

    def acquire_sink_lock(self, sink_id: str, holder: str, *, ttl: timedelta) -> tuple[bool, str, datetime]:
        """Take the sink's lock for ``ttl`` unless another holder has it unexpired (a CAS).

        Returns ``(acquired, holder, expires_at)``: on refusal, who holds it and until when. The
        same holder taking it again extends it. An expired lock is taken over, so a recovery task
        killed while holding it delays the next one by at most ``ttl``.
        """
        sink_id = check_sink_id(sink_id)
        holder = _lock_holder(holder)
        if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
            raise InvalidSinkConfig(f"lock ttl must be a positive timedelta, got {ttl!r}")
        action = f"locking sink {sink_id!r} for {holder!r}"
        for _ in range(2):
            try:
                with self._transaction(action, write=True) as session:
                    now = _scalar_datetime(session)
                    expires = now + ttl
                    statement = (
                        update(SinkLock)
                        .where(
                            SinkLock.sink_id == sink_id,
                            (SinkLock.expires_at <= now) | (SinkLock.holder == holder),
                        )
                        .values(holder=holder, acquired_at=now, expires_at=expires)
                        .execution_options(synchronize_session=False)
                    )
                    if _rowcount(session, statement) == 1:
                        return True, holder, expires
                    current = session.scalars(
                        select(SinkLock).where(SinkLock.sink_id == sink_id).execution_options(populate_existing=True)
                    ).one_or_none()
                    if current is not None:
                        return False, current.holder, current.expires_at
                    session.execute(
                        insert(SinkLock).values(sink_id=sink_id, holder=holder, acquired_at=now, expires_at=expires)
                    )
                    return True, holder, expires
            except IntegrityError:
                continue  # a concurrent taker inserted the row first: look again at who holds it
        raise MetaStoreUnavailable(f"meta store {self._display}: {action} kept racing; try again")

    def release_sink_lock(self, sink_id: str, holder: str) -> bool:
        """Give the lock back if ``holder`` still has it; ``False`` when it was taken over meanwhile."""
        sink_id, holder = check_sink_id(sink_id), _lock_holder(holder)
        with self._transaction(f"unlocking sink {sink_id!r} for {holder!r}", write=True) as session:
            statement = (
                update(SinkLock)
                .where(SinkLock.sink_id == sink_id, SinkLock.holder == holder)
                # bound, not db_now(): SQLite compares these as text, so all lock times share one form
                .values(expires_at=_scalar_datetime(session))
                .execution_options(synchronize_session=False)
            )
            return _rowcount(session, statement) == 1

    # -- checkpoints -----------------------------------------------------------------------------

    def set_checkpoint(self, name: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None:
        """Record the upstream's word; COMPLETED and FAILED are final (see ``CheckpointStatus``)."""
        name, epoch = _checkpoint_name(name), check_epoch(epoch)
        status = _checkpoint_status(status)
        if detail is not None:
            detail = _text(detail, "checkpoint detail")
        action = f"setting checkpoint {name!r} epoch {epoch} to {status}"
        for attempt in range(_CHECKPOINT_ATTEMPTS):
            try:
                with self._transaction(action, write=True) as session:
                    statement = (
                        update(CheckpointState)
                        .where(
                            CheckpointState.name == name,
                            CheckpointState.epoch == epoch,
                            CheckpointState.status == CheckpointStatus.PENDING.value,
                        )
                        .values(status=status.value, detail=detail, updated_at=db_now())
                        .execution_options(synchronize_session=False)
                    )
                    if _rowcount(session, statement) == 1:
                        return
                    current = session.scalar(
                        select(CheckpointState.status).where(
                            CheckpointState.name == name, CheckpointState.epoch == epoch
                        )
                    )
                    if current is None:
                        session.execute(
                            insert(CheckpointState).values(
                                name=name,
                                epoch=epoch,
                                status=status.value,
                                detail=detail,
                                updated_at=db_now(),
                            )
                        )
                        return
                    if current == status.value:
                        return  # the same final word again
                    raise StateConflict(
                        f"checkpoint {name!r} epoch {epoch} is {current}, which is final: cannot set it to {status}"
                    )
            except IntegrityError:
                # Another writer inserted the row first: look again at what it says.
                if attempt == _CHECKPOINT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus:
        name, epoch = _checkpoint_name(name), check_epoch(epoch)
        with self._transaction(f"reading checkpoint {name!r} epoch {epoch}", write=False) as session:
            status = session.scalar(
                select(CheckpointState.status).where(CheckpointState.name == name, CheckpointState.epoch == epoch)
            )
        return CheckpointStatus.PENDING if status is None else CheckpointStatus(status)

    # -- run-keyed epochs ------------------------------------------------------------------------

    def allocate_epoch(self, sink_id: str, run_id: str) -> int:
        """The epoch of a DAG run without a data interval: the same for that run forever.

        New epochs follow the database clock in milliseconds (like interval-derived ones), and stay
        strictly increasing per sink even when the clock does not.
        """
        sink_id = check_sink_id(sink_id)
        run_id = _run_id(run_id)
        action = f"allocating an epoch for sink {sink_id!r} run {run_id!r}"
        for attempt in range(_ALLOCATION_ATTEMPTS):
            try:
                with self._transaction(action, write=True) as session:
                    existing = session.scalar(
                        select(EpochAllocation.epoch).where(
                            EpochAllocation.sink_id == sink_id, EpochAllocation.run_id == run_id
                        )
                    )
                    if existing is not None:
                        return int(existing)
                    now_ms = epoch_from_interval_start(_scalar_datetime(session))
                    last = session.scalar(
                        select(func.max(EpochAllocation.epoch)).where(EpochAllocation.sink_id == sink_id)
                    )
                    epoch = check_epoch(now_ms if last is None else max(now_ms, int(last) + 1))
                    session.execute(insert(EpochAllocation).values(sink_id=sink_id, run_id=run_id, epoch=epoch))
                    return epoch
            except IntegrityError:
                # A concurrent caller took this epoch (or allocated for this run): draw again.
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise MetaStoreUnavailable(
            f"meta store {self._display}: {action} lost the race {_ALLOCATION_ATTEMPTS} times; try again"
        )

    # -- helpers ---------------------------------------------------------------------------------

    def _cas(self, session: Session, statement: Update, sink_id: str, epoch: int, wanted: str) -> None:
        if _rowcount(session, statement) != 1:
            raise _conflict(_load(session, sink_id, epoch), sink_id, epoch, wanted)

    def _reloaded(self, session: Session, sink_id: str, epoch: int) -> EpochRecord:
        row = _load(session, sink_id, epoch)
        assert row is not None
        return _record(row)

    def _reload(self, sink_id: str, epoch: int, action: str) -> EpochRecord | None:
        with self._transaction(action, write=False) as session:
            row = _load(session, sink_id, epoch)
            return None if row is None else _record(row)


# -- module helpers ------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else '(no message)'}"


def _load(session: Session, sink_id: str, epoch: int, *, for_update: bool = False) -> PendingSinkState | None:
    statement = (
        select(PendingSinkState)
        .where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
        .execution_options(populate_existing=True)
    )
    if for_update:
        statement = statement.with_for_update()
    return session.scalars(statement).one_or_none()


def _cas_update(
    sink_id: str, epoch: int, status: EpochStatus, write_id: str, *, undecided: bool = False, decided: bool = False
) -> Update:
    conditions: list[ColumnElement[bool]] = [
        PendingSinkState.sink_id == sink_id,
        PendingSinkState.epoch == epoch,
        PendingSinkState.status == status.value,
        PendingSinkState.write_id == write_id,
    ]
    if undecided:
        conditions.append(PendingSinkState.commit_decided_at.is_(None))
    if decided:
        conditions.append(PendingSinkState.commit_decided_at.is_not(None))
    return update(PendingSinkState).where(*conditions).execution_options(synchronize_session=False)


def _rowcount(session: Session, statement: Update) -> int:
    result = cast(CursorResult[Any], session.execute(statement))
    return int(result.rowcount)


def _holds(record: EpochRecord | PendingSinkState | None) -> str:
    if record is None:
        return "there is no row"
    decided = record.commit_decided_at
    return f"the row holds status {record.status} write {record.write_id}" + (
        f", commit decided at {decided.isoformat()}" if decided is not None else ", no commit decided"
    )


def _conflict(row: PendingSinkState | None, sink_id: str, epoch: int, wanted: str) -> StateConflict:
    message = f"sink {sink_id!r} epoch {epoch}: expected to {wanted}, but {_holds(row)}"
    return EpochRowMissing(message) if row is None else StateConflict(message)


def _record(row: PendingSinkState) -> EpochRecord:
    return EpochRecord(
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        status=EpochStatus(row.status),
        write_id=row.write_id,
        pre_commit=_parsed(row.sink_id, int(row.epoch), row.write_id, row.metadata_json),
        run_id=row.run_id,
        try_number=row.try_number,
        created_at=row.created_at,
        updated_at=row.updated_at,
        commit_decided_at=row.commit_decided_at,
        committed=None if row.committed is None else json.loads(row.committed),
        error=row.error,
        dag_id=row.dag_id,
        table_uuids=None if row.table_uuids is None else json.loads(row.table_uuids),
        warning=row.warning,
    )


def _cleanup(row: SinkCleanup) -> CleanupTask:
    return CleanupTask(
        id=int(row.id),
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        write_id=row.write_id,
        pre_commit=_parsed(row.sink_id, int(row.epoch), row.write_id, row.metadata_json),
        reason=row.reason,
        created_at=row.created_at,
    )


def _scalar_datetime(session: Session) -> datetime:
    now: datetime | None = session.scalar(select(db_now()))
    if now is None:  # pragma: no cover - a database without a clock
        raise MetaStoreUnavailable("the meta store returned no current time")
    return now


def _epoch_status(status: object) -> EpochStatus:
    try:
        return EpochStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(f"epoch status {status!r} is not one of {[s.value for s in EpochStatus]}") from None


def _checkpoint_status(status: object) -> CheckpointStatus:
    try:
        return CheckpointStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(
            f"checkpoint status {status!r} is not one of {[s.value for s in CheckpointStatus]}"
        ) from None


def _checkpoint_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > CHECKPOINT_NAME_LENGTH:
        raise InvalidPreCommit(
            f"checkpoint name must be a non-empty string of at most {CHECKPOINT_NAME_LENGTH} characters, got {name!r}"
        )
    return name


def _run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not run_id or len(run_id) > RUN_ID_LENGTH:
        raise InvalidPreCommit(
            f"run_id must be a non-empty string of at most {RUN_ID_LENGTH} characters, got {run_id!r}"
        )
    return run_id


def _dag_id(dag_id: object) -> str | None:
    if dag_id is not None and (not isinstance(dag_id, str) or not dag_id or len(dag_id) > DAG_ID_LENGTH):
        raise InvalidPreCommit(
            f"dag_id must be None or a non-empty string of at most {DAG_ID_LENGTH} characters, got {dag_id!r}"
        )
    return dag_id


def _check_run(run_id: object, try_number: object) -> None:
    if run_id is not None:
        _run_id(run_id)
    if try_number is not None and (isinstance(try_number, bool) or not isinstance(try_number, int) or try_number < 0):
        raise InvalidPreCommit(f"try_number must be a non-negative integer or None, got {try_number!r}")


def _config_json(config: Mapping[str, Any], what: str) -> str:
    if not isinstance(config, Mapping):
        raise InvalidSinkConfig(f"{what} must be a mapping (its to_dict() form), got {type(config).__name__}")
    try:
        return json.dumps(dict(config), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidSinkConfig(f"{what} is not JSON-serialisable: {exc}") from None


def _lock_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder or len(holder) > LOCK_HOLDER_LENGTH:
        raise InvalidSinkConfig(
            f"lock holder must be a non-empty string of at most {LOCK_HOLDER_LENGTH} characters, got {holder!r}"
        )
    return holder


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidPreCommit(f"{what} must be a string, got {type(value).__name__}")
    return value


def _committed_json(committed: Mapping[str, str], sink_id: str, epoch: int) -> str:
    if not isinstance(committed, Mapping) or not committed:
        raise InvalidPreCommit(f"sink {sink_id!r} epoch {epoch}: committed must name every table, got {committed!r}")
    bad = {k: v for k, v in committed.items() if not isinstance(k, str) or not isinstance(v, str) or not v}
    if bad:
        raise InvalidPreCommit(
            f"sink {sink_id!r} epoch {epoch}: committed maps tables to snapshot ids or 'empty' (strings), got {bad!r}"
        )
    return json.dumps(dict(committed), sort_keys=True)


def _identities_json(identities: Mapping[str, str], sink_id: str, epoch: int) -> str | None:
    bad = {k: v for k, v in identities.items() if not isinstance(k, str) or not isinstance(v, str) or not v}
    if bad:
        raise InvalidPreCommit(f"sink {sink_id!r} epoch {epoch}: table identities must be strings, got {bad!r}")
    return json.dumps(dict(identities), sort_keys=True) if identities else None


# -- parsed metadata ------------------------------------------------------------------------------

#: A write's metadata never changes once written (a new write gets a new write id), so one process
#: parses it once: an epoch of 10,000 files would otherwise be re-validated on every row read
#: (get, decide, mark), which costs more than the Iceberg commit itself.
_PARSED_CAPACITY = 8
_parsed_cache: OrderedDict[tuple[str, int, str, int], PreCommit] = OrderedDict()
_parsed_lock = threading.Lock()


def _parsed(sink_id: str, epoch: int, write_id: str, text: str) -> PreCommit:
    key = (sink_id, epoch, write_id, len(text))
    with _parsed_lock:
        cached = _parsed_cache.get(key)
        if cached is not None:
            _parsed_cache.move_to_end(key)
            return cached
    pre_commit = PreCommit.from_json(text)
    _remember(key, pre_commit)
    return pre_commit


def _remembered_json(pre_commit: PreCommit) -> str:
    text = pre_commit.to_json()
    _remember((pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id, len(text)), pre_commit)
    return text


def _remember(key: tuple[str, int, str, int], pre_commit: PreCommit) -> None:
    with _parsed_lock:
        _parsed_cache[key] = pre_commit
        _parsed_cache.move_to_end(key)
        while len(_parsed_cache) > _PARSED_CAPACITY:
            _parsed_cache.popitem(last=False)
