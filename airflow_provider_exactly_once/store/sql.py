"""The meta store on SQLAlchemy: SQLite as the embedded default, PostgreSQL in production.

Modelled on pyiceberg's SQL catalog: every status change is a compare-and-swap (``store/cas.py``), and
each public method is one transaction of ``store/database.py``, which translates storage errors into
the domain's. ``SqlSinkStateStore`` is the coordinator's port (``core.ports.SinkStateStore``): the
epoch rows, their transitions and the clean-up queue. What other callers need hangs off it as
companions on the same database, the way pyiceberg hangs ``inspect`` and ``maintenance`` off a
``Table``: ``registry`` (sink registry, orphans, per-sink lock: the recovery DAG and the operations
tools), ``checkpoints`` (the checkpoint table: the marking operator), ``epochs`` (epochs of runs
without a data interval: the epoch operators) and ``revisions`` (an epoch's replacements by newer
generations: the coordinator and the operations views).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, insert, select, union, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, StateConflict
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_sink_id, check_write_id
from airflow_provider_exactly_once.core.ports import (
    ORPHAN_EPOCH,
    CleanupTask,
    CommitMark,
    CommittedTables,
    EpochRecord,
)
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import arguments, cas, rows
from airflow_provider_exactly_once.store.checkpoints import SqlCheckpointTable
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.epochs import SqlEpochAllocator
from airflow_provider_exactly_once.store.models import PendingSinkState, SinkCleanup, db_now
from airflow_provider_exactly_once.store.registry import SqlSinkRegistry
from airflow_provider_exactly_once.store.revisions import SqlRevisions, commit_revision


class SqlSinkStateStore:
    """``core.ports.SinkStateStore`` on a SQL database, with its companions ``registry``,
    ``checkpoints``, ``epochs`` and ``revisions`` on the same connection pool.

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

    @property
    def url_for_display(self) -> str:
        return self._db.url_for_display

    @property
    def engine(self) -> Engine:
        return self._db.engine

    def dispose(self) -> None:
        self._db.dispose()

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
        check_sink_id(sink_id)
        check_epoch(epoch)
        with self._db.transaction(f"reading sink {sink_id!r} epoch {epoch}", write=False) as session:
            return rows.load_light(session, sink_id, epoch)

    def epochs_with_status(self, sink_id: str, status: EpochStatus) -> Sequence[EpochRecord]:
        check_sink_id(sink_id)
        status = arguments.epoch_status(status)
        with self._db.transaction(f"listing {status} epochs of sink {sink_id!r}", write=False) as session:
            found = session.scalars(
                select(PendingSinkState)
                .where(PendingSinkState.sink_id == sink_id, PendingSinkState.status == status.value)
                .order_by(PendingSinkState.epoch)
            )
            return [rows.record(row) for row in found]

    def sink_ids(self) -> Sequence[str]:
        with self._db.transaction("listing sinks", write=False) as session:
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
        with self._db.transaction(f"listing clean-ups of sink {sink_id!r}", write=False) as session:
            found = session.scalars(select(SinkCleanup).where(*conditions).order_by(SinkCleanup.id))
            return [rows.cleanup_task(row) for row in found]

    # -- transitions -----------------------------------------------------------------------------

    def insert_pending(
        self, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None = None
    ) -> EpochRecord:
        pre_commit = PreCommit.parse(pre_commit)
        arguments.check_run(run_id, try_number)
        dag_id = arguments.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        action = f"persisting {pre_commit.describe()}"
        existing: EpochRecord | PendingSinkState | None
        try:
            with self._db.transaction(action, write=True) as session:
                existing = rows.load(session, sink_id, epoch)
                if existing is None:
                    now = db_now()
                    session.execute(
                        insert(PendingSinkState).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            status=EpochStatus.PENDING.value,
                            write_id=pre_commit.write_id,
                            metadata_json=rows.remembered_json(pre_commit),
                            run_id=run_id,
                            try_number=try_number,
                            dag_id=dag_id,
                            created_at=now,
                            updated_at=now,
                        )
                    )
                    record = rows.load_light(session, sink_id, epoch)
                    assert record is not None
                    return record
        except IntegrityError:
            # A concurrent attempt inserted between our read and our insert; report what it wrote.
            existing = self._reload(sink_id, epoch, action)
            if existing is None:  # pragma: no cover - an insert lost to a row that vanished again
                raise
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot persist write {pre_commit.write_id} "
            "as a new Pending row, "
            f"the row already exists: {cas.holds(existing)}"
        )

    def insert_aborted(self, pre_commit: PreCommit, *, reason: str, dag_id: str | None = None) -> EpochRecord:
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
                    now, metadata_json = db_now(), rows.remembered_json(pre_commit)
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
                    return cas.reloaded(session, sink_id, epoch)
        except IntegrityError:
            pass  # a concurrent persist inserted first
        existing = self._reload(sink_id, epoch, action)
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: cannot record write {pre_commit.write_id} as aborted, "
            f"the row already exists: {cas.holds(existing)}"
        )

    def write_discarded(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether the write was ever queued for clean-up; done clean-ups count (they are the record)."""
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
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
            old = rows.load(session, sink_id, epoch, for_update=True)
            now = db_now()
            values: dict[str, Any] = {
                "status": EpochStatus.PENDING.value,
                "write_id": pre_commit.write_id,
                "metadata_json": rows.remembered_json(pre_commit),
                "run_id": run_id,
                "try_number": try_number,
                "dag_id": dag_id,
                "updated_at": now,
                "error": None,
            }
            if not pending:
                values.update(commit_decided_at=None, committed=None)
            cas.swap(
                session,
                cas.guarded_update(sink_id, epoch, expected_status, expected_write_id, undecided=pending).values(
                    **values
                ),
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
            return cas.reloaded(session, sink_id, epoch)

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
                cas.guarded_update(sink_id, epoch, EpochStatus.COMMITTED, expected_write_id).values(
                    **rows.new_write_values(pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id, now=now),
                    warning=reason,
                ),
                sink_id,
                epoch,
                wanted,
            )
            return cas.reloaded(session, sink_id, epoch)

    def record_warning(self, sink_id: str, epoch: int, *, warning: str) -> None:
        """Keep a warning on the row whatever its status; it decides nothing, operators read it."""
        sink_id, epoch = check_sink_id(sink_id), check_epoch(epoch)
        warning = arguments.text(warning, "warning")
        with self._db.transaction(f"recording a warning on sink {sink_id!r} epoch {epoch}", write=True) as session:
            session.execute(
                update(PendingSinkState)
                .where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
                .values(warning=warning, updated_at=db_now())
                .execution_options(synchronize_session=False)
            )

    def decide_commit(self, sink_id: str, epoch: int, *, write_id: str) -> EpochRecord:
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"deciding the commit of sink {sink_id!r} epoch {epoch}", write=True) as session:
            statement = cas.guarded_update(sink_id, epoch, EpochStatus.PENDING, write_id, undecided=True).values(
                commit_decided_at=db_now(), updated_at=db_now()
            )
            if rows.rowcount(session, statement) != 1:
                row = rows.load(session, sink_id, epoch)
                already = (
                    row is not None
                    and row.status == EpochStatus.PENDING.value
                    and row.write_id == write_id
                    and row.commit_decided_at is not None
                )
                if not already:
                    raise cas.conflict(row, sink_id, epoch, f"decide to commit Pending write {write_id}")
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
        committed_json = rows.committed_json(committed, sink_id, epoch)
        identities_json = rows.identities_json(identities or {}, sink_id, epoch)
        with self._db.transaction(f"marking sink {sink_id!r} epoch {epoch} committed", write=True) as session:
            cas.swap(
                session,
                cas.guarded_update(sink_id, epoch, EpochStatus.PENDING, write_id).values(
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
            if record.replaces is not None:
                commit_revision(session, record, committed)
                record = self._reloaded(session, sink_id, epoch)
            return record

    def decide_commits(self, sink_id: str, writes: Sequence[tuple[int, str]]) -> Sequence[int]:
        sink_id = check_sink_id(sink_id)
        decided: list[int] = []
        action = f"deciding the commits of {len(writes)} epochs of sink {sink_id!r}"
        with self._db.transaction(action, write=True) as session:
            for epoch, write_id in writes:
                epoch, write_id = check_epoch(epoch), check_write_id(write_id)
                statement = cas.guarded_update(sink_id, epoch, EpochStatus.PENDING, write_id, undecided=True).values(
                    commit_decided_at=db_now(), updated_at=db_now()
                )
                if rows.rowcount(session, statement) != 1:
                    row = rows.load(session, sink_id, epoch)
                    if row is None or (row.status, row.write_id) != (EpochStatus.PENDING.value, write_id):
                        break
                    if row.commit_decided_at is None:
                        break  # as decide_commit, a decision already taken for this write counts
                decided.append(epoch)
        return decided

    def mark_committed_batch(self, sink_id: str, marks: Sequence[CommitMark]) -> Sequence[int]:
        sink_id = check_sink_id(sink_id)
        marked: list[int] = []
        with self._db.transaction(f"marking {len(marks)} epochs of sink {sink_id!r} committed", write=True) as session:
            for mark in marks:
                epoch, write_id = check_epoch(mark.epoch), check_write_id(mark.write_id)
                statement = (
                    cas.guarded_update(sink_id, epoch, EpochStatus.PENDING, write_id, decided=True)
                    .where(PendingSinkState.replaces.is_(None))  # a revision's commit also records the revision
                    .values(
                        status=EpochStatus.COMMITTED.value,
                        committed=rows.committed_json(mark.committed, sink_id, epoch),
                        table_uuids=rows.identities_json(mark.identities, sink_id, epoch),
                        error=None,
                        updated_at=db_now(),
                    )
                )
                if rows.rowcount(session, statement) == 1:
                    marked.append(epoch)
        return marked

    def mark_aborted(
        self, sink_id: str, epoch: int, *, write_id: str, reason: str, decided: bool = False
    ) -> EpochRecord:
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        reason = arguments.text(reason, "abort reason")
        with self._db.transaction(f"aborting sink {sink_id!r} epoch {epoch}", write=True) as session:
            now = db_now()
            cas.swap(
                session,
                cas.guarded_update(
                    sink_id, epoch, EpochStatus.PENDING, write_id, undecided=not decided, decided=decided
                ).values(status=EpochStatus.ABORTED.value, error=reason, updated_at=now),
                sink_id,
                epoch,
                f"abort Pending write {write_id} "
                + ("whose commit is decided" if decided else "while no commit is decided"),
            )
            row = rows.load(session, sink_id, epoch)
            assert row is not None
            if row.replaces is not None:  # rolls the CAS back: a revision's abort restores the replaced write
                raise StateConflict(
                    f"sink {sink_id!r} epoch {epoch}: write {write_id} is a revision; abort it with abort_revision"
                )
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
            return rows.record(row)

    def record_error(self, sink_id: str, epoch: int, *, write_id: str, error: str) -> None:
        """Only on a row of this write that is not Committed: committing clears the error for good."""
        sink_id, epoch, write_id = check_sink_id(sink_id), check_epoch(epoch), check_write_id(write_id)
        error = arguments.text(error, "error")
        with self._db.transaction(f"recording an error on sink {sink_id!r} epoch {epoch}", write=True) as session:
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
        reason = arguments.text(reason, "clean-up reason")
        with self._db.transaction(f"queuing the clean-up of {pre_commit.describe()}", write=True) as session:
            cleanup_id = session.execute(
                insert(SinkCleanup)
                .values(
                    sink_id=pre_commit.sink_id,
                    epoch=pre_commit.epoch,
                    write_id=pre_commit.write_id,
                    metadata_json=rows.remembered_json(pre_commit),
                    reason=reason,
                    created_at=db_now(),
                )
                .returning(SinkCleanup.id)
            ).scalar_one()
            row = session.get_one(SinkCleanup, cleanup_id)
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
            if rows.rowcount(session, statement) != 1 and session.get(SinkCleanup, cleanup_id) is None:
                raise StateConflict(f"meta store {self._db.url_for_display}: there is no clean-up {cleanup_id}")

    @staticmethod
    def _reloaded(session: Session, sink_id: str, epoch: int) -> EpochRecord:
        """``cas.reloaded`` without fetching the metadata again when it was parsed (``rows.load_light``)."""
        record = rows.load_light(session, sink_id, epoch)
        assert record is not None
        return record

    def _reload(self, sink_id: str, epoch: int, action: str) -> EpochRecord | None:
        with self._db.transaction(action, write=False) as session:
            row = rows.load(session, sink_id, epoch)
            return None if row is None else rows.record(row)
