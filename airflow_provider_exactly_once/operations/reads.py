"""What an operator can see of the sinks and their epochs: the reads both ``eo-sink`` and the UI call.

Reads are the store's indexed queries (``store/queries.py``), paginated. A caller that may read
only some DAGs passes their ids as ``dag_ids``: the filter is part of the query, so a page holds
``limit`` rows the caller may read (never a short page with hidden rows counted out of it), and a
sink's counts are of those rows only; what another DAG left in an epoch they may read is redacted
(``views.Redaction``). ``dag_ids=None`` reads everything, epochs written outside any DAG run included.

A row whose stored write does not parse is shown as unreadable, with why (``EpochView.unreadable``),
in a listing and on its own: it never breaks a page.

Every location and message in what is returned has its credentials masked (``core.redact``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.bookkeeping import require_epoch
from airflow_provider_exactly_once.core.errors import EpochNotFound, ExactlyOnceError
from airflow_provider_exactly_once.core.history import Actor, ActorKind
from airflow_provider_exactly_once.core.identifiers import EPOCH_MAX, check_epoch
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.operations.views import (
    CheckpointView,
    EpochView,
    HistoryView,
    Redaction,
    RevisionView,
    SinkSummary,
)
from airflow_provider_exactly_once.runtime.assembly import checkpoint_source
from airflow_provider_exactly_once.store import SqlSinkStateStore
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
from airflow_provider_exactly_once.store.revisions import RevisionRecord


class SinkNotFound(EpochNotFound):
    """No sink of that id is registered (and, for reads, none has rows either).

    A subclass of ``EpochNotFound`` so that every "no such thing" maps to the same answer (HTTP 404,
    CLI exit 1) wherever errors are mapped by class.
    """


class InvalidRequest(ExactlyOnceError, ValueError):
    """An argument of an operations call that cannot be accepted (a page size, a grace period, a reason)."""


def _status(status: EpochStatus | str | None) -> EpochStatus | None:
    """An epoch status as the UI's query string or the CLI gives it, in any case (``pending``, ``Pending``)."""
    if status is None or isinstance(status, EpochStatus):
        return status
    for known in EpochStatus:
        if str(status).strip().lower() == known.value.lower():
            return known
    raise InvalidRequest(f"epoch status {status!r} is not one of {[s.value for s in EpochStatus]}")


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
        shown = set(counts) if visible is not None else set(registered) | set(counts)
        return [_summary(sink_id, registered.get(sink_id), counts.get(sink_id)) for sink_id in sorted(shown)]

    def sink(self, sink_id: str, *, dag_ids: Collection[str] | None = None) -> SinkSummary:
        """One sink's summary; ``SinkNotFound`` when it is neither registered nor has rows (visible ones)."""
        visible = _dag_ids(dag_ids)
        registration = self.store.registry.registered_sink(sink_id)
        count = sink_counts(self.store, sink_id, dag_ids=visible).get(sink_id)
        if count is None and (registration is None or visible is not None):
            raise SinkNotFound(f"sink {sink_id!r} is unknown: it is not registered and has no epochs")
        return _summary(sink_id, registration, count)

    def epochs(
        self,
        *,
        sink_id: str | None = None,
        status: EpochStatus | str | None = None,
        limit: int = 100,
        offset: int = 0,
        dag_ids: Collection[str] | None = None,
    ) -> list[EpochView]:
        """A page of epochs, newest epoch first; with ``dag_ids``, of those DAGs only."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= EPOCH_MAX:
            raise InvalidRequest(f"offset must be an integer from 0 to {EPOCH_MAX}, got {offset!r}")
        visible = _dag_ids(dag_ids)
        records = list_epochs(
            self.store, sink_id=sink_id, status=_status(status), limit=limit, offset=offset, dag_ids=visible
        )
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

    def epoch_count(
        self,
        *,
        sink_id: str | None = None,
        status: EpochStatus | str | None = None,
        dag_ids: Collection[str] | None = None,
    ) -> int:
        """How many epochs ``epochs`` pages through with the same filters (for a pager's total)."""
        return count_epochs(self.store, sink_id=sink_id, status=_status(status), dag_ids=_dag_ids(dag_ids))

    def epoch(self, sink_id: str, epoch: int, *, dag_ids: Collection[str] | None = None) -> EpochView:
        """One epoch; ``EpochNotFound`` (naming sink and epoch) when it has no row. With ``dag_ids``
        (the DAGs the caller may read, that of the epoch among them), redacted for them."""
        record = self._readable_row(sink_id, epoch)
        cleanups = cleanup_counts(self.store, [(sink_id, epoch)]).get((sink_id, epoch), 0)
        revised = self._revisions(record)
        runs = self.store.runs.lookup([(record.dag_id, record.run_id), *((r.dag_id, r.run_id) for r in revised)])
        run = runs.get((record.dag_id or "", record.run_id or ""))
        view = EpochView.read(record, now=self.store.now(), pending_cleanups=cleanups, run=run)
        revisions = tuple(RevisionView.of(r, runs.get((r.dag_id or "", r.run_id or ""))) for r in revised)
        view = replace(view, revisions=revisions)
        visible = _dag_ids(dag_ids)
        if visible is None:
            return view
        events = self.store.history.events(sink_id, epoch)
        return self._redaction(visible, record, revised, [e.actor for e in events]).epoch(view)

    def history(self, sink_id: str, epoch: int, *, dag_ids: Collection[str] | None = None) -> list[HistoryView]:
        """The epoch's history, oldest first; ``EpochNotFound`` when it has neither a row nor a history.
        With ``dag_ids`` (the DAGs the caller may read, that of the epoch among them), redacted for them."""
        check_epoch(epoch)
        entries = self.store.history.events(sink_id, epoch)
        if not entries:
            self._row(sink_id, epoch)  # no row either: never persisted
            return []
        runs = self.store.runs.lookup([(e.actor.dag_id, e.actor.run_id) for e in entries])
        events = [HistoryView.of(e, runs.get((e.actor.dag_id or "", e.actor.run_id or ""))) for e in entries]
        visible = _dag_ids(dag_ids)
        if visible is None:
            return events
        record = self._readable_row(sink_id, epoch)
        redaction = self._redaction(visible, record, self._revisions(record), [e.actor for e in entries])
        return [redaction.event(e) for e in events]

    def dag_of(self, sink_id: str, epoch: int) -> str | None:
        """The DAG that wrote the epoch (``None``: outside any DAG run); ``EpochNotFound`` when it has no row.

        The cheapest look at an epoch: a caller deciding whether a user may see it asks this first.
        """
        check_epoch(epoch)
        found = epoch_dag(self.store, sink_id, epoch)
        if found is None:
            raise EpochNotFound(f"sink {sink_id!r} epoch {epoch} was never persisted")
        return found[0]

    def checkpoint(self, sink_id: str, epoch: int) -> CheckpointView:
        """The registered checkpoint source's status for the epoch, or why it could not be read."""
        check_epoch(epoch)
        registration = self.store.registry.registered_sink(sink_id)
        if registration is None:
            raise SinkNotFound(f"sink {sink_id!r} is not in the sink registry: its checkpoint source is unknown")
        checkpoint = registration[1]
        kind = str((checkpoint or {}).get("kind", MetaStoreCheckpoint.kind))
        try:
            config = MetaStoreCheckpoint() if checkpoint is None else checkpoint_config_from_dict(checkpoint)
            status = checkpoint_source(config, self.store.checkpoints).status(sink_id, epoch)
        except Exception as exc:  # a source that cannot answer (or be built) is shown, not raised: it is a view
            return CheckpointView(sink_id, epoch, None, mask_userinfo(f"{type(exc).__name__}: {exc}"), kind)
        return CheckpointView(sink_id, epoch, status.value, None, kind)

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


def _run_of(dag_id: str | None, run_id: str | None) -> Actor:
    """A run that wrote an epoch's row or a revision of it, as the history would name it."""
    return Actor(ActorKind.TASK, dag_id=dag_id, run_id=run_id)


def _summary(
    sink_id: str, registration: tuple[dict[str, Any], dict[str, Any] | None] | None, count: SinkCounts | None
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
    )


__all__ = ["InvalidRequest", "SinkNotFound", "SinkReads"]
