"""Compare-and-swap on ``pending_sink_state``: the statement, its check, and the error it raises.

Every status change of an epoch is an ``UPDATE`` whose ``WHERE`` names the status and write it
expects, followed by a row-count check (invariant 5), so a zombie attempt's late transition fails
loudly instead of overwriting a newer decision; the error says what the row holds instead.
"""

from __future__ import annotations

import functools
from typing import cast

from sqlalchemy import BigInteger, ColumnElement, String, Table, Update, bindparam, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import EpochNotFound, StateConflict
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.models import PendingSinkState

_STATE = cast(Table, PendingSinkState.__table__)


class EpochRowMissing(StateConflict, EpochNotFound):
    """A compare-and-swap found no row at all: both a conflict and "never persisted"."""


#: The parameters of every ``guarded`` statement: the row's key and the write it must hold (``key``).
_SINK_ID, _EPOCH, _WRITE_ID = "g_sink_id", "g_epoch", "g_write_id"


@functools.cache
def guarded(status: EpochStatus, *, undecided: bool = False, decided: bool = False) -> Update:
    """An ``UPDATE`` of an epoch's row that matches only while it holds ``status`` and the write
    (with ``undecided``/``decided``: only before/after the commit decision); add ``.values(...)``.

    The row and the write are parameters (``key``), so each form is built once: building one per
    call cost as much as running it."""
    row = _STATE.c
    conditions: list[ColumnElement[bool]] = [
        row.sink_id == bindparam(_SINK_ID, type_=String),
        row.epoch == bindparam(_EPOCH, type_=BigInteger),
        row.status == status.value,
        row.write_id == bindparam(_WRITE_ID, type_=String),
    ]
    if undecided:
        conditions.append(row.commit_decided_at.is_(None))
    if decided:
        conditions.append(row.commit_decided_at.is_not(None))
    # On the table, not the mapped class: an ORM-enabled UPDATE ... RETURNING runs through the ORM's
    # bulk-update machinery, which cost a commit decision about a millisecond more on PostgreSQL
    # (issue 18); the session holds no objects of the row for it to synchronise anyway.
    return update(_STATE).where(*conditions)


def key(sink_id: str, epoch: int, write_id: str, **values: object) -> dict[str, object]:
    """The parameters of a ``guarded`` statement, with those of its values."""
    return {_SINK_ID: sink_id, _EPOCH: epoch, _WRITE_ID: write_id, **values}


def holds(record: EpochRecord | None) -> str:
    if record is None:
        return "there is no row"
    decided = record.commit_decided_at
    return f"the row holds status {record.status} write {record.write_id}" + (
        f", commit decided at {decided.isoformat()}" if decided is not None else ", no commit decided"
    )


def conflict(record: EpochRecord | None, sink_id: str, epoch: int, wanted: str) -> StateConflict:
    message = f"sink {sink_id!r} epoch {epoch}: expected to {wanted}, but {holds(record)}"
    return EpochRowMissing(message) if record is None else StateConflict(message)


def swap(session: Session, statement: Update, parameters: dict[str, object], wanted: str) -> None:
    """Run a ``guarded`` statement with its ``key``; ``StateConflict`` (``EpochRowMissing`` without a
    row) unless it changed exactly the one row."""
    if rows.rowcount(session, statement, parameters) != 1:
        raise _conflict(session, parameters, wanted)


def swapped(session: Session, statement: Update, parameters: dict[str, object], wanted: str) -> EpochRecord:
    """``swap`` of a statement with ``rows.returning_row``: the row as the statement changed it, no
    second read."""
    changed = rows.updated(session, statement, parameters)
    if changed is None:
        raise _conflict(session, parameters, wanted)
    return changed


def _conflict(session: Session, parameters: dict[str, object], wanted: str) -> StateConflict:
    sink_id, epoch = str(parameters[_SINK_ID]), int(cast(int, parameters[_EPOCH]))
    return conflict(rows.load(session, sink_id, epoch), sink_id, epoch, wanted)


def reloaded(session: Session, sink_id: str, epoch: int) -> EpochRecord:
    """The row as the transaction now sees it, after a change that must have left it in place."""
    record = rows.load(session, sink_id, epoch)
    assert record is not None
    return record
