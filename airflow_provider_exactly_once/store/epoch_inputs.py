"""Where an epoch's input stands: the checkpoint table (design.md, "Checkpoint sources"), the snapshot
ranges reserved for incremental inputs (design.md D21), and the epochs allocated to DAG runs without
a data interval: the store's ``checkpoints``, ``input_ranges`` and ``epochs`` companions.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, and_, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased

from airflow_provider_exactly_once.core.epochs import (
    CheckpointStatus,
    EpochStatus,
    check_epoch,
    epoch_from_interval_start,
)
from airflow_provider_exactly_once.core.errors import MetaStoreUnavailable, StateConflict
from airflow_provider_exactly_once.core.input_ranges import Link, SnapshotRange
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import (
    CheckpointState,
    EpochAllocation,
    InputRange,
    PendingSinkState,
    db_now,
)

_CHECKPOINT_ATTEMPTS = 5


class SqlCheckpointTable:
    """``checkpoints.sources.CheckpointTable`` on the meta store's ``checkpoint_state`` table."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlCheckpointTable({self._db.url_for_display!r})"

    def range_reserved(self, sink_id: str, epoch: int) -> bool:
        """Whether the epoch's snapshot range is reserved: an incremental input's checkpoint
        (``checkpoints.sources``), kept in ``input_range``."""
        with self._db.transaction(f"reading the input range of sink {sink_id!r} epoch {epoch}", write=False) as session:
            return session.get(InputRange, (sink_id, epoch)) is not None

    def set_checkpoint(self, name: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None:
        """Record the upstream's word; COMPLETED and FAILED are final (see ``CheckpointStatus``)."""
        name, epoch = rows.checkpoint_name(name), check_epoch(epoch)
        status = rows.checkpoint_status(status)
        if detail is not None:
            detail = rows.text(detail, "checkpoint detail")
        action = f"setting checkpoint {name!r} epoch {epoch} to {status}"
        for attempt in range(_CHECKPOINT_ATTEMPTS):
            try:
                with self._db.transaction(action, write=True) as session:
                    statement = (
                        update(CheckpointState)
                        .where(
                            CheckpointState.name == name,
                            CheckpointState.epoch == epoch,
                            CheckpointState.status == CheckpointStatus.PENDING.value,
                        )
                        .values(status=status.value, detail=detail, updated_at=db_now())
                        .execution_options(synchronize_session=False)
                    )
                    if rows.rowcount(session, statement) == 1:
                        return
                    current = session.scalar(
                        select(CheckpointState.status).where(
                            CheckpointState.name == name, CheckpointState.epoch == epoch
                        )
                    )
                    if current is None:
                        session.execute(
                            insert(CheckpointState).values(
                                name=name,
                                epoch=epoch,
                                status=status.value,
                                detail=detail,
                                updated_at=db_now(),
                            )
                        )
                        return
                    if current == status.value:
                        return  # the same final word again
                    raise StateConflict(
                        f"checkpoint {name!r} epoch {epoch} is {current}, which is final: cannot set it to {status}"
                    )
            except IntegrityError:
                # Another writer inserted the row first: look again at what it says.
                if attempt == _CHECKPOINT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus:
        name, epoch = rows.checkpoint_name(name), check_epoch(epoch)
        with self._db.transaction(f"reading checkpoint {name!r} epoch {epoch}", write=False) as session:
            status = session.scalar(_status_query(), {"c_name": name, "c_epoch": epoch})
        return CheckpointStatus.PENDING if status is None else CheckpointStatus(status)


@functools.cache
def _status_query() -> Select[str]:
    """``get_checkpoint``'s query, built once: a sensor asks it at every poke, a commit once."""
    return select(CheckpointState.status).where(
        CheckpointState.name == bindparam("c_name"), CheckpointState.epoch == bindparam("c_epoch")
    )


@dataclass(frozen=True)
class Chain:
    """A sink's links, in chain order, and each linked epoch's row status (absent: no row)."""

    links: Sequence[Link]
    statuses: dict[int, EpochStatus]

    def status_of(self, epoch: int) -> EpochStatus | None:
        return self.statuses.get(epoch)


@dataclass(frozen=True)
class Reservation:
    """One epoch's reservation as the views show it: its link, the run that reserved it and when,
    and the DAG that wrote the epoch of the link before it (the sink's DAG, as far as the chain
    tells: a reservation keeps its run id only)."""

    sink_id: str
    epoch: int
    position: int
    range: SnapshotRange
    run_id: str | None
    reserved_at: datetime
    previous_dag_id: str | None = None


@dataclass(frozen=True)
class LaterLink:
    """A link after another in its sink's chain: its epoch, its row's status and DAG (``None``: no
    row), the run that reserved it and when."""

    epoch: int
    status: EpochStatus | None
    run_id: str | None
    dag_id: str | None
    reserved_at: datetime


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

    def reservation(self, sink_id: str, epoch: int) -> Reservation | None:
        """Epoch ``epoch``'s reservation, if it made one, by the primary key and the chain's index."""
        query = _with_previous().where(InputRange.sink_id == sink_id, InputRange.epoch == epoch)
        with self._db.transaction(f"reading the reservation of sink {sink_id!r} epoch {epoch}", write=False) as session:
            found = session.execute(query).first()
        return None if found is None else _reservation(found[0], found[1])

    def unsettled(self, sink_id: str | None = None) -> list[Reservation]:
        """The reservations no row settles yet: per sink, its newest link when its epoch has no row
        (``core.input_ranges`` lets no link follow an unsettled one, so there is at most one). The
        newest link of each sink comes from the ``(sink_id, position)`` index."""
        newest = select(InputRange.sink_id, func.max(InputRange.position).label("position")).group_by(
            InputRange.sink_id
        )
        if sink_id is not None:
            newest = newest.where(InputRange.sink_id == sink_id)
        last = newest.subquery()
        row = aliased(PendingSinkState)
        query = (
            _with_previous()
            .join(last, and_(last.c.sink_id == InputRange.sink_id, last.c.position == InputRange.position))
            .outerjoin(row, and_(row.sink_id == InputRange.sink_id, row.epoch == InputRange.epoch))
            .where(row.sink_id.is_(None))
            .order_by(InputRange.sink_id)
        )
        with self._db.transaction("reading the reservations no row settles", write=False) as session:
            return [_reservation(link, dag_id) for link, dag_id in session.execute(query).all()]

    def following(self, sink_id: str, position: int, limit: int = 50) -> list[LaterLink]:
        """The links after ``position``, in chain order, with their rows (at most ``limit``): which
        later epochs read the range of an aborted one again."""
        query = (
            select(InputRange, PendingSinkState.status, PendingSinkState.dag_id)
            .outerjoin(
                PendingSinkState,
                (PendingSinkState.sink_id == InputRange.sink_id) & (PendingSinkState.epoch == InputRange.epoch),
            )
            .where(InputRange.sink_id == sink_id, InputRange.position > position)
            .order_by(InputRange.position)
            .limit(limit)
        )
        with self._db.transaction(f"reading the input ranges of sink {sink_id!r}", write=False) as session:
            found = session.execute(query).all()
        return [
            LaterLink(
                int(link.epoch), None if status is None else EpochStatus(status), link.run_id, dag_id, link.reserved_at
            )
            for link, status, dag_id in found
        ]

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


def _with_previous() -> Select[InputRange, str | None]:
    """Links with the DAG of the row of the link before each (by the ``(sink_id, position)`` index)."""
    previous = aliased(InputRange)
    row = aliased(PendingSinkState)
    return (
        select(InputRange, row.dag_id)
        .outerjoin(previous, and_(previous.sink_id == InputRange.sink_id, previous.position == InputRange.position - 1))
        .outerjoin(row, and_(row.sink_id == previous.sink_id, row.epoch == previous.epoch))
    )


def _reservation(link: InputRange, previous_dag_id: str | None) -> Reservation:
    return Reservation(
        sink_id=link.sink_id,
        epoch=int(link.epoch),
        position=int(link.position),
        range=_range(link),
        run_id=link.run_id,
        reserved_at=link.reserved_at,
        previous_dag_id=previous_dag_id,
    )


def _range(row: InputRange) -> SnapshotRange:
    return SnapshotRange(table=row.source, after_snapshot_id=row.after_snapshot_id, to_snapshot_id=row.to_snapshot_id)


_ALLOCATION_ATTEMPTS = 50


class SqlEpochAllocator:
    """``runtime.run_epochs.EpochAllocator`` on the meta store's ``epoch_allocation`` table, keyed by (sink, run id)."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlEpochAllocator({self._db.url_for_display!r})"

    def allocate_epoch(self, sink_id: str, run_id: str) -> int:
        """The epoch of a DAG run without a data interval: the same for that run forever.

        New epochs follow the database clock in milliseconds (like interval-derived ones), and stay
        strictly increasing per sink even when the clock does not.
        """
        run_id = rows.run_id(run_id)
        action = f"allocating an epoch for sink {sink_id!r} run {run_id!r}"
        for attempt in range(_ALLOCATION_ATTEMPTS):
            try:
                with self._db.transaction(action, write=True) as session:
                    existing = session.scalar(
                        select(EpochAllocation.epoch).where(
                            EpochAllocation.sink_id == sink_id, EpochAllocation.run_id == run_id
                        )
                    )
                    if existing is not None:
                        return int(existing)
                    now_ms = epoch_from_interval_start(rows.database_now(session))
                    last = session.scalar(
                        select(func.max(EpochAllocation.epoch)).where(EpochAllocation.sink_id == sink_id)
                    )
                    epoch = check_epoch(now_ms if last is None else max(now_ms, int(last) + 1))
                    session.execute(insert(EpochAllocation).values(sink_id=sink_id, run_id=run_id, epoch=epoch))
                    return epoch
            except IntegrityError:
                # A concurrent caller took this epoch (or allocated for this run): draw again.
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise MetaStoreUnavailable(
            f"meta store {self._db.url_for_display}: {action} lost the race {_ALLOCATION_ATTEMPTS} times; try again"
        )
