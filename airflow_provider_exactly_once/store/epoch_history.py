"""The epochs' history (``epoch_history``, migration 0012): one row per transition, written by the
transition itself in its own transaction (``record``), so that a crash leaves both or neither; and
the store's ``history`` companion, which reads an epoch's rows and expires old ones, never those
an epoch's revision records are read from (``KEPT``, design.md D19).

Every transition of ``sql.py``, ``batch_transitions.py``, ``revisions.py`` and ``cleanup_queue.py``
calls ``record`` (``tests/store/test_store_history.py`` fails for one that does not). Who acted comes
from the context the acting door set (``core.history.acting``); a transition that names the run
(a persist) records that run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta

from pydantic import TypeAdapter
from sqlalchemy import ColumnElement, delete, insert, not_, or_, select, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.history import (
    Actor,
    ActorKind,
    EpochEvent,
    HistoryEntry,
    RevisionWrite,
    current_actor,
)
from airflow_provider_exactly_once.core.identifiers import check_epoch
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import arguments, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import LOCK_HOLDER_LENGTH, EpochHistory, PendingSinkState, db_now

#: The events an epoch's revision records are read from (``store/revisions.py``): never expired.
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
        epoch, reason = check_epoch(epoch), arguments.text(reason, "reason")
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
