"""Compare-and-swap on ``pending_sink_state``: the statement, its check, and the error it raises.

Every status change of an epoch is an ``UPDATE`` whose ``WHERE`` names the status and write it
expects, followed by a row-count check (invariant 5), so a zombie attempt's late transition fails
loudly instead of overwriting a newer decision; the error says what the row holds instead.
"""

from __future__ import annotations

import functools
from typing import cast

from sqlalchemy import BigInteger, BindParameter, ColumnElement, String, Table, Update, bindparam, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import EpochNotFound, StateConflict
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.models import PendingSinkState

_STATE = cast(Table, PendingSinkState.__table__)


class EpochRowMissing(StateConflict, EpochNotFound):
    """A compare-and-swap found no row at all: both a conflict and "never persisted"."""


def guarded_update(
    sink_id: str | BindParameter[str],
    epoch: int | BindParameter[int],
    status: EpochStatus,
    write_id: str | BindParameter[str],
    *,
    undecided: bool = False,
    decided: bool = False,
) -> Update:
    """An ``UPDATE`` of the epoch's row that matches only while it holds ``status`` and ``write_id``
    (with ``undecided``/``decided``: only before/after the commit decision); add ``.values(...)``."""
    row = _STATE.c
    conditions: list[ColumnElement[bool]] = [
        row.sink_id == sink_id,
        row.epoch == epoch,
        row.status == status.value,
        row.write_id == write_id,
    ]
    if undecided:
        conditions.append(row.commit_decided_at.is_(None))
    if decided:
        conditions.append(row.commit_decided_at.is_not(None))
    # On the table, not the mapped class: an ORM-enabled UPDATE ... RETURNING runs through the ORM's
    # bulk-update machinery, which cost a commit decision about a millisecond more on PostgreSQL
    # (issue 18); the session holds no objects of the row for it to synchronise anyway.
    return update(_STATE).where(*conditions)


#: The parameters of a ``guarded_template``: the row's key and the write it must hold.
SINK_ID, EPOCH, WRITE_ID = "g_sink_id", "g_epoch", "g_write_id"


@functools.cache
def guarded_template(status: EpochStatus, *, undecided: bool = False, decided: bool = False) -> Update:
    """``guarded_update`` with the row and write as parameters (``SINK_ID``, ``EPOCH``, ``WRITE_ID``),
    for a statement built once: building one per call cost as much as running it."""
    return guarded_update(
        bindparam(SINK_ID, type_=String),
        bindparam(EPOCH, type_=BigInteger),
        status,
        bindparam(WRITE_ID, type_=String),
        undecided=undecided,
        decided=decided,
    )


def holds(record: EpochRecord | PendingSinkState | None) -> str:
    if record is None:
        return "there is no row"
    decided = record.commit_decided_at
    return f"the row holds status {record.status} write {record.write_id}" + (
        f", commit decided at {decided.isoformat()}" if decided is not None else ", no commit decided"
    )


def conflict(row: PendingSinkState | None, sink_id: str, epoch: int, wanted: str) -> StateConflict:
    message = f"sink {sink_id!r} epoch {epoch}: expected to {wanted}, but {holds(row)}"
    return EpochRowMissing(message) if row is None else StateConflict(message)


def swap(session: Session, statement: Update, sink_id: str, epoch: int, wanted: str) -> None:
    """Run a ``guarded_update`` statement; ``StateConflict`` (``EpochRowMissing`` without a row) unless it
    changed exactly the one row."""
    if rows.rowcount(session, statement) != 1:
        raise conflict(rows.load(session, sink_id, epoch), sink_id, epoch, wanted)


def swapped(
    session: Session,
    statement: Update,
    sink_id: str,
    epoch: int,
    wanted: str,
    parameters: dict[str, object] | None = None,
) -> EpochRecord:
    """``swap``, returning the row as the statement changed it (``rows.updated``: no second read)."""
    changed = rows.updated(session, statement, parameters)
    if changed is None:
        raise conflict(rows.load(session, sink_id, epoch), sink_id, epoch, wanted)
    return changed


def reloaded(session: Session, sink_id: str, epoch: int) -> EpochRecord:
    """The row as the transaction now sees it, after a change that must have left it in place."""
    row = rows.load(session, sink_id, epoch)
    assert row is not None
    return rows.record(row)
