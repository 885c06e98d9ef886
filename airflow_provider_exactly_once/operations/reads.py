"""What an operator can see of the sinks and their epochs: the reads both ``eo-sink`` and the UI call.

Reads are the store's indexed queries, paginated, with a caller's readable DAGs (``dag_ids``) part of
the query, so a page never hides rows it counted; a row whose write does not parse is shown as
unreadable, never breaking a page, and an epoch without a row (``RESERVED``, ``UNPERSISTED``) is shown
from its reservation or its failures. Every location and message returned is masked (``core.errors``).
What the views show: docs/ui.md and docs/cli.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Literal

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.coordinator import require_epoch
from airflow_provider_exactly_once.core.epochs import (
    EPOCH_MAX,
    Actor,
    ActorKind,
    EpochStatus,
    HistoryEntry,
    check_epoch,
)
from airflow_provider_exactly_once.core.errors import EpochNotFound, ExactlyOnceError, mask_userinfo
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.operations.views import (
    RESERVED,
    CheckpointView,
    EpochView,
    HistoryView,
    Redaction,
    ReservationView,
    RevisionView,
    SinkSummary,
    cause_of,
    reading_again,
)
from airflow_provider_exactly_once.runtime.assembly import checkpoint_source
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.epoch_inputs import LaterLink, Reservation
from airflow_provider_exactly_once.store.history import RevisionRecord
from airflow_provider_exactly_once.store.queries import (
    MAX_PAGE,
    UNPARSABLE,
    SinkCounts,
    UnreadableEpoch,
    acting_runs,
    cleanup_counts,
    count_epochs,
    epoch_dag,
    list_epochs,
    sink_counts,
    unreadable_epoch,
)

#: A status a listing can be filtered by: a row's, or ``RESERVED`` (a reservation without a row).
Status = EpochStatus | Literal["Reserved"]


class SinkNotFound(EpochNotFound):
    """No sink of that id is registered (and, for reads, none has rows either).

    A subclass of ``EpochNotFound`` so that every "no such thing" maps to the same answer (HTTP 404,
    CLI exit 1) wherever errors are mapped by class.
    """


class InvalidRequest(ExactlyOnceError, ValueError):
    """An argument of an operations call that cannot be accepted (a page size, a grace period, a reason)."""


def _status(status: EpochStatus | str | None) -> Status | None:
    """An epoch status as the UI's query string or the CLI gives it, in any case (``pending``,
    ``Pending``); ``Reserved`` too, the state of an epoch with a reserved range and no row."""
    if status is None or isinstance(status, EpochStatus):
        return status
    for known in EpochStatus:
        if str(status).strip().lower() == known.value.lower():
            return known
    if str(status).strip().lower() == RESERVED.lower():
        return RESERVED
    raise InvalidRequest(f"epoch status {status!r} is not one of {[*(s.value for s in EpochStatus), RESERVED]}")


def _row_status(status: Status | None) -> EpochStatus | None:
    return status if isinstance(status, EpochStatus) else None


def _order(view: EpochView) -> tuple[int, str]:
    """A listing's order, newest epoch first, then by sink id descending (``list_epochs``')."""
    return (view.epoch, view.sink_id)


def _dag_ids(dag_ids: Collection[str] | None) -> frozenset[str] | None:
    return None if dag_ids is None else frozenset(dag_ids)


class SinkReads:
    """Views of the sinks and their epochs over one meta store (the caller disposes of it)."""

    def __init__(self, store: SqlSinkStateStore) -> None:
        self.store = store

    def sinks(self, *, dag_ids: Collection[str] | None = None) -> list[SinkSummary]:
        """Every registered sink and every sink with rows, by sink id.

        With ``dag_ids``, only the sinks with epochs of those DAGs, counted over those epochs: a
        sink none of whose epochs the caller may read is not shown at all.
        """
        visible = _dag_ids(dag_ids)
        registered = {
            sink_id: (sink, checkpoint) for sink_id, sink, checkpoint in self.store.registry.registered_sinks()
        }
        counts = sink_counts(self.store, dag_ids=visible)
        reserved = _per_sink(self._reserved(None, visible))
        shown = set(counts) | set(reserved) | (set(registered) if visible is None else set())
        return [
            _summary(sink_id, registered.get(sink_id), counts.get(sink_id), reserved.get(sink_id, 0))
            for sink_id in sorted(shown)
        ]

    def sink(self, sink_id: str, *, dag_ids: Collection[str] | None = None) -> SinkSummary:
        """One sink's summary; ``SinkNotFound`` when it is neither registered nor has rows (visible ones)."""
        visible = _dag_ids(dag_ids)
        registration = self.store.registry.registered_sink(sink_id)
        count = sink_counts(self.store, sink_id, dag_ids=visible).get(sink_id)
        reserved = len(self._reserved(sink_id, visible))
        if count is None and not reserved and (registration is None or visible is not None):
            raise SinkNotFound(f"sink {sink_id!r} is unknown: it is not registered and has no epochs")
        return _summary(sink_id, registration, count, reserved)

    def epochs(
        self,
        *,
        sink_id: str | None = None,
        status: EpochStatus | str | None = None,
        limit: int = 100,
        offset: int = 0,
        dag_ids: Collection[str] | None = None,
    ) -> list[EpochView]:
        """A page of epochs, newest epoch first; with ``dag_ids``, of those DAGs only. The epochs with a
        reserved range and no row (``RESERVED``, at most one a sink) are placed among the rows."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= EPOCH_MAX:
            raise InvalidRequest(f"offset must be an integer from 0 to {EPOCH_MAX}, got {offset!r}")
        visible = _dag_ids(dag_ids)
        state = _status(status)
        reserved = [] if isinstance(state, EpochStatus) else self._reserved(sink_id, visible)
        if state == RESERVED:
            return reserved[offset : offset + limit]
        # The rows from where the reserved epochs (all at hand) may move them onto this page: the
        # merged page is then exact whatever the offset (a reserved epoch before the rows read is
        # on an earlier page, one after the last read on a later one).
        skip = max(0, offset - len(reserved))
        rows = self._rows(sink_id, _row_status(state), offset + limit - skip, skip, visible)
        merged = sorted([*rows, *reserved], key=_order, reverse=True)
        return merged[offset - skip : offset - skip + limit]

    def _rows(
        self,
        sink_id: str | None,
        status: EpochStatus | None,
        limit: int,
        offset: int,
        visible: frozenset[str] | None,
    ) -> list[EpochView]:
        records = list_epochs(self.store, sink_id=sink_id, status=status, limit=limit, offset=offset, dag_ids=visible)
        if not records:
            return []
        now = self.store.now()
        cleanups = cleanup_counts(self.store, [(r.sink_id, r.epoch) for r in records])
        runs = self.store.runs.lookup([(r.dag_id, r.run_id) for r in records])
        views = [
            EpochView.read(
                r,
                now=now,
                pending_cleanups=cleanups.get((r.sink_id, r.epoch), 0),
                run=runs.get((r.dag_id or "", r.run_id or "")),
            )
            for r in records
        ]
        if visible is None:
            return views
        # Only a row's texts can name another DAG: the history of the rows that carry one tells which.
        acting = acting_runs(self.store, [(v.sink_id, v.epoch) for v in views if v.error or v.warning])
        return [
            Redaction.of(visible, [*acting.get((v.sink_id, v.epoch), ()), _run_of(v.dag_id, v.run_id)]).epoch(v)
            for v in views
        ]

    def reserved_epochs(self, *, sink_id: str | None = None, dag_ids: Collection[str] | None = None) -> list[EpochView]:
        """The epochs with a reserved range and no row (``RESERVED``), newest first."""
        return self._reserved(sink_id, _dag_ids(dag_ids))

    def _reserved(self, sink_id: str | None, visible: frozenset[str] | None) -> list[EpochView]:
        """The ``RESERVED`` epochs (of ``visible`` DAGs only), newest first: a few reads per sink
        that has one, nothing per epoch of its history."""
        found = self.store.input_ranges.unsettled(sink_id)
        if not found:
            return []
        now = self.store.now()
        histories = {(r.sink_id, r.epoch): self.store.history.events(r.sink_id, r.epoch) for r in found}
        dags = {(r.sink_id, r.epoch): _reserving_dag(r, histories[(r.sink_id, r.epoch)]) for r in found}
        runs = self.store.runs.lookup([(dags[(r.sink_id, r.epoch)], r.run_id) for r in found])
        views = []
        for r in found:
            key = (r.sink_id, r.epoch)
            dag_id = dags[key]
            if visible is not None and dag_id not in visible:
                continue
            view = EpochView.unwritten(
                r.sink_id,
                r.epoch,
                now=now,
                reservation=r,
                entries=histories[key],
                dag_id=dag_id,
                run=runs.get((dag_id or "", r.run_id or "")),
            )
            if visible is not None:
                view = Redaction.of(visible, [*(e.actor for e in histories[key]), _run_of(dag_id, r.run_id)]).epoch(
                    view
                )
            views.append(view)
        return sorted(views, key=_order, reverse=True)

    def epoch_count(
        self,
        *,
        sink_id: str | None = None,
        status: EpochStatus | str | None = None,
        dag_ids: Collection[str] | None = None,
    ) -> int:
        """How many epochs ``epochs`` pages through with the same filters (for a pager's total)."""
        visible, state = _dag_ids(dag_ids), _status(status)
        reserved = 0 if isinstance(state, EpochStatus) else len(self._reserved(sink_id, visible))
        if state == RESERVED:
            return reserved
        return reserved + count_epochs(self.store, sink_id=sink_id, status=_row_status(state), dag_ids=visible)

    def epoch(self, sink_id: str, epoch: int, *, dag_ids: Collection[str] | None = None) -> EpochView:
        """One epoch, a row's or one without (``RESERVED``, ``UNPERSISTED``); ``EpochNotFound``
        (naming sink and epoch) when it has neither a row, nor a reservation, nor a history. With
        ``dag_ids`` (the DAGs the caller may read, that of the epoch among them), redacted for them."""
        check_epoch(epoch)
        entries = self.store.history.events(sink_id, epoch)
        reserved = self.store.input_ranges.reservation(sink_id, epoch)
        visible = _dag_ids(dag_ids)
        try:
            record = self._readable_row(sink_id, epoch)
        except EpochNotFound:
            view = self._unwritten(sink_id, epoch, entries, reserved)
            if visible is None:
                return view
            return Redaction.of(visible, [*(e.actor for e in entries), _run_of(view.dag_id, view.run_id)]).epoch(view)
        cleanups = cleanup_counts(self.store, [(sink_id, epoch)]).get((sink_id, epoch), 0)
        revised = self._revisions(record)
        runs = self.store.runs.lookup([(record.dag_id, record.run_id), *((r.dag_id, r.run_id) for r in revised)])
        run = runs.get((record.dag_id or "", record.run_id or ""))
        view = EpochView.read(record, now=self.store.now(), pending_cleanups=cleanups, run=run)
        revisions = tuple(RevisionView.of(r, runs.get((r.dag_id or "", r.run_id or ""))) for r in revised)
        view = view.model_copy(
            update={
                "revisions": revisions,
                "cause": cause_of(entries, view.error, view.status),
                "reservation": self._reservation(reserved, view.status),
            }
        )
        if view.consumed is None and reserved is not None and not view.unreadable:
            # A write that never persisted (its tombstone) read nothing, but reserved its range.
            view = view.model_copy(update={"consumed": view.reservation.range if view.reservation else None})
        if visible is None:
            return view
        return self._redaction(visible, record, revised, [e.actor for e in entries]).epoch(view)

    def history(self, sink_id: str, epoch: int, *, dag_ids: Collection[str] | None = None) -> list[HistoryView]:
        """The epoch's history, oldest first, with what the chain of reservations says of an aborted
        epoch's range (``RANGE_READ_AGAIN``); ``EpochNotFound`` when it has neither a row, nor a
        reservation, nor a history. With ``dag_ids`` (the DAGs the caller may read, that of the
        epoch among them), redacted for them."""
        check_epoch(epoch)
        entries = self.store.history.events(sink_id, epoch)
        reserved = self.store.input_ranges.reservation(sink_id, epoch)
        try:
            record: EpochRecord | UnreadableEpoch | None = self._readable_row(sink_id, epoch)
        except EpochNotFound:
            if not entries and reserved is None:
                raise
            record = None
        runs = self.store.runs.lookup([(e.actor.dag_id, e.actor.run_id) for e in entries])
        events = [HistoryView.of(e, runs.get((e.actor.dag_id or "", e.actor.run_id or ""))) for e in entries]
        later = self._later(reserved, None if record is None else record.status.value)
        if reserved is not None and later:
            shown = ReservationView.of(reserved, later)
            events = sorted([*events, *(HistoryView.range_read_again(link, shown) for link in later)], key=_at)
        visible = _dag_ids(dag_ids)
        if visible is None:
            return events
        acting = [e.actor for e in entries]
        if record is None:
            dag_id = _reserving_dag(reserved, entries) if reserved is not None else None
            redaction = Redaction.of(visible, [*acting, _run_of(dag_id, None if reserved is None else reserved.run_id)])
        else:
            redaction = self._redaction(visible, record, self._revisions(record), acting)
        return [redaction.event(e) for e in events]

    def dag_of(self, sink_id: str, epoch: int) -> str | None:
        """The DAG that wrote the epoch (``None``: outside any DAG run); ``EpochNotFound`` when it has
        neither a row, nor a reservation, nor a history.

        The cheapest look at an epoch: a caller deciding whether a user may see it asks this first.
        """
        check_epoch(epoch)
        found = epoch_dag(self.store, sink_id, epoch)
        if found is not None:
            return found[0]
        entries = self.store.history.events(sink_id, epoch)
        return self._unwritten(sink_id, epoch, entries, self.store.input_ranges.reservation(sink_id, epoch)).dag_id

    def _unwritten(
        self, sink_id: str, epoch: int, entries: Sequence[HistoryEntry], reserved: Reservation | None
    ) -> EpochView:
        """The view of an epoch without a row; ``EpochNotFound`` when nothing of it is recorded."""
        if reserved is None and not entries:
            raise EpochNotFound(
                f"sink {sink_id!r} epoch {epoch} was never persisted: it has no row, no reserved range and no history"
            )
        dag_id = _reserving_dag(reserved, entries)
        run_id = reserved.run_id if reserved is not None else None
        run = self.store.runs.lookup([(dag_id, run_id)]).get((dag_id or "", run_id or ""))
        return EpochView.unwritten(
            sink_id, epoch, now=self.store.now(), reservation=reserved, entries=entries, dag_id=dag_id, run=run
        )

    def _reservation(self, reserved: Reservation | None, status: str | None) -> ReservationView | None:
        """An epoch's reservation as shown, with the later epochs that read its range again."""
        return None if reserved is None else ReservationView.of(reserved, self._later(reserved, status))

    def _later(self, reserved: Reservation | None, status: str | None) -> list[LaterLink]:
        """For an Aborted epoch (or one without a row), the later epochs that read its range again."""
        if reserved is None or status not in (None, EpochStatus.ABORTED.value):
            return []
        return reading_again(self.store.input_ranges.following(reserved.sink_id, reserved.position))

    def checkpoint(self, sink_id: str, epoch: int) -> CheckpointView:
        """The registered checkpoint source's status for the epoch, or why it could not be read."""
        check_epoch(epoch)
        registration = self.store.registry.registered_sink(sink_id)
        if registration is None:
            raise SinkNotFound(f"sink {sink_id!r} is not in the sink registry: its checkpoint source is unknown")
        checkpoint = registration[1]
        kind = str((checkpoint or {}).get("kind", MetaStoreCheckpoint().kind))
        try:
            config = MetaStoreCheckpoint() if checkpoint is None else checkpoint_config_from_dict(checkpoint)
            status = checkpoint_source(config, self.store.checkpoints).status(sink_id, epoch)
        except Exception as exc:  # a source that cannot answer (or be built) is shown, not raised: it is a view
            return CheckpointView(
                sink_id=sink_id,
                epoch=epoch,
                status=None,
                detail=mask_userinfo(f"{type(exc).__name__}: {exc}"),
                source=kind,
            )
        return CheckpointView(sink_id=sink_id, epoch=epoch, status=status.value, detail=None, source=kind)

    def _row(self, sink_id: str, epoch: int) -> EpochRecord:
        return require_epoch(self.store, sink_id, epoch)

    def _readable_row(self, sink_id: str, epoch: int) -> EpochRecord | UnreadableEpoch:
        """The epoch's row, or its own columns when its stored write does not parse."""
        check_epoch(epoch)
        try:
            return self._row(sink_id, epoch)
        except UNPARSABLE as exc:
            unreadable = unreadable_epoch(self.store, sink_id, epoch, exc)
            if unreadable is None:  # no such row: the refusal was of the sink id, say
                raise
            return unreadable

    def _revisions(self, record: EpochRecord | UnreadableEpoch) -> Sequence[RevisionRecord]:
        """The epoch's revisions; none for a row whose write does not parse (they are read with it)."""
        return (
            () if isinstance(record, UnreadableEpoch) else self.store.revisions.revisions(record.sink_id, record.epoch)
        )

    @staticmethod
    def _redaction(
        visible: frozenset[str],
        record: EpochRecord | UnreadableEpoch,
        revised: Sequence[RevisionRecord],
        acting: Sequence[Actor],
    ) -> Redaction:
        revisions = [_run_of(r.dag_id, r.run_id) for r in revised]
        return Redaction.of(visible, [*acting, *revisions, _run_of(record.dag_id, record.run_id)])


def _reserving_dag(reserved: Reservation | None, entries: Sequence[HistoryEntry]) -> str | None:
    """The DAG of an epoch without a row: the one the failures of its reserving run name (of any
    run, without a reservation), else the one that wrote the sink's epoch before it in the chain."""
    run_id = None if reserved is None else reserved.run_id
    named = [e.actor.dag_id for e in entries if e.actor.dag_id and (run_id is None or e.actor.run_id == run_id)]
    if named:
        return named[-1]
    return None if reserved is None else reserved.previous_dag_id


def _at(view: HistoryView) -> datetime:
    return view.at


def _per_sink(views: Sequence[EpochView]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for view in views:
        counts[view.sink_id] = counts.get(view.sink_id, 0) + 1
    return counts


def _run_of(dag_id: str | None, run_id: str | None) -> Actor:
    """A run that wrote an epoch's row or a revision of it, as the history would name it."""
    return Actor(ActorKind.TASK, dag_id=dag_id, run_id=run_id)


def _summary(
    sink_id: str,
    registration: tuple[dict[str, Any], dict[str, Any] | None] | None,
    count: SinkCounts | None,
    reserved: int = 0,
) -> SinkSummary:
    sink, checkpoint = registration or ({}, None)
    count = count or SinkCounts(sink_id)
    root = sink.get("root")
    return SinkSummary(
        sink_id=sink_id,
        kind=sink.get("kind"),
        tables=tuple(sink.get("tables", ())),
        root=None if root is None else mask_userinfo(str(root)),
        registered=registration is not None,
        checkpoint=None if checkpoint is None else checkpoint.get("kind"),
        pending=count.pending,
        committed=count.committed,
        aborted=count.aborted,
        oldest_pending_created_at=count.oldest_pending_created_at,
        pending_cleanups=count.pending_cleanups,
        reserved=reserved,
    )


__all__ = ["InvalidRequest", "SinkNotFound", "SinkReads"]
