"""The meta store on SQLAlchemy, SQLite as the embedded default and PostgreSQL in production:
``SqlSinkStateStore``, the coordinator's port, with the epochs' transitions as compare-and-swaps on
their rows, recovery's batches (D15) and the clean-up queue (D3).

Each public method is one transaction. What other callers need hangs off the store as companions on
the same database, as pyiceberg hangs ``inspect`` off a ``Table``: ``registry``, ``runs``,
``checkpoints``, ``epochs``, ``input_ranges``, ``revisions`` and ``history``. The contract:
design.md, "The meta store".
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import ColumnElement, Engine, Insert, Select, Table, Update, bindparam, insert, select, union, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.decisions import discarded_error
from airflow_provider_exactly_once.core.epochs import (
    AbortCause,
    AuditVerdict,
    EpochAudit,
    EpochEvent,
    EpochStatus,
    check_epoch,
    check_write_id,
)
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, StateConflict
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH, CleanupTask, CommitMark, CommittedTables, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import history, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.epoch_inputs import SqlCheckpointTable, SqlEpochAllocator, SqlRangeReservations
from airflow_provider_exactly_once.store.history import SqlHistory, SqlRevisions, commit_revision
from airflow_provider_exactly_once.store.models import PendingSinkState, SinkCleanup, db_now
from airflow_provider_exactly_once.store.registry import SqlRunRecords, SqlSinkRegistry

_STATE = cast(Table, PendingSinkState.__table__)


def insert_row(
    session: Session, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None
) -> EpochRecord:
    """Insert the Pending row of ``pre_commit``'s write; the primary key refuses a second row of the
    epoch (``IntegrityError``). The record is the row as a read of it maps it (a test holds the two
    equal)."""
    found = session.execute(
        _row_insert(),
        {
            "i_sink_id": pre_commit.sink_id,
            "i_epoch": pre_commit.epoch,
            "i_write_id": pre_commit.write_id,
            "i_run_id": run_id,
            "i_try_number": try_number,
            "i_dag_id": dag_id,
        },
    ).one()
    # The row as every read maps it (``rows.record``), from its columns: no ORM object is built.
    return rows.record(session, cast(PendingSinkState, SimpleNamespace(**found._mapping)), pre_commit=pre_commit)


@functools.cache
def _row_insert() -> Insert:
    now = db_now()
    return (
        insert(_STATE)
        .values(
            sink_id=bindparam("i_sink_id"),
            epoch=bindparam("i_epoch"),
            status=EpochStatus.PENDING.value,
            write_id=bindparam("i_write_id"),
            run_id=bindparam("i_run_id"),
            try_number=bindparam("i_try_number"),
            dag_id=bindparam("i_dag_id"),
            created_at=now,
            updated_at=now,
        )
        .returning(*_STATE.columns)
    )


class SqlBatchTransitions:
    """The batch transitions of ``SqlSinkStateStore``, which sets ``_db``."""

    _db: MetaStoreDatabase

    def decide_commits(self, sink_id: str, writes: Sequence[tuple[int, str]]) -> Sequence[int]:
        decided: list[int] = []
        action = f"deciding the commits of {len(writes)} epochs of sink {sink_id!r}"
        statement = rows.guarded(EpochStatus.PENDING, undecided=True).values(
            commit_decided_at=db_now(), updated_at=db_now()
        )
        with self._db.transaction(action, write=True) as session:
            for epoch, write_id in writes:
                epoch, write_id = check_epoch(epoch), check_write_id(write_id)
                if rows.rowcount(session, statement, rows.key(sink_id, epoch, write_id)) != 1:
                    row = rows.load(session, sink_id, epoch)
                    if row is None or (row.status, row.write_id) != (EpochStatus.PENDING, write_id):
                        break
                    if row.commit_decided_at is None:
                        break  # as decide_commit, a decision already taken for this write counts
                else:
                    history.record(
                        session, sink_id, epoch, EpochEvent.COMMIT_DECIDED, write_id, status=EpochStatus.PENDING.value
                    )
                decided.append(epoch)
        return decided

    def mark_committed_batch(self, sink_id: str, marks: Sequence[CommitMark]) -> Sequence[int]:
        marked: list[int] = []
        with self._db.transaction(f"marking {len(marks)} epochs of sink {sink_id!r} committed", write=True) as session:
            for mark in marks:
                epoch, write_id = check_epoch(mark.epoch), check_write_id(mark.write_id)
                statement = (
                    rows.guarded(EpochStatus.PENDING, decided=True)
                    .where(PendingSinkState.replaces.is_(None))  # a revision's commit also records the revision
                    .values(
                        status=EpochStatus.COMMITTED.value,
                        committed=rows.committed_json(mark.committed, sink_id, epoch),
                        table_uuids=rows.identities_json(mark.identities, sink_id, epoch),
                        error=None,
                        updated_at=db_now(),
                    )
                )
                if rows.rowcount(session, statement, rows.key(sink_id, epoch, write_id)) == 1:
                    history.record(
                        session, sink_id, epoch, EpochEvent.COMMITTED, write_id, status=EpochStatus.COMMITTED.value
                    )
                    marked.append(epoch)
        return marked


class SqlCleanupQueue:
    """The clean-up queue's part of ``SqlSinkStateStore``, which sets ``_db``."""

    _db: MetaStoreDatabase

    def cleanups(self, sink_id: str, epoch: int | None = None) -> Sequence[CleanupTask]:
        conditions: list[ColumnElement[bool]] = [
            SinkCleanup.sink_id == sink_id,
            SinkCleanup.done_at.is_(None),
        ]
        if epoch is not None:
            conditions.append(SinkCleanup.epoch == check_epoch(epoch))
        with self._db.transaction(f"listing clean-ups of sink {sink_id!r}", write=False) as session:
            found = session.scalars(select(SinkCleanup).where(*conditions).order_by(SinkCleanup.id))
            return [rows.cleanup_task(row) for row in found]

    def write_discarded(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether the write was ever queued for clean-up; done clean-ups count (they are the record)."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
            return discarded(session, sink_id, epoch, write_id)

    def enqueue_cleanup(self, pre_commit: PreCommit, *, reason: str) -> CleanupTask:
        pre_commit = PreCommit.parse(pre_commit)
        reason = rows.text(reason, "clean-up reason")
        with self._db.transaction(f"queuing the clean-up of {pre_commit.describe()}", write=True) as session:
            cleanup_id = session.execute(
                insert(SinkCleanup)
                .values(
                    sink_id=pre_commit.sink_id,
                    epoch=pre_commit.epoch,
                    write_id=pre_commit.write_id,
                    metadata_json=pre_commit.to_json(),
                    reason=reason,
                    created_at=db_now(),
                )
                .returning(SinkCleanup.id)
            ).scalar_one()
            row = session.get_one(SinkCleanup, cleanup_id)
            if pre_commit.epoch != ORPHAN_EPOCH:  # an orphan's clean-up belongs to no epoch
                history.record(
                    session,
                    pre_commit.sink_id,
                    pre_commit.epoch,
                    EpochEvent.CLEANUP_QUEUED,
                    pre_commit.write_id,
                    status=None,
                    reason=reason,
                )
            return rows.cleanup_task(row)

    def complete_cleanup(self, cleanup_id: int) -> None:
        """Idempotent: completing a done clean-up again is a no-op; an unknown id is refused."""
        if isinstance(cleanup_id, bool) or not isinstance(cleanup_id, int):
            raise InvalidPreCommit(f"cleanup_id must be an integer, got {type(cleanup_id).__name__}")
        with self._db.transaction(f"completing clean-up {cleanup_id}", write=True) as session:
            statement = (
                update(SinkCleanup)
                .where(SinkCleanup.id == cleanup_id, SinkCleanup.done_at.is_(None))
                .values(done_at=db_now())
                .execution_options(synchronize_session=False)
            )
            if rows.rowcount(session, statement) == 1:
                done = session.get_one(SinkCleanup, cleanup_id)
                if done.epoch != ORPHAN_EPOCH:
                    history.record(
                        session,
                        done.sink_id,
                        done.epoch,
                        EpochEvent.CLEANED_UP,
                        done.write_id,
                        status=None,
                        reason=done.reason,
                    )
            elif session.get(SinkCleanup, cleanup_id) is None:
                raise StateConflict(f"meta store {self._db.url_for_display}: there is no clean-up {cleanup_id}")


def discarded(session: Session, sink_id: str, epoch: int, write_id: str) -> bool:
    """``write_discarded`` inside the caller's transaction (``insert_pending`` asks it there)."""
    found = session.scalar(_discarded_query(), {"d_sink_id": sink_id, "d_epoch": epoch, "d_write_id": write_id})
    return found is not None


@functools.cache
def _discarded_query() -> Select[int]:
    """``discarded``'s query, built once: persist asks it every time. On the table's columns, not
    the mapped class's: an ORM-enabled select goes through the ORM's compilation and result
    machinery for one integer."""
    table = cast(Table, SinkCleanup.__table__).c
    return (
        select(table.id)
        .where(
            table.sink_id == bindparam("d_sink_id"),
            table.epoch.in_([bindparam("d_epoch"), ORPHAN_EPOCH]),
            table.write_id == bindparam("d_write_id"),
        )
        .limit(1)
    )


class SqlSinkStateStore(SqlCleanupQueue, SqlBatchTransitions):
    """``core.ports.SinkStateStore`` on a SQL database, with its companions ``registry``,
    ``checkpoints``, ``epochs``, ``revisions``, ``runs``, ``history`` and ``input_ranges`` on the
    same connection pool. The clean-up queue (``SqlCleanupQueue``) and recovery's batch transitions
    (``SqlBatchTransitions``) are its own methods, written as the classes above.

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
        self._db = MetaStoreDatabase(url, connect_timeout_s=connect_timeout_s, busy_timeout_s=busy_timeout_s, echo=echo)
        self.registry = SqlSinkRegistry(self._db)
        self.checkpoints = SqlCheckpointTable(self._db)
        self.epochs = SqlEpochAllocator(self._db)
        self.revisions = SqlRevisions(self._db)
        self.runs = SqlRunRecords(self._db)
        self.history = SqlHistory(self._db)
        self.input_ranges = SqlRangeReservations(self._db)

    @property
    def url_for_display(self) -> str:
        return self._db.url_for_display

    @property
    def engine(self) -> Engine:
        return self._db.engine

    def dispose(self) -> None:
        self._db.dispose()

    def forget_parsed(self) -> None:
        """Forget every write's metadata this store parsed or wrote, as a new process would not know it
        (benchmarks of what a commit task in its own process pays)."""
        self._db.parsed.clear()

    def __repr__(self) -> str:
        return f"SqlSinkStateStore({self.url_for_display!r})"

    @contextmanager
    def reading(self, action: str) -> Iterator[Session]:
        """A read-only transaction with this store's error translation, for queries kept outside
        this class (``store/queries.py``: what the operations views list)."""
        with self._db.reading(action) as session:
            yield session

    # -- reads -----------------------------------------------------------------------------------

    def now(self) -> datetime:
        with self._db.transaction("reading its clock", write=False) as session:
            return rows.database_now(session)

    def get(self, sink_id: str, epoch: int) -> EpochRecord | None:
        check_epoch(epoch)
        with self._db.transaction(f"reading sink {sink_id!r} epoch {epoch}", write=False) as session:
            return rows.load(session, sink_id, epoch)

    def epochs_with_status(self, sink_id: str, status: EpochStatus) -> Sequence[EpochRecord]:
        status = rows.epoch_status(status)
        with self._db.transaction(f"listing {status} epochs of sink {sink_id!r}", write=False) as session:
            found = session.scalars(
                select(PendingSinkState)
                .where(PendingSinkState.sink_id == sink_id, PendingSinkState.status == status.value)
                .order_by(PendingSinkState.epoch)
            )
            return [rows.record(session, row) for row in found]

    def sink_ids(self) -> Sequence[str]:
        with self._db.transaction("listing sinks", write=False) as session:
            query = union(select(PendingSinkState.sink_id), select(SinkCleanup.sink_id))
            return sorted(str(s) for s in session.scalars(select(query.subquery().c.sink_id)))

    # -- transitions -----------------------------------------------------------------------------

    def insert_pending(
        self, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None = None
    ) -> EpochRecord:
        pre_commit = PreCommit.parse(pre_commit)
        rows.check_run(run_id, try_number)
        dag_id = rows.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"persisting {pre_commit.describe()}"
        try:
            with self._db.transaction(action, write=True) as session:
                # The primary key refuses a second row, so the row itself is not read first.
                record = insert_row(session, pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id)
                if discarded(session, sink_id, epoch, pre_commit.write_id):
                    raise discarded_error(pre_commit)  # rolls the insert back
                rows.insert_metadata(session, pre_commit)
                return history.recorded(session, record, EpochEvent.PERSISTED, run=(dag_id, run_id, try_number))
        except IntegrityError:
            # The epoch has a row already (a concurrent persist inserted it first): report what it holds.
            existing = self._reload(sink_id, epoch, action)
            if existing is None:  # pragma: no cover - an insert lost to a row that vanished again
                raise
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot persist write {pre_commit.write_id} "
            "as a new Pending row, "
            f"the row already exists: {rows.holds(existing)}"
        )

    def insert_aborted(
        self, pre_commit: PreCommit, *, reason: str, dag_id: str | None = None, cause: AbortCause | None = None
    ) -> EpochRecord:
        """``(none) -> Aborted``: a tombstone for a write aborted before it was ever persisted.

        Row and clean-up are written in one transaction; the primary key settles a race with a
        concurrent persist of the same epoch (the loser gets ``StateConflict``).
        """
        pre_commit = PreCommit.parse(pre_commit)
        reason = rows.text(reason, "abort reason")
        dag_id = rows.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"recording the abort of unpersisted {pre_commit.describe()}"
        try:
            with self._db.transaction(action, write=True) as session:
                if rows.load(session, sink_id, epoch) is None:
                    now = db_now()
                    session.execute(
                        insert(PendingSinkState).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            status=EpochStatus.ABORTED.value,
                            write_id=pre_commit.write_id,
                            dag_id=dag_id,
                            created_at=now,
                            updated_at=now,
                            error=reason,
                            abort_cause=cause,
                        )
                    )
                    rows.insert_metadata(session, pre_commit)
                    rows.queue_cleanup(session, sink_id, epoch, pre_commit.write_id, reason=reason)
                    tombstone = rows.reloaded(session, sink_id, epoch)
                    return history.recorded(session, tombstone, EpochEvent.ABORTED_UNPERSISTED, reason=reason)
        except IntegrityError:
            pass  # a concurrent persist inserted first
        existing = self._reload(sink_id, epoch, action)
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot record write {pre_commit.write_id} as aborted, "
            f"the row already exists: {rows.holds(existing)}"
        )

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
        expected_status = rows.epoch_status(expected_status)
        expected_write_id = check_write_id(expected_write_id)
        rows.check_run(run_id, try_number)
        dag_id = rows.dag_id(dag_id)
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
        with self._db.transaction(f"replacing the write of sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            values: dict[str, Any] = {
                "status": EpochStatus.PENDING.value,
                "write_id": pre_commit.write_id,
                "run_id": run_id,
                "try_number": try_number,
                "dag_id": dag_id,
                "updated_at": now,
                "error": None,
                "abort_cause": None,
            }
            if not pending:
                values.update(commit_decided_at=None, committed=None)
            rows.swap(
                session,
                rows.guarded(expected_status, undecided=pending).values(**values),
                rows.key(sink_id, epoch, expected_write_id),
                f"{wanted}{' while no commit is decided' if pending else ''}",
            )
            if pending:
                rows.queue_cleanup(
                    session, sink_id, epoch, expected_write_id, reason=f"replaced by write {pre_commit.write_id}"
                )
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            replaced = f"replaces {expected_status} write {expected_write_id}"
            if expected_write_id == PreCommit.nothing_written(sink_id, epoch).write_id:
                replaced = "the first write of an epoch aborted before any write"
            run = (dag_id, run_id, try_number)
            record = rows.reloaded(session, sink_id, epoch)
            return history.recorded(session, record, EpochEvent.REPLACED, reason=replaced, run=run)

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
        rows.check_run(run_id, try_number)
        dag_id = rows.dag_id(dag_id)
        reason = rows.text(reason, "re-open reason")
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"re-open Committed write {expected_write_id} with write {pre_commit.write_id}"
        if pre_commit.write_id == expected_write_id:
            raise StateConflict(f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: it needs a new write id")
        with self._db.transaction(f"re-opening sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            rows.swap(
                session,
                rows.guarded(EpochStatus.COMMITTED).values(
                    **rows.new_write_values(pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id, now=now),
                    warning=reason,
                ),
                rows.key(sink_id, epoch, expected_write_id),
                wanted,
            )
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            record = rows.reloaded(session, sink_id, epoch)
            run = (dag_id, run_id, try_number)
            return history.recorded(session, record, EpochEvent.REOPENED, reason=reason, run=run)

    def record_warning(self, sink_id: str, epoch: int, *, warning: str) -> None:
        """Keep a warning on the row whatever its status; it decides nothing, operators read it."""
        epoch = check_epoch(epoch)
        warning = rows.text(warning, "warning")
        with self._db.transaction(f"recording a warning on sink {sink_id!r} epoch {epoch}", write=True) as session:
            changed = update(PendingSinkState).where(
                PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch
            )
            _noted(session, changed.values(warning=warning, updated_at=db_now()), EpochEvent.WARNING, warning)

    def record_audit(self, sink_id: str, epoch: int, audit: EpochAudit) -> EpochRecord:
        """The audit of the Pending write it names, while no commit is decided (design.md D23); its
        event says what changed: committed to the audit branch, or the verdict and failed checks."""
        epoch = check_epoch(epoch)
        with self._db.transaction(f"recording the audit of sink {sink_id!r} epoch {epoch}", write=True) as session:
            return self._audited(session, sink_id, epoch, audit)

    @staticmethod
    def _audited(session: Session, sink_id: str, epoch: int, audit: EpochAudit) -> EpochRecord:
        write_id = check_write_id(audit.write_id)
        if audit.verdict is None:
            event, reason = EpochEvent.AUDIT_COMMITTED, f"on branch {audit.branch}: {dict(audit.snapshots)}"
        elif audit.verdict is AuditVerdict.PASSED:
            event, reason = EpochEvent.AUDIT_PASSED, ", ".join(c.name for c in audit.checks)
        else:
            event, reason = EpochEvent.AUDIT_FAILED, audit.failing()
        rows.swap(
            session,
            rows.guarded(EpochStatus.PENDING, undecided=True).values(
                audit=audit.model_dump_json(), updated_at=db_now()
            ),
            rows.key(sink_id, epoch, write_id),
            f"record the audit of Pending write {write_id} while no commit is decided",
        )
        return history.recorded(session, rows.reloaded(session, sink_id, epoch), event, reason=reason or None)

    def decide_commit(self, sink_id: str, epoch: int, *, write_id: str, audit: EpochAudit | None = None) -> EpochRecord:
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"deciding the commit of sink {sink_id!r} epoch {epoch}", write=True) as session:
            if audit is not None:  # a publish: the passed audit and the decision land together (D23)
                self._audited(session, sink_id, epoch, audit)
            decided = rows.updated(session, _decide_statement(), rows.key(sink_id, epoch, write_id))
            if decided is not None:
                return history.recorded(session, decided, EpochEvent.COMMIT_DECIDED)
            found = rows.load(session, sink_id, epoch)
            already = (
                found is not None
                and found.status is EpochStatus.PENDING
                and found.write_id == write_id
                and found.commit_decided_at is not None
            )
            if found is None or not already:
                raise rows.conflict(found, sink_id, epoch, f"decide to commit Pending write {write_id}")
            return found

    def mark_committed(
        self,
        sink_id: str,
        epoch: int,
        *,
        write_id: str,
        committed: CommittedTables,
        identities: Mapping[str, str] | None = None,
    ) -> EpochRecord:
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        committed_json = rows.committed_json(committed, sink_id, epoch)
        identities_json = rows.identities_json(identities or {}, sink_id, epoch)
        # Not waited for on disk: lost with the database's host, the mark is made again by the next
        # commit attempt (recovery's), which finds this write's marker in the sink (design.md).
        action = f"marking sink {sink_id!r} epoch {epoch} committed"
        with self._db.transaction(action, write=True, durable=False) as session:
            record = rows.swapped(
                session,
                _mark_statement(),
                rows.key(sink_id, epoch, write_id, m_committed=committed_json, m_uuids=identities_json),
                f"mark Pending write {write_id} Committed",
            )
            tables = {t.table for t in record.pre_commit.tables}
            if set(committed) != tables:
                # Raising here rolls the CAS back: an epoch is Committed only when every table is.
                raise InvalidPreCommit(
                    f"sink {sink_id!r} epoch {epoch}: committed tables {sorted(committed)} are not the "
                    f"write's tables {sorted(tables)}"
                )
            if record.kind.revises:
                return commit_revision(session, record, committed)
            return history.recorded(session, record, EpochEvent.COMMITTED)

    def mark_aborted(
        self,
        sink_id: str,
        epoch: int,
        *,
        write_id: str,
        reason: str,
        decided: bool = False,
        cause: AbortCause | None = None,
    ) -> EpochRecord:
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        reason = rows.text(reason, "abort reason")
        with self._db.transaction(f"aborting sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            rows.swap(
                session,
                rows.guarded(EpochStatus.PENDING, undecided=not decided, decided=decided).values(
                    status=EpochStatus.ABORTED.value, error=reason, abort_cause=cause, updated_at=now
                ),
                rows.key(sink_id, epoch, write_id),
                f"abort Pending write {write_id} "
                + ("whose commit is decided" if decided else "while no commit is decided"),
            )
            record = rows.reloaded(session, sink_id, epoch)
            if record.kind.revises:  # rolls the CAS back: a revision's abort restores the replaced write
                raise StateConflict(
                    f"sink {sink_id!r} epoch {epoch}: write {write_id} is a revision; abort it with abort_revision"
                )
            rows.queue_cleanup(session, sink_id, epoch, write_id, reason=reason)
            why = reason if cause is None else f"{cause.value}: {reason}"
            return history.recorded(session, record, EpochEvent.ABORTED, reason=why)

    def record_error(self, sink_id: str, epoch: int, *, write_id: str, error: str) -> None:
        """Only on a row of this write that is not Committed: committing clears the error for good."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        error = rows.text(error, "error")
        with self._db.transaction(f"recording an error on sink {sink_id!r} epoch {epoch}", write=True) as session:
            changed = update(PendingSinkState).where(
                PendingSinkState.sink_id == sink_id,
                PendingSinkState.epoch == epoch,
                PendingSinkState.write_id == write_id,
                PendingSinkState.status != EpochStatus.COMMITTED.value,
            )
            _noted(session, changed.values(error=error, updated_at=db_now()), EpochEvent.ERROR, error)

    def _reload(self, sink_id: str, epoch: int, action: str) -> EpochRecord | None:
        with self._db.transaction(action, write=False) as session:
            return rows.load(session, sink_id, epoch)


def _noted(session: Session, statement: Update, event: EpochEvent, text: str) -> None:
    """A note on a row (a warning, an error) and its history event, when the row matched."""
    found = session.execute(
        statement.returning(
            PendingSinkState.sink_id,
            PendingSinkState.epoch,
            PendingSinkState.write_id,
            PendingSinkState.status,
            PendingSinkState.revision,
        ).execution_options(synchronize_session=False)
    ).one_or_none()
    if found is not None:
        history.record(
            session,
            found.sink_id,
            int(found.epoch),
            event,
            found.write_id,
            status=found.status,
            revision=found.revision,
            reason=text,
        )


@functools.cache
def _decide_statement() -> Update:
    """The commit decision's ``UPDATE``, built once."""
    return rows.returning_row(
        rows.guarded(EpochStatus.PENDING, undecided=True).values(commit_decided_at=db_now(), updated_at=db_now())
    )


@functools.cache
def _mark_statement() -> Update:
    """The Committed mark's ``UPDATE``, built once."""
    return rows.returning_row(
        rows.guarded(EpochStatus.PENDING).values(
            status=EpochStatus.COMMITTED.value,
            committed=bindparam("m_committed"),
            table_uuids=bindparam("m_uuids"),
            error=None,
            updated_at=db_now(),
        )
    )
