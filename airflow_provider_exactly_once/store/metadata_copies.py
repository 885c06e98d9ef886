"""A write's stored metadata moved between the tables that hold it, inside the database.

A write of 10,000 files has megabytes of metadata. When a revision opens, commits or is aborted,
and when a write is queued for clean-up, the metadata only changes tables: copied as stored
(deflated, or the text of rows older than 0007) by ``INSERT ... SELECT``, it is neither read into
Python nor serialised again, and the row of ``pending_sink_state`` that the commit updates stays small.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from sqlalchemy import CursorResult, Delete, Insert, Table, Text, bindparam, delete, insert, select
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.store.models import EpochMetadata, ReplacedMetadata, SinkCleanup, db_now

_METADATA = ("sink_id", "epoch", "write_id", "metadata_bytes", "metadata", "metadata_zlib")
#: Between ``epoch_metadata`` and ``replaced_metadata``, the write's head goes along; the clean-up
#: queue reads writes whole.
_WITH_HEAD = (*_METADATA, "head_zlib")


def keep_replaced(session: Session, sink_id: str, epoch: int, write_id: str) -> None:
    """A revision opens: the committed write's metadata moves to ``replaced_metadata`` before the
    revision's takes its place in ``epoch_metadata`` (``rows.replace_metadata``)."""
    _once(session, _copy(EpochMetadata, ReplacedMetadata), sink_id, epoch, write_id, "keep the replaced write's")


def restore_replaced(session: Session, sink_id: str, epoch: int, *, revision_write_id: str) -> None:
    """A revision is aborted: the write it replaced is the epoch's again, and so is its metadata."""
    _once(session, _delete(EpochMetadata, by_write=True), sink_id, epoch, revision_write_id, "drop the revision's")
    _once(session, _copy(ReplacedMetadata, EpochMetadata), sink_id, epoch, None, "restore the replaced write's")
    _once(session, _delete(ReplacedMetadata, by_write=False), sink_id, epoch, None, "drop the replaced write's")


def queue_cleanup(
    session: Session,
    sink_id: str,
    epoch: int,
    write_id: str,
    *,
    reason: str,
    removed_by: str | None = None,
    replaced: bool = False,
) -> None:
    """Queue a write's files for clean-up with its metadata: the epoch's write (``epoch_metadata``),
    or, once its revision committed (``replaced``), the write that revision replaced, whose metadata
    then leaves ``replaced_metadata``."""
    source = ReplacedMetadata if replaced else EpochMetadata
    parameters = {"q_reason": reason, "q_removed_by": removed_by}
    _once(session, _queue(source), sink_id, epoch, write_id, "queue the write's", parameters)
    if replaced:
        _once(session, _delete(ReplacedMetadata, by_write=False), sink_id, epoch, None, "drop the replaced write's")


def _once(
    session: Session,
    statement: Insert | Delete,
    sink_id: str,
    epoch: int,
    write_id: str | None,
    what: str,
    extra: dict[str, Any] | None = None,
) -> None:
    parameters = {"m_sink_id": sink_id, "m_epoch": epoch, "m_write_id": write_id, **(extra or {})}
    if cast(CursorResult[Any], session.execute(statement, parameters)).rowcount != 1:
        # Rolls the transaction back: a step that would lose a write's metadata must not happen.
        raise InvalidPreCommit(
            f"sink {sink_id!r} epoch {epoch}: could not {what} metadata"
            + (f" of write {write_id}" if write_id else "")
            + ": the meta store holds no such row; restore the meta store from a backup"
        )


def _where(table: Table, *, by_write: bool) -> list[Any]:
    found = [table.c.sink_id == bindparam("m_sink_id"), table.c.epoch == bindparam("m_epoch")]
    return [*found, table.c.write_id == bindparam("m_write_id")] if by_write else found


@functools.cache
def _copy(source: type[EpochMetadata | ReplacedMetadata], target: type[EpochMetadata | ReplacedMetadata]) -> Insert:
    """Statements built once each: building one costs as much as running it on SQLite."""
    origin = cast(Table, source.__table__)
    by_write = source is EpochMetadata  # a replaced write is the epoch's one
    return insert(cast(Table, target.__table__)).from_select(
        list(_WITH_HEAD), select(*(origin.c[c] for c in _WITH_HEAD)).where(*_where(origin, by_write=by_write))
    )


@functools.cache
def _delete(source: type[EpochMetadata | ReplacedMetadata], *, by_write: bool) -> Delete:
    table = cast(Table, source.__table__)
    return delete(table).where(*_where(table, by_write=by_write))


@functools.cache
def _queue(source: type[EpochMetadata | ReplacedMetadata]) -> Insert:
    origin = cast(Table, source.__table__)
    return insert(cast(Table, SinkCleanup.__table__)).from_select(
        [*_METADATA, "reason", "created_at", "removed_by"],
        select(
            *(origin.c[c] for c in _METADATA),
            bindparam("q_reason", type_=Text),
            db_now(),
            bindparam("q_removed_by", type_=Text),
        ).where(*_where(origin, by_write=True)),
    )
