"""Reserved snapshot ranges of incremental inputs: the store's ``input_ranges`` companion.

Only the write operator reserves (``runtime.upstream_ranges``); the coordinator is handed a write
that read its range and never reserves one, so reservation is not part of its port. The rules of
the chain are ``core.input_ranges``'; this module lists a sink's links with their epochs' statuses
in one statement and adds a link where the rules said, refusing a second one at a position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from airflow_provider_exactly_once.core.input_ranges import Link, SnapshotRange
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import InputRange, PendingSinkState


@dataclass(frozen=True)
class Chain:
    """A sink's links, in chain order, and each linked epoch's row status (absent: no row)."""

    links: Sequence[Link]
    statuses: dict[int, EpochStatus]

    def status_of(self, epoch: int) -> EpochStatus | None:
        return self.statuses.get(epoch)


class SqlRangeReservations:
    """The ``input_range`` table: one reserved range per (sink, epoch), chained by position."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlRangeReservations({self._db.url_for_display!r})"

    def chain(self, sink_id: str) -> Chain:
        """Every link of the sink with its epoch's status, read in one statement."""
        query = (
            select(InputRange, PendingSinkState.status)
            .outerjoin(
                PendingSinkState,
                (PendingSinkState.sink_id == InputRange.sink_id) & (PendingSinkState.epoch == InputRange.epoch),
            )
            .where(InputRange.sink_id == sink_id)
            .order_by(InputRange.position)
        )
        with self._db.transaction(f"reading the input ranges of sink {sink_id!r}", write=False) as session:
            found = session.execute(query).all()
        links = [Link(row.epoch, row.position, _range(row)) for row, _ in found]
        statuses = {row.epoch: EpochStatus(status) for row, status in found if status is not None}
        return Chain(links, statuses)

    def range_of(self, sink_id: str, epoch: int) -> SnapshotRange | None:
        """The range epoch ``epoch`` reserved, if it did: what its checkpoint and views show."""
        with self._db.transaction(f"reading the input range of sink {sink_id!r} epoch {epoch}", write=False) as session:
            row = session.get(InputRange, (sink_id, epoch))
            return None if row is None else _range(row)

    def sharing_start(self, sink_id: str, epoch: int, reserved: SnapshotRange) -> int | None:
        """Another epoch whose non-empty range starts where ``reserved`` does and whose commit is
        decided or done: it read these rows already (``core.decisions``' fence at the commit)."""
        start = InputRange.after_snapshot_id
        query = (
            select(InputRange.epoch, InputRange.to_snapshot_id)
            .join(
                PendingSinkState,
                (PendingSinkState.sink_id == InputRange.sink_id) & (PendingSinkState.epoch == InputRange.epoch),
            )
            .where(
                InputRange.sink_id == sink_id,
                InputRange.epoch != epoch,
                InputRange.source == reserved.table,
                start.is_(None) if reserved.after_snapshot_id is None else start == reserved.after_snapshot_id,
                (PendingSinkState.status == EpochStatus.COMMITTED.value)
                | PendingSinkState.commit_decided_at.isnot(None),
            )
            .order_by(InputRange.position)
        )
        action = f"reading the epochs of sink {sink_id!r} that read {reserved.describe()}"
        with self._db.transaction(action, write=False) as session:
            for other, to in session.execute(query).all():
                if to != reserved.after_snapshot_id:  # an empty range read nothing
                    return int(other)
        return None

    def reserve(self, sink_id: str, epoch: int, position: int, reserved: SnapshotRange, run_id: str | None) -> bool:
        """Add the link; ``False`` when another reservation took the position or the epoch first."""
        values = {
            "sink_id": sink_id,
            "epoch": epoch,
            "position": position,
            "source": reserved.table,
            "after_snapshot_id": reserved.after_snapshot_id,
            "to_snapshot_id": reserved.to_snapshot_id,
            "run_id": run_id,
        }
        action = f"reserving {reserved.describe()} for sink {sink_id!r} epoch {epoch}"
        try:
            with self._db.transaction(action, write=True) as session:
                session.execute(insert(InputRange).values(**values, reserved_at=rows.database_now(session)))
        except IntegrityError:
            return False
        return True


def _range(row: InputRange) -> SnapshotRange:
    return SnapshotRange(table=row.source, after_snapshot_id=row.after_snapshot_id, to_snapshot_id=row.to_snapshot_id)
