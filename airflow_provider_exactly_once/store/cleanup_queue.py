"""The clean-up queue, ``sink_cleanup``: writes whose files must go (design.md D3).

Part of the coordinator's port (``core.ports.SinkStateStore``), on the store's own database: a write
is queued in the same transaction as the status change that dooms it (``sql.py``), or on its own when
it was never the epoch's (``enqueue_cleanup``), and a queued write is never persisted again
(``write_discarded``). Done entries stay: they are the record that a write was discarded.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import cast

from sqlalchemy import ColumnElement, Select, Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, StateConflict
from airflow_provider_exactly_once.core.history import EpochEvent
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_write_id
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH, CleanupTask
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import arguments, epoch_history, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import SinkCleanup, db_now


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
        reason = arguments.text(reason, "clean-up reason")
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
                epoch_history.record(
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
                    epoch_history.record(
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
