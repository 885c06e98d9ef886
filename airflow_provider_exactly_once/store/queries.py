"""Read queries of the operations views (the ``eo-sink`` tool and the Airflow UI's sink view).

Kept apart from ``sql.py``, whose methods are the coordinator's transitions: nothing here writes.
Every query is answered from an index and returns at most ``limit`` rows (counts are ``GROUP BY`` on
the ``(sink_id, status)`` index), so a view costs the same with ten epochs of history as with ten
million; ``dag_ids`` sits in the ``WHERE``, so ``LIMIT``/``OFFSET`` count only rows the caller may
see. The tables and indexes: design.md, "The meta store".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Select, Table, func, select, tuple_
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.epochs import Actor, ActorKind, EpochStatus
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, mask_userinfo
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.store.models import EpochHistory, PendingSinkState, SinkCleanup
from airflow_provider_exactly_once.store.rows import record
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

#: The most rows one listing returns: a page, not an export.
MAX_PAGE = 1000
#: A row's own columns, without the write's metadata its mapping reads along.
_ROW_COLUMNS = tuple(cast(Table, PendingSinkState.__table__).columns)
#: What a stored write that does not parse raises as it is read or shown: the package's refusal,
#: pydantic's ``ValidationError`` (a ``ValueError``, as a damaged JSON text's error is), or the
#: ``KeyError``/``TypeError`` of a JSON value of the wrong shape.
UNPARSABLE: tuple[type[Exception], ...] = (InvalidPreCommit, ValueError, KeyError, TypeError)


@dataclass(frozen=True)
class UnreadableEpoch:
    """An epoch's row whose stored write does not parse: the row's own columns, and ``reason``."""

    sink_id: str
    epoch: int
    status: EpochStatus
    write_id: str
    run_id: str | None
    try_number: int | None
    created_at: datetime
    updated_at: datetime
    commit_decided_at: datetime | None
    error: str | None
    dag_id: str | None
    warning: str | None
    revision: int
    reason: str


def unparsable_reason(exc: Exception) -> str:
    """Why a stored write does not parse, on one line, masked."""
    if isinstance(exc, ValidationError):
        return mask_userinfo(f"{exc.title}: {validation_faults(exc)}")
    return mask_userinfo(str(exc) if isinstance(exc, InvalidPreCommit) else f"{type(exc).__name__}: {exc}")


def validation_faults(exc: ValidationError) -> str:
    """pydantic's errors as ``field: message``, one after the other."""
    faults = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        faults.append(f"{where}: {message}" if where else message)
    return "; ".join(faults)


def _read(session: Session, row: PendingSinkState) -> EpochRecord | UnreadableEpoch:
    try:
        return record(session, row)
    except UNPARSABLE as exc:
        return _unreadable(row, exc)


def _unreadable(row: Any, exc: Exception) -> UnreadableEpoch:
    """``row`` (mapped, or read as columns) without its write, which ``exc`` says does not parse."""
    return UnreadableEpoch(
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        status=EpochStatus(row.status),
        write_id=row.write_id,
        run_id=row.run_id,
        try_number=row.try_number,
        created_at=row.created_at,
        updated_at=row.updated_at,
        commit_decided_at=row.commit_decided_at,
        error=row.error,
        dag_id=row.dag_id,
        warning=row.warning,
        revision=int(row.revision or 0),
        reason=unparsable_reason(exc),
    )


@dataclass(frozen=True)
class SinkCounts:
    """One sink's epochs by status, its oldest Pending epoch, and its clean-ups not yet done."""

    sink_id: str
    pending: int = 0
    committed: int = 0
    aborted: int = 0
    oldest_pending_created_at: datetime | None = None
    pending_cleanups: int = 0


def _of_dags(dag_ids: Collection[str] | None) -> list[ColumnElement[bool]]:
    return [] if dag_ids is None else [PendingSinkState.dag_id.in_(sorted(dag_ids))]


