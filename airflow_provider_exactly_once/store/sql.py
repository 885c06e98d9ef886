"""The meta store on SQLAlchemy: SQLite as the embedded default, PostgreSQL in production.

Modelled on pyiceberg's SQL catalog: every status change is a compare-and-swap (``store/cas.py``), and
each public method is one transaction of ``store/database.py``, which translates storage errors into
the domain's. ``SqlSinkStateStore`` is the coordinator's port (``core.ports.SinkStateStore``): the
epoch rows, their transitions and the clean-up queue. What other callers need hangs off it as
companions on the same database, the way pyiceberg hangs ``inspect`` and ``maintenance`` off a
``Table``: ``registry`` (sink registry, orphans, per-sink lock: the recovery DAG and the operations
tools), ``checkpoints`` (the checkpoint table: the marking operator), ``epochs`` (epochs of runs
without a data interval: the epoch operators), ``revisions`` (an epoch's replacements by newer
generations: the coordinator and the operations views), ``runs`` (the logical date and data
interval of each run that persisted a write: the persist task and the operations views) and
``history`` (every transition of every epoch, each written by the transition: the views).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Update, bindparam, insert, select, union, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.decisions import discarded_error
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, StateConflict
from airflow_provider_exactly_once.core.history import EpochEvent
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_write_id
from airflow_provider_exactly_once.core.ports import CommittedTables, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import AbortCause, EpochStatus
from airflow_provider_exactly_once.store import arguments, cas, epoch_history, first_write, metadata_copies, rows
from airflow_provider_exactly_once.store.batch_transitions import SqlBatchTransitions
from airflow_provider_exactly_once.store.checkpoints import SqlCheckpointTable
from airflow_provider_exactly_once.store.cleanup_queue import SqlCleanupQueue, discarded
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.epoch_allocations import SqlEpochAllocator
from airflow_provider_exactly_once.store.epoch_history import SqlHistory
from airflow_provider_exactly_once.store.models import PendingSinkState, SinkCleanup, db_now
from airflow_provider_exactly_once.store.range_reservations import SqlRangeReservations
from airflow_provider_exactly_once.store.registry import SqlSinkRegistry
from airflow_provider_exactly_once.store.revisions import SqlRevisions, commit_revision
from airflow_provider_exactly_once.store.runs import SqlRunRecords


class SqlSinkStateStore(SqlCleanupQueue, SqlBatchTransitions):
    """``core.ports.SinkStateStore`` on a SQL database, with its companions ``registry``,
    ``checkpoints``, ``epochs``, ``revisions``, ``runs``, ``history`` and ``input_ranges`` on the
    same connection pool. The clean-up queue
    (``cleanup_queue.py``) and recovery's batch transitions (``batch_transitions.py``) are its own
    methods, kept in modules of their own.

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
        status = arguments.epoch_status(status)
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
        arguments.check_run(run_id, try_number)
        dag_id = arguments.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"persisting {pre_commit.describe()}"
        try:
            with self._db.transaction(action, write=True) as session:
                # The primary key refuses a second row, so the row itself is not read first.
                record = first_write.insert_row(
                    session, pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id
                )
                if discarded(session, sink_id, epoch, pre_commit.write_id):
                    raise discarded_error(pre_commit)  # rolls the insert back
                rows.insert_metadata(session, pre_commit)
                return epoch_history.recorded(session, record, EpochEvent.PERSISTED, run=(dag_id, run_id, try_number))
        except IntegrityError:
            # The epoch has a row already (a concurrent persist inserted it first): report what it holds.
            existing = self._reload(sink_id, epoch, action)
            if existing is None:  # pragma: no cover - an insert lost to a row that vanished again
                raise
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot persist write {pre_commit.write_id} "
            "as a new Pending row, "
            f"the row already exists: {cas.holds(existing)}"
        )

    def insert_aborted(
        self, pre_commit: PreCommit, *, reason: str, dag_id: str | None = None, cause: AbortCause | None = None
    ) -> EpochRecord:
        """``(none) -> Aborted``: a tombstone for a write aborted before it was ever persisted.

        Row and clean-up are written in one transaction; the primary key settles a race with a
        concurrent persist of the same epoch (the loser gets ``StateConflict``).
        """
        pre_commit = PreCommit.parse(pre_commit)
        reason = arguments.text(reason, "abort reason")
        dag_id = arguments.dag_id(dag_id)
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
                    metadata_copies.queue_cleanup(session, sink_id, epoch, pre_commit.write_id, reason=reason)
                    tombstone = cas.reloaded(session, sink_id, epoch)
                    return epoch_history.recorded(session, tombstone, EpochEvent.ABORTED_UNPERSISTED, reason=reason)
        except IntegrityError:
            pass  # a concurrent persist inserted first
        existing = self._reload(sink_id, epoch, action)
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot record write {pre_commit.write_id} as aborted, "
            f"the row already exists: {cas.holds(existing)}"
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
        expected_status = arguments.epoch_status(expected_status)
        expected_write_id = check_write_id(expected_write_id)
        arguments.check_run(run_id, try_number)
        dag_id = arguments.dag_id(dag_id)
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
            cas.swap(
                session,
                cas.guarded(expected_status, undecided=pending).values(**values),
                cas.key(sink_id, epoch, expected_write_id),
                f"{wanted}{' while no commit is decided' if pending else ''}",
            )
            if pending:
                metadata_copies.queue_cleanup(
                    session, sink_id, epoch, expected_write_id, reason=f"replaced by write {pre_commit.write_id}"
                )
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            replaced = f"replaces {expected_status} write {expected_write_id}"
            if expected_write_id == PreCommit.nothing_written(sink_id, epoch).write_id:
                replaced = "the first write of an epoch aborted before any write"
            run = (dag_id, run_id, try_number)
            record = cas.reloaded(session, sink_id, epoch)
            return epoch_history.recorded(session, record, EpochEvent.REPLACED, reason=replaced, run=run)

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
        arguments.check_run(run_id, try_number)
        dag_id = arguments.dag_id(dag_id)
        reason = arguments.text(reason, "re-open reason")
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"re-open Committed write {expected_write_id} with write {pre_commit.write_id}"
        if pre_commit.write_id == expected_write_id:
            raise StateConflict(f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: it needs a new write id")
        with self._db.transaction(f"re-opening sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            cas.swap(
                session,
                cas.guarded(EpochStatus.COMMITTED).values(
                    **rows.new_write_values(pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id, now=now),
                    warning=reason,
                ),
                cas.key(sink_id, epoch, expected_write_id),
                wanted,
            )
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            record = cas.reloaded(session, sink_id, epoch)
            run = (dag_id, run_id, try_number)
            return epoch_history.recorded(session, record, EpochEvent.REOPENED, reason=reason, run=run)

    def record_warning(self, sink_id: str, epoch: int, *, warning: str) -> None:
        """Keep a warning on the row whatever its status; it decides nothing, operators read it."""
        epoch = check_epoch(epoch)
        warning = arguments.text(warning, "warning")
        with self._db.transaction(f"recording a warning on sink {sink_id!r} epoch {epoch}", write=True) as session:
            changed = update(PendingSinkState).where(
                PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch
            )
            _noted(session, changed.values(warning=warning, updated_at=db_now()), EpochEvent.WARNING, warning)

    def decide_commit(self, sink_id: str, epoch: int, *, write_id: str) -> EpochRecord:
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"deciding the commit of sink {sink_id!r} epoch {epoch}", write=True) as session:
            decided = rows.updated(session, _decide_statement(), cas.key(sink_id, epoch, write_id))
            if decided is not None:
                return epoch_history.recorded(session, decided, EpochEvent.COMMIT_DECIDED)
            found = rows.load(session, sink_id, epoch)
            already = (
                found is not None
                and found.status is EpochStatus.PENDING
                and found.write_id == write_id
                and found.commit_decided_at is not None
            )
            if found is None or not already:
                raise cas.conflict(found, sink_id, epoch, f"decide to commit Pending write {write_id}")
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
            record = cas.swapped(
                session,
                _mark_statement(),
                cas.key(sink_id, epoch, write_id, m_committed=committed_json, m_uuids=identities_json),
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
            return epoch_history.recorded(session, record, EpochEvent.COMMITTED)

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
        reason = arguments.text(reason, "abort reason")
        with self._db.transaction(f"aborting sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            cas.swap(
                session,
                cas.guarded(EpochStatus.PENDING, undecided=not decided, decided=decided).values(
                    status=EpochStatus.ABORTED.value, error=reason, abort_cause=cause, updated_at=now
                ),
                cas.key(sink_id, epoch, write_id),
                f"abort Pending write {write_id} "
                + ("whose commit is decided" if decided else "while no commit is decided"),
            )
            record = cas.reloaded(session, sink_id, epoch)
            if record.kind.revises:  # rolls the CAS back: a revision's abort restores the replaced write
                raise StateConflict(
                    f"sink {sink_id!r} epoch {epoch}: write {write_id} is a revision; abort it with abort_revision"
                )
            metadata_copies.queue_cleanup(session, sink_id, epoch, write_id, reason=reason)
            why = reason if cause is None else f"{cause.value}: {reason}"
            return epoch_history.recorded(session, record, EpochEvent.ABORTED, reason=why)

    def record_error(self, sink_id: str, epoch: int, *, write_id: str, error: str) -> None:
        """Only on a row of this write that is not Committed: committing clears the error for good."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        error = arguments.text(error, "error")
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
        epoch_history.record(
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
        cas.guarded(EpochStatus.PENDING, undecided=True).values(commit_decided_at=db_now(), updated_at=db_now())
    )


@functools.cache
def _mark_statement() -> Update:
    """The Committed mark's ``UPDATE``, built once."""
    return rows.returning_row(
        cas.guarded(EpochStatus.PENDING).values(
            status=EpochStatus.COMMITTED.value,
            committed=bindparam("m_committed"),
            table_uuids=bindparam("m_uuids"),
            error=None,
            updated_at=db_now(),
        )
    )
