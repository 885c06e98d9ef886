"""The epochs' history (``epoch_history``): one row per transition, written by the transition in its
own transaction, read, and expired, never an event a revision is read from (design.md D19); and an
epoch's revisions, the newer generations' writes replacing its committed one, read from and
recorded as those events (design.md D11): the store's ``history`` and ``revisions`` companions.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import cast

from pydantic import TypeAdapter
from sqlalchemy import ColumnElement, Table, Update, bindparam, delete, insert, not_, or_, select, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.epochs import (
    Actor,
    ActorKind,
    EpochEvent,
    EpochStatus,
    HistoryEntry,
    RevisionWrite,
    check_epoch,
    check_write_id,
    current_actor,
)
from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import LOCK_HOLDER_LENGTH, EpochHistory, PendingSinkState, db_now

#: The events an epoch's revision records are read from (``SqlRevisions``): never expired.
KEPT: ColumnElement[bool] = or_(EpochHistory.revision_record.is_not(None), EpochHistory.replaced_write_id.is_not(None))


@functools.cache
def _revision_json() -> TypeAdapter[RevisionWrite]:
    return TypeAdapter(RevisionWrite)


def record(
    session: Session,
    sink_id: str,
    epoch: int,
    event: EpochEvent,
    write_id: str,
    *,
    status: str | None,
    revision: int | None = None,
    reason: str | None = None,
    run: tuple[str | None, str | None, int | None] | None = None,
    revised: RevisionWrite | None = None,
    replaced: str | None = None,
) -> None:
    """Append one event inside the caller's transaction. ``run``: the (DAG, run id, try) the
    transition names (a persist's); otherwise the acting task's run, if a task acts. ``revised``
    and ``replaced``: what the event does to the epoch's revision records (``HistoryEntry``)."""
    actor = current_actor()
    dag_id, run_id, try_number = run if run is not None else (actor.dag_id, actor.run_id, actor.try_number)
    session.execute(
        insert(EpochHistory).values(
            sink_id=sink_id,
            epoch=epoch,
            event=event.value,
            write_id=write_id,
            status=status,
            revision=revision,
            dag_id=dag_id,
            run_id=run_id,
            try_number=try_number,
            run_type=actor.run_type,
            clear_number=actor.clear_number,
            actor=actor.kind.value,
            # a task's dag_id.task_id may pass the column's width, which a transition must never fail on
            actor_name=None if actor.name is None else actor.name[:LOCK_HOLDER_LENGTH],
            reason=reason,
            at=db_now(),
            revision_record=None if revised is None else _revision_json().dump_json(revised).decode(),
            replaced_write_id=replaced,
        )
    )


def recorded(
    session: Session,
    row: EpochRecord,
    event: EpochEvent,
    *,
    reason: str | None = None,
    run: tuple[str | None, str | None, int | None] | None = None,
    revised: RevisionWrite | None = None,
    replaced: str | None = None,
) -> EpochRecord:
    """``record`` of the row as the transition left it; the row, for the transition to return."""
    record(
        session,
        row.sink_id,
        row.epoch,
        event,
        row.write_id,
        status=row.status.value,
        revision=row.revision,
        reason=reason,
        run=run,
        revised=revised,
        replaced=replaced,
    )
    return row


def read(session: Session, sink_id: str, epoch: int, *where: ColumnElement[bool]) -> list[HistoryEntry]:
    """The epoch's events (those matching ``where``), oldest first, inside the caller's transaction."""
    found = session.scalars(
        select(EpochHistory)
        .where(EpochHistory.sink_id == sink_id, EpochHistory.epoch == epoch, *where)
        .order_by(EpochHistory.id)
    )
    return [_entry(row) for row in found]


class SqlHistory:
    """``store.history``: an epoch's events, oldest first, and the retention clean-up."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlHistory({self._db.url_for_display!r})"

    def events(self, sink_id: str, epoch: int) -> Sequence[HistoryEntry]:
        epoch = check_epoch(epoch)
        with self._db.transaction(f"reading the history of sink {sink_id!r} epoch {epoch}", write=False) as session:
            return read(session, sink_id, epoch)

    def record_failure(self, sink_id: str, epoch: int, reason: str, *, final: bool = True) -> bool:
        """Keep the acting task's failed try on its epoch (design.md D22): an ERROR event (a
        TRY_FAILED one when Airflow runs the task again) and, while the epoch's write is not
        Committed, the row's ``error``. An epoch with no row yet (a write that failed before its
        persist) keeps the event alone, under the write id of an epoch without a write. Nothing is
        written when this try already recorded its error (the coordinator notes those it meets);
        whether an event was."""
        epoch, reason = check_epoch(epoch), rows.text(reason, "reason")
        actor = current_actor()
        name = None if actor.name is None else actor.name[:LOCK_HOLDER_LENGTH]
        event = EpochEvent.ERROR if final else EpochEvent.TRY_FAILED
        with self._db.transaction(f"keeping a failure on sink {sink_id!r} epoch {epoch}", write=True) as session:
            newest = session.execute(
                select(EpochHistory.event, EpochHistory.actor_name, EpochHistory.run_id, EpochHistory.try_number)
                .where(EpochHistory.sink_id == sink_id, EpochHistory.epoch == epoch)
                .order_by(EpochHistory.id.desc())
                .limit(1)
            ).one_or_none()
            if newest is not None and tuple(newest) == (EpochEvent.ERROR.value, name, actor.run_id, actor.try_number):
                return False
            row = session.execute(
                select(PendingSinkState.write_id, PendingSinkState.status, PendingSinkState.revision).where(
                    PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch
                )
            ).one_or_none()
            if row is None:
                write_id = PreCommit.nothing_written(sink_id, epoch).write_id
                record(session, sink_id, epoch, event, write_id, status=None, reason=reason)
                return True
            if row.status != EpochStatus.COMMITTED.value:
                session.execute(
                    update(PendingSinkState)
                    .where(
                        PendingSinkState.sink_id == sink_id,
                        PendingSinkState.epoch == epoch,
                        PendingSinkState.write_id == row.write_id,
                    )
                    .values(error=reason, updated_at=db_now())
                )
            record(
                session, sink_id, epoch, event, row.write_id, status=row.status, revision=row.revision, reason=reason
            )
            return True

    def expire(self, sink_id: str, older_than: timedelta) -> int:
        """Delete the sink's history rows older than ``older_than`` by the database's clock; how
        many. Only ``epoch_history`` is touched: an epoch's own row, its write and its clean-ups
        stay, and so do the events its revision records are read from (``KEPT``)."""
        if older_than <= timedelta(0):
            raise ValueError(f"a history retention must be positive, got {older_than}")
        with self._db.transaction(f"expiring old history of sink {sink_id!r}", write=True) as session:
            cutoff = rows.database_now(session) - older_than
            old = delete(EpochHistory).where(EpochHistory.sink_id == sink_id, EpochHistory.at < cutoff, not_(KEPT))
            return rows.rowcount(session, old)


def _entry(row: EpochHistory) -> HistoryEntry:
    return HistoryEntry(
        id=row.id,
        sink_id=row.sink_id,
        epoch=row.epoch,
        event=EpochEvent(row.event),
        write_id=row.write_id,
        status=row.status,
        revision=row.revision,
        at=row.at,
        actor=Actor(
            ActorKind(row.actor),
            name=row.actor_name,
            dag_id=row.dag_id,
            run_id=row.run_id,
            try_number=row.try_number,
            run_type=row.run_type,
            clear_number=row.clear_number,
        ),
        reason=row.reason,
        revised=None if row.revision_record is None else _revision_json().validate_json(row.revision_record),
        replaced_write_id=row.replaced_write_id,
    )


#: The status of a committed write a newer revision made invisible.
REPLACED = "Replaced"


@dataclass(frozen=True)
class RevisionRecord:
    """One revision of an epoch as operators see it: its write, who wrote it, what became of it."""

    sink_id: str
    epoch: int
    revision: int
    write_id: str
    generation: str | None
    #: ``Committed`` (visible now), ``Replaced``, ``Aborted``, or ``Pending`` (the revision in flight).
    status: str
    run_id: str | None
    try_number: int | None
    dag_id: str | None
    rows: int
    files: int
    committed: Mapping[str, str] | None
    reason: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(
        cls, sink_id: str, epoch: int, write: RevisionWrite, reason: str | None, since: datetime, at: datetime
    ) -> RevisionRecord:
        fields = {**asdict(write), "status": write.status.value}
        return cls(sink_id=sink_id, epoch=epoch, reason=reason, created_at=since, updated_at=at, **fields)


class SqlRevisions:
    """The store's ``revisions`` companion: opening, aborting and listing revisions of an epoch."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlRevisions({self._db.url_for_display!r})"

    def open_revision(
        self,
        pre_commit: PreCommit,
        *,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
    ) -> EpochRecord:
        """``Committed -> Pending``: ``pre_commit`` becomes revision n+1, the committed write stays visible.

        ``created_at`` starts afresh: the revision's marker can only be in snapshots younger than it.
        """
        pre_commit = PreCommit.parse(pre_commit)
        expected_write_id = check_write_id(expected_write_id)
        rows.check_run(run_id, try_number)
        dag_id = rows.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"open a revision of Committed write {expected_write_id} with write {pre_commit.write_id}"
        if pre_commit.write_id == expected_write_id:
            raise StateConflict(f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: it needs a new write id")
        with self._db.transaction(f"opening a revision of sink {sink_id!r} epoch {epoch}", write=True) as session:
            replaced = rows.load(session, sink_id, epoch, for_update=True)
            if (
                replaced is None
                or replaced.status is not EpochStatus.COMMITTED
                or replaced.write_id != expected_write_id
            ):
                raise rows.conflict(replaced, sink_id, epoch, wanted)
            now = db_now()
            rows.swap(
                session,
                rows.guarded(EpochStatus.COMMITTED).values(
                    **rows.new_write_values(pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id, now=now),
                    revision=replaced.revision + 1,
                    replaces=rows.replaces_json(replaced),
                ),
                rows.key(sink_id, epoch, expected_write_id),
                wanted,
            )
            rows.keep_replaced(session, sink_id, epoch, expected_write_id)
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            record(
                session,
                sink_id,
                epoch,
                EpochEvent.REVISION_OPENED,
                pre_commit.write_id,
                status=EpochStatus.PENDING.value,
                revision=replaced.revision + 1,
                reason=f"replaces Committed write {expected_write_id}",
                run=(dag_id, run_id, try_number),
                revised=_written(replaced, EpochStatus.COMMITTED, replaced.committed),
            )
            return rows.reloaded(session, sink_id, epoch)

    def abort_revision(
        self, sink_id: str, epoch: int, *, write_id: str, reason: str, decided: bool = False
    ) -> EpochRecord:
        """A Pending revision given up: the write it replaces is the epoch's again, Committed as it was.

        Before its commit decision, or (``decided``) after it when its files are lost, as for
        ``mark_aborted``; the revision's write is queued for clean-up in the same transaction.
        """
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        reason = rows.text(reason, "abort reason")
        wanted = f"abort Pending revision write {write_id} " + (
            "whose commit is decided" if decided else "while no commit is decided"
        )
        with self._db.transaction(f"aborting a revision of sink {sink_id!r} epoch {epoch}", write=True) as session:
            revision = rows.load(session, sink_id, epoch, for_update=True)
            replaced = None if revision is None else revision.kind.replaces
            if revision is None or replaced is None:
                raise rows.conflict(revision, sink_id, epoch, wanted)
            now = db_now()
            rows.swap(
                session,
                rows.guarded(EpochStatus.PENDING, undecided=not decided, decided=decided).values(
                    status=EpochStatus.COMMITTED.value,
                    write_id=replaced.write_id,
                    committed=rows.committed_json(replaced.committed, sink_id, epoch),
                    table_uuids=rows.identities_json(replaced.table_uuids or {}, sink_id, epoch),
                    revision=replaced.revision,
                    replaces=None,
                    error=None,
                    warning=f"revision {revision.revision} (write {write_id}) aborted: {reason}",
                    updated_at=now,
                ),
                rows.key(sink_id, epoch, write_id),
                wanted,
            )
            rows.queue_cleanup(session, sink_id, epoch, write_id, reason=f"revision aborted: {reason}")
            rows.restore_replaced(session, sink_id, epoch, revision_write_id=write_id)
            record(
                session,
                sink_id,
                epoch,
                EpochEvent.REVISION_GIVEN_UP,
                write_id,
                status=EpochStatus.COMMITTED.value,
                revision=revision.revision,
                reason=reason,
                revised=_written(revision, EpochStatus.ABORTED),
            )
            return rows.reloaded(session, sink_id, epoch)

    def was_replaced(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether a revision's commit replaced this write (``commit_revision`` recorded it); the
        events that say so are never expired, so the answer holds forever."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
            found = session.scalar(
                select(EpochHistory.id)
                .where(
                    EpochHistory.sink_id == sink_id,
                    EpochHistory.epoch == epoch,
                    EpochHistory.replaced_write_id == write_id,
                )
                .limit(1)
            )
        return found is not None

    def revisions(self, sink_id: str, epoch: int) -> Sequence[RevisionRecord]:
        """Every recorded revision of the epoch, oldest first, as its events left it: a record is as
        its newest event says, since its first; the one in flight is read from its row."""
        epoch = check_epoch(epoch)
        with self._db.transaction(f"reading the revisions of sink {sink_id!r} epoch {epoch}", write=False) as session:
            events = read(session, sink_id, epoch, KEPT)
            pending = rows.load(session, sink_id, epoch)
        kept: dict[str, RevisionRecord] = {}
        for e in events:
            if e.revised is not None:
                since = kept[e.revised.write_id].created_at if e.revised.write_id in kept else e.at
                reason = e.reason if e.revised.status is EpochStatus.ABORTED else None
                kept[e.revised.write_id] = RevisionRecord.of(sink_id, epoch, e.revised, reason, since, e.at)
            if e.replaced_write_id in kept:
                kept[e.replaced_write_id] = replace(kept[e.replaced_write_id], status=REPLACED, updated_at=e.at)
        listed = sorted(kept.values(), key=lambda r: (r.revision, r.created_at))
        if pending is not None and pending.kind.revises:
            written = _written(pending, EpochStatus.PENDING)
            listed.append(
                RevisionRecord.of(sink_id, epoch, written, pending.error, pending.created_at, pending.updated_at)
            )
        return listed


def commit_revision(session: Session, record: EpochRecord, committed: Mapping[str, str]) -> EpochRecord:
    """Inside ``mark_committed`` of a revision: queue the replaced write's files, and record the
    commit; the row as it then is.

    Those files stay referenced by the snapshots older than ``committed`` (time travel), so the
    clean-up carries ``removed_by`` and waits until no retained snapshot is older.
    """
    replaced = record.replaces
    assert replaced is not None
    rows.queue_cleanup(
        session,
        record.sink_id,
        record.epoch,
        replaced.write_id,
        reason=f"replaced by revision {record.revision} (write {record.write_id})",
        removed_by=json.dumps(dict(committed), sort_keys=True),
        replaced=True,
    )
    done = rows.updated(session, _replaced_statement(), {"r_sink_id": record.sink_id, "r_epoch": record.epoch})
    assert done is not None  # the row the mark just swapped, in this transaction
    revised = _written(record, EpochStatus.COMMITTED, committed)
    return recorded(session, done, EpochEvent.COMMITTED, revised=revised, replaced=replaced.write_id)


@functools.cache
def _replaced_statement() -> Update:
    """The revision no longer replaces anything, the row read back in the same statement."""
    table = cast(Table, PendingSinkState.__table__)
    return rows.returning_row(
        update(table)
        .where(table.c.sink_id == bindparam("r_sink_id"), table.c.epoch == bindparam("r_epoch"))
        .values(replaces=None)
    )


def _written(record: EpochRecord, status: EpochStatus, committed: Mapping[str, str] | None = None) -> RevisionWrite:
    """The row's write as its revision record shows it."""
    return RevisionWrite(
        write_id=record.write_id,
        revision=record.revision,
        status=status,
        generation=record.pre_commit.generation,
        dag_id=record.dag_id,
        run_id=record.run_id,
        try_number=record.try_number,
        rows=record.pre_commit.record_count,
        files=sum(len(t.data_files) for t in record.pre_commit.tables),
        committed=None if committed is None else dict(committed),
    )