def sink_counts(
    store: SqlSinkStateStore, sink_id: str | None = None, *, dag_ids: Collection[str] | None = None
) -> dict[str, SinkCounts]:
    """Per sink with any row or clean-up: counts by status, oldest Pending ``created_at``, open clean-ups.

    With ``dag_ids``, only sinks with epochs of those DAGs, and only those epochs and their
    clean-ups are counted (an orphan's clean-up belongs to no epoch, so it is not counted then).
    """
    state_filter: list[ColumnElement[bool]] = _of_dags(dag_ids)
    cleanup_filter: list[ColumnElement[bool]] = [SinkCleanup.done_at.is_(None)]
    if sink_id is not None:
        state_filter.append(PendingSinkState.sink_id == sink_id)
        cleanup_filter.append(SinkCleanup.sink_id == sink_id)
    cleanup_query = select(SinkCleanup.sink_id, func.count()).where(*cleanup_filter)
    if dag_ids is not None:
        cleanup_query = cleanup_query.join(
            PendingSinkState,
            (PendingSinkState.sink_id == SinkCleanup.sink_id) & (PendingSinkState.epoch == SinkCleanup.epoch),
        ).where(*_of_dags(dag_ids))
    counts: dict[str, dict[str, int]] = {}
    oldest: dict[str, datetime] = {}
    cleanups: dict[str, int] = {}
    with store.reading("counting epochs per sink") as session:
        for sink, status, count in session.execute(
            select(PendingSinkState.sink_id, PendingSinkState.status, func.count())
            .where(*state_filter)
            .group_by(PendingSinkState.sink_id, PendingSinkState.status)
        ):
            counts.setdefault(sink, {})[status] = int(count)
        for sink, created_at in session.execute(
            select(PendingSinkState.sink_id, func.min(PendingSinkState.created_at))
            .where(*state_filter, PendingSinkState.status == EpochStatus.PENDING.value)
            .group_by(PendingSinkState.sink_id)
        ):
            if created_at is not None:
                oldest[sink] = created_at
        for sink, count in session.execute(cleanup_query.group_by(SinkCleanup.sink_id)):
            cleanups[sink] = int(count)
    return {
        sink: SinkCounts(
            sink_id=sink,
            pending=counts.get(sink, {}).get(EpochStatus.PENDING.value, 0),
            committed=counts.get(sink, {}).get(EpochStatus.COMMITTED.value, 0),
            aborted=counts.get(sink, {}).get(EpochStatus.ABORTED.value, 0),
            oldest_pending_created_at=oldest.get(sink),
            pending_cleanups=cleanups.get(sink, 0),
        )
        for sink in sorted(set(counts) | (set() if dag_ids is not None else set(cleanups)))
    }


def list_epochs(
    store: SqlSinkStateStore,
    *,
    sink_id: str | None = None,
    status: EpochStatus | None = None,
    limit: int = 100,
    offset: int = 0,
    dag_ids: Collection[str] | None = None,
) -> list[EpochRecord | UnreadableEpoch]:
    """A page of epochs, newest first (then by sink id, descending), optionally of one sink and one status.

    Each filter combination is served by an index whose order is the page's order: the primary key
    ``(sink_id, epoch)``, ``(sink_id, status, epoch)``, ``(status, epoch, sink_id)`` or ``(epoch, sink_id)``,
    read backwards: no sort, and a page costs its own rows whatever the history.
    """
    with store.reading("listing epochs") as session:
        rows = session.scalars(
            epochs_statement(sink_id=sink_id, status=status, limit=limit, offset=offset, dag_ids=dag_ids)
        )
        return [_read(session, row) for row in rows]


def unreadable_epoch(store: SqlSinkStateStore, sink_id: str, epoch: int, exc: Exception) -> UnreadableEpoch | None:
    """The epoch's row without its write, which ``exc`` (one of ``UNPARSABLE``) says does not parse;
    ``None`` when it has no row (any more)."""
    with store.reading(f"reading sink {sink_id!r} epoch {epoch} without its write") as session:
        found = session.execute(
            select(*_ROW_COLUMNS).where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
        ).first()
    return None if found is None else _unreadable(found, exc)


def acting_runs(store: SqlSinkStateStore, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], list[Actor]]:
    """Who acted on each of these epochs as a DAG's run (one row per actor, DAG and run), from their
    history over its ``(sink_id, epoch, id)`` index: what tells another DAG's traces in an epoch
    (``operations.views.Redaction``)."""
    wanted = sorted({(sink, int(epoch)) for sink, epoch in keys})
    if not wanted:
        return {}
    history = EpochHistory
    acting: dict[tuple[str, int], list[Actor]] = {}
    with store.reading("reading which runs acted on epochs") as session:
        for sink, epoch, kind, name, dag_id, run_id in session.execute(
            select(history.sink_id, history.epoch, history.actor, history.actor_name, history.dag_id, history.run_id)
            .where(tuple_(history.sink_id, history.epoch).in_(wanted), history.dag_id.is_not(None))
            .distinct()
        ):
            actor = Actor(ActorKind(kind), name=name, dag_id=dag_id, run_id=run_id)
            acting.setdefault((str(sink), int(epoch)), []).append(actor)
    return acting


def count_epochs(
    store: SqlSinkStateStore,
    *,
    sink_id: str | None = None,
    status: EpochStatus | None = None,
    dag_ids: Collection[str] | None = None,
) -> int:
    """How many epochs ``list_epochs`` pages through (a count over the same indexes, no rows fetched)."""
    conditions: list[ColumnElement[bool]] = _of_dags(dag_ids)
    if sink_id is not None:
        conditions.append(PendingSinkState.sink_id == sink_id)
    if status is not None:
        conditions.append(PendingSinkState.status == EpochStatus(status).value)
    with store.reading("counting epochs") as session:
        return int(session.scalar(select(func.count()).select_from(PendingSinkState).where(*conditions)) or 0)


def epoch_dag(store: SqlSinkStateStore, sink_id: str, epoch: int) -> tuple[str | None] | None:
    """``(dag_id,)`` of one epoch's row, ``None`` when it has none: one column by the primary key.

    What the view asks first, before it loads an epoch a user may not be allowed to see: nothing of
    the row beyond its DAG is read, so a hidden epoch costs what a missing one costs.
    """
    with store.reading(f"reading the DAG of sink {sink_id!r} epoch {epoch}") as session:
        found = session.execute(
            select(PendingSinkState.dag_id).where(PendingSinkState.sink_id == sink_id, PendingSinkState.epoch == epoch)
        ).first()
        return None if found is None else (found[0],)


def epochs_statement(
    *,
    sink_id: str | None,
    status: EpochStatus | None,
    limit: int,
    offset: int,
    dag_ids: Collection[str] | None = None,
) -> Select[PendingSinkState]:
    """The query of ``list_epochs`` (its plan is checked against the indexes by the tests).

    ``dag_ids`` filters the rows the index yields, in its order: a page still needs no sort.
    """
    conditions: list[ColumnElement[bool]] = _of_dags(dag_ids)
    if sink_id is not None:
        conditions.append(PendingSinkState.sink_id == sink_id)
    if status is not None:
        conditions.append(PendingSinkState.status == EpochStatus(status).value)
    order = (
        (PendingSinkState.epoch.desc(),)
        if sink_id is not None
        else (PendingSinkState.epoch.desc(), PendingSinkState.sink_id.desc())
    )
    return select(PendingSinkState).where(*conditions).order_by(*order).limit(limit).offset(offset)


def cleanup_counts(store: SqlSinkStateStore, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Open clean-ups per ``(sink_id, epoch)`` of one page (the clean-up log's ``(sink_id, epoch, ...)`` index)."""
    wanted = sorted({(sink, int(epoch)) for sink, epoch in keys})
    if not wanted:
        return {}
    with store.reading("counting open clean-ups") as session:
        return {
            (str(sink), int(epoch)): int(count)
            for sink, epoch, count in session.execute(
                select(SinkCleanup.sink_id, SinkCleanup.epoch, func.count())
                .where(tuple_(SinkCleanup.sink_id, SinkCleanup.epoch).in_(wanted), SinkCleanup.done_at.is_(None))
                .group_by(SinkCleanup.sink_id, SinkCleanup.epoch)
            )
        }


@dataclass(frozen=True)
class PendingRun:
    """A Pending epoch and the DAG run that wrote it (a candidate for a run that will never finish)."""

    sink_id: str
    epoch: int
    dag_id: str
    run_id: str
    updated_at: datetime


def pending_runs(
    store: SqlSinkStateStore,
    *,
    before: datetime,
    sink_id: str | None = None,
    dag_ids: Collection[str] | None = None,
    limit: int = MAX_PAGE,
) -> list[PendingRun]:
    """Pending epochs written by a DAG run and untouched since ``before``, oldest first (at most
    ``limit``): over the ``(sink_id, status, ...)`` indexes, so it costs the unsettled epochs only."""
    conditions = [
        *_of_dags(dag_ids),
        PendingSinkState.status == EpochStatus.PENDING.value,
        PendingSinkState.updated_at < before,
        PendingSinkState.dag_id.is_not(None),
        PendingSinkState.run_id.is_not(None),
    ]
    if sink_id is not None:
        conditions.append(PendingSinkState.sink_id == sink_id)
    query = (
        select(
            PendingSinkState.sink_id,
            PendingSinkState.epoch,
            PendingSinkState.dag_id,
            PendingSinkState.run_id,
            PendingSinkState.updated_at,
        )
        .where(*conditions)
        .order_by(PendingSinkState.updated_at)
        .limit(limit)
    )
    with store.reading("listing Pending epochs of DAG runs") as session:
        return [PendingRun(str(s), int(e), str(d), str(r), u) for s, e, d, r, u in session.execute(query)]
