"""What the operations service returns: frozen pydantic records, shown as ``model_dump(mode="json")``.

The CLI prints them as tables or JSON and the UI's API returns that dump as is, so both show the
same numbers under the same names. Times are timezone-aware UTC (the meta store's clock) and become
ISO 8601 strings in UTC in the dump. Locations and messages are masked (``core.errors``) as the records
are made, so no door that shows one can forget to; control characters are left for each door to
escape in its own way (JSON escapes them, the CLI's tables show them as ``\x1b``). What of an epoch
a caller who may read only some DAGs is shown is decided here too, once (``Redaction``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    computed_field,
    field_serializer,
    field_validator,
    model_serializer,
)

from airflow_provider_exactly_once.core.epochs import (
    Actor,
    ActorKind,
    AuditStage,
    EpochAudit,
    EpochStatus,
    HistoryEntry,
    failed_step,
    task_of,
)
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, mask_userinfo
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.observability import urls
from airflow_provider_exactly_once.store.epoch_inputs import LaterLink, Reservation
from airflow_provider_exactly_once.store.queries import (
    UNPARSABLE,
    UnreadableEpoch,
    unparsable_reason,
    validation_faults,
)
from airflow_provider_exactly_once.store.registry import RunDates

#: The state of an epoch that reserved its upstream range (``core.input_ranges``) and has no row:
#: its write has not persisted (it runs, it failed, or its run was killed), and the sink's next
#: epoch waits until it is settled (``eo-sink abort`` settles one that will never finish).
RESERVED: Literal["Reserved"] = "Reserved"
#: The state of an epoch with neither a row nor a reservation whose history holds a failed task
#: (a write that failed before its persist, design.md D22): nothing of it was persisted.
UNPERSISTED = "Unpersisted"
#: The history's account of a later epoch reading an aborted epoch's range again: not a stored
#: event (nothing happened to this epoch), said from the chain of reservations.
RANGE_READ_AGAIN = "range read again"


def _masked(value: Any) -> Any:
    """``value`` with every string in it (keys of mappings too) masked, for a report of any shape."""
    if isinstance(value, str):
        return mask_userinfo(value)
    if isinstance(value, Mapping):
        return {_masked(k): _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


#: A time shown in UTC, ISO 8601 (``2024-06-01T00:00:00+00:00``), as every door shows it.
Utc = Annotated[datetime, PlainSerializer(_iso, when_used="json")]
#: Seconds shown to the millisecond.
Seconds = Annotated[float, PlainSerializer(lambda value: round(value, 3), when_used="json")]


class View(BaseModel):
    """A record a door shows: frozen, its JSON form ``model_dump(mode="json")``."""

    model_config = ConfigDict(frozen=True, serialize_by_alias=True)

    #: A computed field shown after the key it follows rather than last, where doors always showed it.
    shown_after: ClassVar[dict[str, str]] = {}

    @model_serializer(mode="wrap")
    def _in_place(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name, after in self.shown_after.items():
            value = data.pop(name)
            keys = list(data)
            at = keys.index(after) + 1
            data = {**{k: data[k] for k in keys[:at]}, name: value, **{k: data[k] for k in keys[at:]}}
        return data


def interval_start(epoch: int) -> datetime | None:
    """The data-interval start an interval-derived epoch stands for (ms since the Unix epoch).

    Run-keyed and custom epochs are numbers too; a value outside the calendar gives ``None``.
    """
    try:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch)
    except OverflowError:
        return None


class SinkSummary(View):
    """One sink: how to find its data, and its epochs by status."""

    sink_id: str
    #: ``"iceberg"`` or ``"files"``; ``None`` for a sink with rows but no registration (its
    #: coordinator cannot be rebuilt, so no action can be taken on it from here).
    kind: str | None
    tables: tuple[str, ...]
    root: str | None
    registered: bool
    #: The checkpoint source's kind as registered (``None``: the meta-store checkpoint table).
    checkpoint: str | None
    pending: int = Field(exclude=True)
    committed: int = Field(exclude=True)
    aborted: int = Field(exclude=True)
    oldest_pending_created_at: Utc | None
    #: Queued clean-ups not yet done: writes whose files still have to go.
    pending_cleanups: int
    #: Epochs with a reserved range and no row yet (``RESERVED``).
    reserved: int = 0

    shown_after = {"counts": "checkpoint"}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """Its epochs by status."""
        return {"pending": self.pending, "committed": self.committed, "aborted": self.aborted}


def change_counts(table: TableWrite) -> dict[str, int] | None:
    """What an upsert write does to its table, as the operator reads it; ``None`` for an append."""
    if table.changes is None:
        return None
    return {
        "inserted": table.changes.inserted,
        "updated": table.changes.updated,
        "deleted": table.changes.deleted,
        "deletes_of_absent_keys": table.changes.deletes_of_absent_keys,
        "files_rewritten": len(table.rewritten),
    }


class TableView(View):
    """One table (or file-sink root) of an epoch's write."""

    name: str
    files: int
    rows: int
    bytes: int
    #: The snapshot id that made the epoch visible, ``"empty"`` (nothing to add), or ``None`` (not committed).
    snapshot: str | None
    #: The table's UUID when the epoch was committed (which incarnation holds it), else ``None``.
    table_uuid: str | None = None
    #: An upsert write's rows inserted, updated and deleted (and files rewritten); ``None`` for an append.
    changes: dict[str, int] | None = None


def _log_url(
    base_url: str | None, dag_id: str | None, run_id: str | None, task_id: str | None, try_number: int | None
) -> str | None:
    """The failed task's log in Airflow (``urls.task_log``), when the door knows where Airflow is
    and the task is named: never for a task of a DAG hidden from the caller (its run is gone)."""
    if base_url is None or not dag_id or dag_id == ANOTHER_DAG or not run_id or not task_id:
        return None
    return urls.task_log(base_url, dag_id, run_id, task_id, try_number)


class FailureView(View):
    """A failed try of a task of the epoch's group (design.md D22), as ``core.epochs.failed_step``
    says it (``write failed on try 2: ...``), with the task, its run and try, and its log in Airflow
    once a door that knows where Airflow is links it (``linked``)."""

    at: Utc
    step: str
    dag_id: str | None
    run_id: str | None
    task_id: str | None
    try_number: int | None
    log_url: str | None = None

    @classmethod
    def of(cls, entry: HistoryEntry) -> FailureView | None:
        step = failed_step(entry)
        if step is None:
            return None
        actor = entry.actor
        return cls(
            at=entry.at,
            step=mask_userinfo(step),
            dag_id=actor.dag_id,
            run_id=actor.run_id,
            task_id=task_of(actor),
            try_number=actor.try_number,
        )

    def linked(self, base_url: str | None, live: Collection[tuple[str, str]] | None = None) -> FailureView:
        """With the task's log at ``base_url`` (of runs in ``live`` only, when given)."""
        if live is not None and (self.dag_id, self.run_id) not in live:
            return self
        return self.model_copy(
            update={"log_url": _log_url(base_url, self.dag_id, self.run_id, self.task_id, self.try_number)}
        )


def cause_of(entries: Sequence[HistoryEntry], error: str | None, status: str) -> FailureView | None:
    """The failed try that explains the epoch's shown error: the failure whose reason (or whose
    ``failed_step`` sentence, which an abort's reason is) the error is; for an epoch without a row,
    its newest failure. ``None`` when the error is no task's (a commit's, an operator's abort)."""
    failures = [(entry, view) for entry in entries if (view := FailureView.of(entry)) is not None]
    if status in (RESERVED, UNPERSISTED):
        return failures[-1][1] if failures else None
    if not error:
        return None
    for entry, view in reversed(failures):
        if mask_userinfo(entry.reason or "") == error or view.step == error:
            return view
    return None


class ReservationView(View):
    """The upstream range an incremental epoch reserved before its write (``core.input_ranges``):
    the range, its place in the sink's chain, the run that reserved it; for an epoch aborted or
    left without a row, the later epochs that read its range again (each aborted but the last)."""

    table: str
    after_snapshot_id: int | None
    to_snapshot_id: int | None
    range: str
    position: int
    run_id: str | None
    reserved_at: Utc
    #: ``(epoch, status)`` of the later epochs that read this range again, in chain order, up to
    #: the first that is not Aborted (``"Reserved"`` for one without a row).
    read_again_by: tuple[tuple[int, str], ...] = ()

    @field_serializer("read_again_by", when_used="json")
    def _links(self, links: tuple[tuple[int, str], ...]) -> list[dict[str, Any]]:
        return [{"epoch": epoch, "status": status} for epoch, status in links]

    @classmethod
    def of(cls, reservation: Reservation, later: Sequence[LaterLink] = ()) -> ReservationView:
        return cls(
            table=mask_userinfo(reservation.range.table),
            after_snapshot_id=reservation.range.after_snapshot_id,
            to_snapshot_id=reservation.range.to_snapshot_id,
            range=mask_userinfo(reservation.range.describe()),
            position=reservation.position,
            run_id=reservation.run_id,
            reserved_at=reservation.reserved_at,
            read_again_by=tuple((link.epoch, _link_status(link)) for link in later),
        )

    @property
    def read_again(self) -> str | None:
        """``read again by epoch B (Aborted), then by epoch C (Committed)``, or ``None``."""
        if not self.read_again_by:
            return None
        return "read again by " + ", then by ".join(f"epoch {e} ({status})" for e, status in self.read_again_by)


def _link_status(link: LaterLink) -> str:
    return RESERVED if link.status is None else link.status.value


def reading_again(later: Sequence[LaterLink]) -> list[LaterLink]:
    """Of the links after an aborted (or row-less) epoch's, those that read its range again: each
    starts where the last committed epoch ended, so the next reads it, and, while they are aborted,
    the ones after it too (``core.input_ranges``)."""
    found: list[LaterLink] = []
    for link in later:
        found.append(link)
        if link.status is not EpochStatus.ABORTED:
            break
    return found


class AuditView(View):
    """An audited sink's write as its audit left it (design.md D23): the stage operators read, the
    audit branch and each table's audit snapshot, the verdict once the checks ran, and the checks
    that failed with what they said."""

    #: ``Auditing``, ``Audit failed`` or ``Audited`` while the epoch is Pending; its status once settled.
    stage: str
    branch: str
    #: Per table: the audit snapshot's id, or ``"empty"`` when the write added nothing there.
    snapshots: dict[str, str]
    #: ``"passed"``, ``"failed"``, or ``None`` while the checks have not run.
    verdict: str | None
    #: The failed checks, each ``{"name": ..., "message": ...}``.
    failed: tuple[dict[str, str], ...] = ()

    @classmethod
    def of(cls, audit: EpochAudit, stage: str) -> AuditView:
        return cls(
            stage=stage,
            branch=mask_userinfo(audit.branch),
            snapshots={mask_userinfo(table): snapshot for table, snapshot in audit.snapshots.items()},
            verdict=None if audit.verdict is None else audit.verdict.value,
            failed=tuple(
                {"name": mask_userinfo(c.name), "message": mask_userinfo(c.message)}
                for c in audit.checks
                if not c.passed
            ),
        )

    @property
    def waiting(self) -> bool:
        """Whether the epoch waits for its audit: to run, to be settled (failed), or for its publish."""
        return self.stage in tuple(AuditStage)


class EpochView(View):
    """One epoch's row, with its write's totals: what an operator needs to judge it."""

    sink_id: str
    epoch: int
    status: str
    write_id: str
    dag_id: str | None
    run_id: str | None
    try_number: int | None
    created_at: Utc
    updated_at: Utc
    #: Seconds since ``created_at`` by the meta store's clock when the view was read.
    age_seconds: Seconds
    commit_decided_at: Utc | None
    rows: int
    files: int
    bytes: int
    tables: tuple[TableView, ...]
    error: str | None
    #: Something an operator must see though nothing failed (another DAG wrote this epoch, say).
    warning: str | None = None
    #: For an incremental input, the upstream snapshots the write read (``core.input_ranges``).
    consumed: str | None = None
    #: Why the row's stored write cannot be read (naming the field at fault); ``None`` when it can.
    #: An unreadable epoch shows its row's own columns, and no tables, files or rows.
    unreadable: str | None = None
    #: Queued clean-ups of this epoch not yet done (an Aborted epoch's files a crash left, replaced writes).
    pending_cleanups: int = 0
    #: The data interval of the run that wrote the epoch, and that run's logical date: what
    #: ``airflow tasks clear -s``/``-e`` and ``backfill create`` select a run by. A ``dags test DAG
    #: DATE`` run's logical date is its interval's end, a scheduled or backfilled run's its start.
    #: Without a record of the run (rows persisted before migration 0008, or outside a DAG run) the
    #: start is the instant the epoch number stands for, and the end and the logical date are ``None``.
    interval_start: Utc | None = None
    interval_end: Utc | None = None
    logical_date: Utc | None = None
    #: False for an epoch aborted before its run produced a write (its reason is in ``error``).
    written: bool = True
    #: How often a newer generation's write replaced the committed one; the write in flight, if any.
    revision: int = 0
    replacing_write_id: str | None = None
    generation: str | None = None
    #: Every revision on record, oldest first (filled for one epoch's detail, empty in listings).
    revisions: tuple[RevisionView, ...] = ()
    #: For an incremental input, the range the epoch reserved (filled for one epoch's detail, and
    #: for a ``RESERVED`` epoch everywhere).
    reservation: ReservationView | None = None
    #: The failed task that ``error`` is about (filled for one epoch's detail, and for an epoch
    #: without a row everywhere), with its log once linked.
    cause: FailureView | None = None
    #: An audited sink's write, once committed to its audit branch (design.md D23): its stage, audit
    #: snapshots, verdict and failed checks. Kept after the epoch settled, as the record of the
    #: audit: a published epoch's passed one, a rejected epoch's failed one (their branch is gone
    #: then). Left out of the JSON for every other epoch, whose form stays as it was.
    audit: AuditView | None = Field(default=None, exclude_if=lambda value: value is None)

    @property
    def stage(self) -> str:
        """The status as operators read it: an audited Pending epoch's stage (``Audit failed``...)."""
        return self.status if self.audit is None else self.audit.stage

    @classmethod
    def unwritten(
        cls,
        sink_id: str,
        epoch: int,
        *,
        now: datetime,
        reservation: Reservation | None,
        entries: Sequence[HistoryEntry],
        dag_id: str | None,
        run: RunDates | None = None,
    ) -> EpochView:
        """An epoch without a row: ``RESERVED`` (a range reserved, its write not persisted) or,
        with no reservation, ``UNPERSISTED`` (its history holds a failure); named by the run that
        reserved it or failed, its error the newest failure of its tasks (design.md D22)."""
        status = RESERVED if reservation is not None else UNPERSISTED
        cause = cause_of(entries, None, status)
        times = [e.at for e in entries] + ([reservation.reserved_at] if reservation is not None else [])
        created = min(times) if times else now
        run_id = reservation.run_id if reservation is not None and reservation.run_id else None
        return cls(
            sink_id=sink_id,
            epoch=epoch,
            status=status,
            write_id="",
            dag_id=dag_id,
            run_id=run_id or (None if cause is None else cause.run_id),
            try_number=None if cause is None else cause.try_number,
            created_at=created,
            updated_at=max(times) if times else now,
            age_seconds=max(0.0, (now - created).total_seconds()),
            commit_decided_at=None,
            rows=0,
            files=0,
            bytes=0,
            tables=(),
            error=None if cause is None else cause.step,
            interval_start=interval_start(epoch) if run is None else run.interval_start,
            interval_end=None if run is None else run.interval_end,
            logical_date=None if run is None else run.logical_date,
            written=False,
            consumed=None if reservation is None else mask_userinfo(reservation.range.describe()),
            reservation=None if reservation is None else ReservationView.of(reservation),
            cause=cause,
        )

    def linked(self, base_url: str | None, live: Collection[tuple[str, str]] | None = None) -> EpochView:
        """With its cause's log in Airflow at ``base_url`` (``FailureView.linked``)."""
        return self if self.cause is None else self.model_copy(update={"cause": self.cause.linked(base_url, live)})

    @classmethod
    def read(
        cls,
        record: EpochRecord | UnreadableEpoch,
        *,
        now: datetime,
        pending_cleanups: int = 0,
        run: RunDates | None = None,
    ) -> EpochView:
        """The view of a row, or, when its stored write (or what is shown of it) does not parse, of
        its own columns with why: one such row never stops a listing or a page."""
        if isinstance(record, EpochRecord):
            try:
                return cls.of(record, now=now, pending_cleanups=pending_cleanups, run=run)
            except UNPARSABLE as exc:
                reason = unparsable_reason(exc)
                if record.write_id not in reason:  # what the view derives fails after the write parsed
                    reason = f"write {record.write_id}: {reason}"
        else:
            reason = record.reason
        return cls(
            sink_id=record.sink_id,
            epoch=record.epoch,
            status=record.status.value,
            write_id=record.write_id,
            dag_id=record.dag_id,
            run_id=record.run_id,
            try_number=record.try_number,
            created_at=record.created_at,
            updated_at=record.updated_at,
            age_seconds=max(0.0, (now - record.created_at).total_seconds()),
            commit_decided_at=record.commit_decided_at,
            rows=0,
            files=0,
            bytes=0,
            tables=(),
            error=None if record.error is None else mask_userinfo(record.error),
            warning=None if record.warning is None else mask_userinfo(record.warning),
            pending_cleanups=pending_cleanups,
            interval_start=interval_start(record.epoch) if run is None else run.interval_start,
            interval_end=None if run is None else run.interval_end,
            logical_date=None if run is None else run.logical_date,
            revision=record.revision,
            unreadable=reason,
        )

    @classmethod
    def of(
        cls, record: EpochRecord, *, now: datetime, pending_cleanups: int = 0, run: RunDates | None = None
    ) -> EpochView:
        committed: Mapping[str, str] = record.committed or {}
        consumed = _consumed(record.pre_commit)
        uuids: Mapping[str, str] = record.table_uuids or {}
        tables = tuple(
            TableView(
                name=mask_userinfo(table.table),
                files=len(table.data_files),
                rows=table.record_count,
                bytes=table.data_files.size_in_bytes(),
                snapshot=committed.get(table.table),
                table_uuid=uuids.get(table.table),
                changes=change_counts(table),
            )
            for table in record.pre_commit.tables
        )
        return cls(
            sink_id=record.sink_id,
            epoch=record.epoch,
            status=record.status.value,
            write_id=record.write_id,
            dag_id=record.dag_id,
            run_id=record.run_id,
            try_number=record.try_number,
            created_at=record.created_at,
            updated_at=record.updated_at,
            age_seconds=max(0.0, (now - record.created_at).total_seconds()),
            commit_decided_at=record.commit_decided_at,
            rows=sum(t.rows for t in tables),
            files=sum(t.files for t in tables),
            bytes=sum(t.bytes for t in tables),
            tables=tables,
            error=None if record.error is None else mask_userinfo(record.error),
            warning=None if record.warning is None else mask_userinfo(record.warning),
            pending_cleanups=pending_cleanups,
            interval_start=interval_start(record.epoch) if run is None else run.interval_start,
            interval_end=None if run is None else run.interval_end,
            logical_date=None if run is None else run.logical_date,
            written=record.pre_commit.written,
            revision=record.revision,
            replacing_write_id=record.kind.replaced_write_id,
            generation=record.pre_commit.generation,
            consumed=consumed,
            audit=None if (audit := record.audit_of_write) is None else AuditView.of(audit, record.stage),
        )

    shown_after = {"files_state": "bytes"}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def files_state(self) -> str | None:
        """What became of the write's files: an Aborted epoch's counts are of files deleted (or
        queued for deletion), not of files anyone can read."""
        if not self.files:
            return None
        if self.status == "Committed":
            return "visible"
        if self.status == "Pending":
            return "not visible yet"
        return "being deleted" if self.pending_cleanups else "deleted"


def _consumed(pre: PreCommit) -> str | None:
    """The upstream range the write read, described; ``InvalidPreCommit`` naming the field when its
    stored positions are no range (a row persisted before persist refused such positions)."""
    try:
        consumed = SnapshotRange.of_positions(pre.source_positions)
    except ValidationError as exc:
        raise InvalidPreCommit(
            f"{pre.describe()}: its source_positions are no snapshot range ({validation_faults(exc)})"
        ) from None
    return None if consumed is None else consumed.describe()


class RevisionView(View):
    """One revision of an epoch: the write, the run that wrote it, and what became of it."""

    revision: int
    write_id: str
    status: str
    generation: str | None
    dag_id: str | None
    run_id: str | None
    try_number: int | None
    rows: int
    files: int
    committed: dict[str, str] | None
    reason: str | None
    created_at: Utc
    updated_at: Utc
    #: The logical date of the run that wrote the revision (``None`` without a record of the run).
    logical_date: Utc | None = None

    @classmethod
    def of(cls, record: Any, run: RunDates | None = None) -> RevisionView:
        return cls(
            revision=record.revision,
            write_id=record.write_id,
            status=record.status,
            generation=record.generation,
            dag_id=record.dag_id,
            run_id=record.run_id,
            try_number=record.try_number,
            rows=record.rows,
            files=record.files,
            committed=record.committed,
            reason=None if record.reason is None else mask_userinfo(record.reason),
            created_at=record.created_at,
            updated_at=record.updated_at,
            logical_date=None if run is None else run.logical_date,
        )


class HistoryView(View):
    """One event of an epoch's history (``core.epochs``): what happened, when, by whom, why; the
    run's logical date and data interval where the store recorded that run."""

    at: Utc
    event: str
    write_id: str
    status: str | None
    revision: int | None
    #: ``task``, ``recovery``, ``cli``, ``ui`` or ``unknown``, and which one.
    actor: str
    actor_name: str | None
    dag_id: str | None
    run_id: str | None
    try_number: int | None
    #: How Airflow started the acting run (``scheduled``, ``manual``, ``backfill``...), cleared how often.
    run_type: str | None
    clear_number: int | None
    reason: str | None
    logical_date: Utc | None = None
    interval_start: Utc | None = None
    interval_end: Utc | None = None
    #: For a failed try of a task of the epoch's group (``error``, ``try failed``): what failed, as
    #: ``core.epochs.failed_step`` says it, the task, and its log once linked (``linked``).
    step: str | None = None
    task_id: str | None = None
    log_url: str | None = None

    @classmethod
    def of(cls, entry: HistoryEntry, run: RunDates | None = None) -> HistoryView:
        actor = entry.actor
        failure = FailureView.of(entry)
        return cls(
            at=entry.at,
            event=entry.event.value,
            write_id=entry.write_id,
            status=entry.status,
            revision=entry.revision,
            actor=actor.kind.value,
            actor_name=None if actor.name is None else mask_userinfo(actor.name),
            dag_id=actor.dag_id,
            run_id=actor.run_id,
            try_number=actor.try_number,
            run_type=actor.run_type,
            clear_number=actor.clear_number,
            reason=None if entry.reason is None else mask_userinfo(entry.reason),
            logical_date=None if run is None else run.logical_date,
            interval_start=None if run is None else run.interval_start,
            interval_end=None if run is None else run.interval_end,
            step=None if failure is None else failure.step,
            task_id=None if failure is None else failure.task_id,
        )

    @classmethod
    def range_read_again(cls, link: LaterLink, reserved: ReservationView) -> HistoryView:
        """What the chain says of an aborted epoch's range: ``link``'s epoch read it again."""
        return cls(
            at=link.reserved_at,
            event=RANGE_READ_AGAIN,
            write_id="",
            status=None,
            revision=None,
            actor=ActorKind.TASK.value,
            actor_name=None,
            dag_id=link.dag_id,
            run_id=link.run_id,
            try_number=None,
            run_type=None,
            clear_number=None,
            reason=f"epoch {link.epoch} reserved its range from the end of the last committed epoch, so it reads "
            f"this epoch's range ({reserved.range}) again: its rows are delivered there once that epoch is committed",
        )

    def linked(self, base_url: str | None, live: Collection[tuple[str, str]] | None = None) -> HistoryView:
        """With the failed task's log at ``base_url`` (of runs in ``live`` only, when given)."""
        if self.step is None or (live is not None and (self.dag_id, self.run_id) not in live):
            return self
        return self.model_copy(
            update={"log_url": _log_url(base_url, self.dag_id, self.run_id, self.task_id, self.try_number)}
        )


class CheckpointView(View):
    """The checkpoint source's word on an epoch, or why it could not be had."""

    sink_id: str
    epoch: int
    #: ``"COMPLETED"``, ``"FAILED"``, ``"PENDING"``, or ``None`` when the source could not answer.
    status: str | None
    #: Why ``status`` is ``None`` (the source's error), else ``None``.
    detail: str | None
    #: The registered checkpoint source's kind (``"metastore"``, ``"markers"``, ``"streaming"``,
    #: ``"snapshot_range"``).
    source: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def meaning(self) -> str | None:
        """What the status says of this source's epochs: an incremental input's checkpoint is its
        reserved range (``checkpoints.sources``), complete once reserved whatever became of
        the epoch, so ``COMPLETED`` means "range reserved" there, nothing more."""
        if self.source != SNAPSHOT_RANGE or self.status is None:
            return None
        return "range reserved" if self.status == "COMPLETED" else "no range reserved"


#: The checkpoint source kind of an incremental input (``checkpoints.config.SnapshotRangeCheckpoint``).
SNAPSHOT_RANGE = "snapshot_range"


class ActionResult(View):
    """What an action did, or with ``dry_run`` what it would do (and then nothing changed)."""

    action: str
    sink_id: str
    epoch: int | None
    dry_run: bool
    #: The coordinator's outcome (``"aborted"``, ``"committed"``, ``"already committed"`` ...) or,
    #: for a dry run, what would happen (``"would abort"``, ``"would commit"``, ``"nothing to do"``).
    outcome: str
    detail: str
    files_deleted: int = 0
    #: ``False`` when part of the action failed (a clean-up or an epoch of a recovery); see ``report``.
    ok: bool = True
    #: Action-specific particulars (a recovery's per-epoch results, the orphans found, ...).
    report: dict[str, Any] = Field(default_factory=dict)

    @field_validator("detail")
    @classmethod
    def _masked_detail(cls, detail: str) -> str:
        return mask_userinfo(detail)

    @field_validator("report", mode="before")
    @classmethod
    def _masked_report(cls, report: Mapping[str, Any]) -> Any:
        return _masked(dict(report))


#: What a caller is shown in place of the names and runs of a DAG they may not read.
ANOTHER_DAG = "another DAG"
#: ... and in place of the texts of such a DAG's runs (an abort reason, a warning, an error).
HIDDEN_TEXT = f"(not shown: written by a run of {ANOTHER_DAG})"
#: How the package's messages name a DAG (``DAG {dag_id!r}``).
_NAMED_DAG = re.compile(r"DAG '([^'\s]*)'")


@dataclass(frozen=True)
class Redaction:
    """What a caller who may read only the DAGs ``readable`` is shown of an epoch they may read.

    Another DAG writing the same sink (the reuse design.md D7 warns about) leaves traces in an epoch
    that is not its own: its persisted, aborted and discarded writes in the history, the warning on
    the row that names it. The events and revisions of its runs keep what happened and when, but
    say ``ANOTHER_DAG`` for who and lose their run and their texts; every other text (the row's
    warning and error, the reasons of the events kept) has the ids of the DAGs hidden, of their runs
    and of their tasks replaced by ``ANOTHER_DAG``. The recovery DAG's events are kept: it acts on
    every sink and names no pipeline; so are events of no DAG (an ``eo-sink`` or UI user).

    ``SinkReads`` applies it to every view it returns to such a caller, before any door renders one:
    the API, the pages, the sink's picture and the listings show the same.
    """

    readable: frozenset[str]
    #: The ids of the hidden DAGs, of their runs and of their tasks met in the epoch, longest first.
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, readable: Collection[str], runs: Iterable[Actor]) -> Redaction:
        """The redaction of an epoch in whose row, revisions and history these ``runs`` acted."""
        allowed = frozenset(readable)
        hidden: set[str] = set()
        shown: set[str] = set()
        for actor in runs:
            if _hides(allowed, actor.kind, actor.dag_id):
                hidden.update(name for name in (actor.dag_id, actor.run_id, actor.name) if name)
            elif actor.run_id:
                shown.add(actor.run_id)  # a scheduled run's id is every DAG's for that interval
        return cls(allowed, tuple(sorted(hidden - shown - allowed, key=lambda name: (-len(name), name))))

    @functools.cached_property
    def _names(self) -> re.Pattern[str] | None:
        if not self.names:
            return None
        return re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, self.names)) + r")(?![\w-])")

    def text(self, value: str | None) -> str | None:
        """``value`` naming no hidden DAG, run or task."""
        if value is None:
            return None
        value = _NAMED_DAG.sub(lambda m: m[0] if m[1] in self.readable else ANOTHER_DAG, value)
        return value if self._names is None else self._names.sub(ANOTHER_DAG, value)

    def epoch(self, view: EpochView) -> EpochView:
        cause, error = view.cause, self.text(view.error)
        if cause is not None and _hides(self.readable, ActorKind.TASK, cause.dag_id):
            cause, error = None, HIDDEN_TEXT  # the error is that run's text
        elif cause is not None:
            cause = cause.model_copy(update={"step": self.text(cause.step) or ""})
        reservation = view.reservation
        if reservation is not None:
            reservation = reservation.model_copy(update={"run_id": self.text(reservation.run_id)})
        audit = view.audit
        if audit is not None:
            failed = tuple({**c, "message": self.text(c["message"]) or ""} for c in audit.failed)
            audit = audit.model_copy(update={"failed": failed})
        return view.model_copy(
            update={
                "error": error,
                "warning": self.text(view.warning),
                "unreadable": self.text(view.unreadable),
                "revisions": tuple(self.revision(r) for r in view.revisions),
                "cause": cause,
                "reservation": reservation,
                "audit": audit,
            }
        )

    def revision(self, view: RevisionView) -> RevisionView:
        if not _hides(self.readable, ActorKind.TASK, view.dag_id):
            return view.model_copy(update={"reason": self.text(view.reason)})
        return view.model_copy(
            update={
                "dag_id": ANOTHER_DAG,
                "run_id": None,
                "try_number": None,
                "generation": None,
                "logical_date": None,
                "reason": None if view.reason is None else HIDDEN_TEXT,
            }
        )

    def event(self, view: HistoryView) -> HistoryView:
        if not _hides(self.readable, view.actor, view.dag_id):
            return view.model_copy(update={"reason": self.text(view.reason), "step": self.text(view.step)})
        return view.model_copy(
            update={
                "actor_name": ANOTHER_DAG,
                "dag_id": ANOTHER_DAG,
                "run_id": None,
                "try_number": None,
                "run_type": None,
                "clear_number": None,
                "reason": None if view.reason is None else HIDDEN_TEXT,
                "logical_date": None,
                "interval_start": None,
                "interval_end": None,
                "step": None if view.step is None else HIDDEN_TEXT,
                "task_id": None,
                "log_url": None,
            }
        )


def _hides(readable: frozenset[str], kind: str, dag_id: str | None) -> bool:
    return dag_id is not None and dag_id not in readable and kind != ActorKind.RECOVERY


class StaleRunView(View):
    """An unsettled epoch (Pending, or ``RESERVED``) whose DAG run Airflow still calls running while
    no task of it is alive and none did anything for longer than the threshold: a killed ``airflow
    dags test``, a lost worker. It never finishes by itself; with ``max_active_runs`` reached the
    scheduler starts no other run of its DAG and says nothing (``operations.stale_runs``)."""

    sink_id: str
    epoch: int
    status: str
    dag_id: str
    run_id: str
    #: Airflow's state of the run (``running``), and the newest start, end, heartbeat or update of
    #: any of its tasks (``None``: no task ever did anything), idle since then.
    run_state: str
    last_activity: Utc | None
    idle_seconds: Seconds
    #: What waits for the epoch to be settled (``None``: nothing, failing the run is enough), and
    #: the ``eo-sink`` command that settles it once the run failed: ``abort``, or ``commit`` for a
    #: persisted write whose checkpoint completed (the recovery DAG would commit it too).
    holds_back: str | None
    then: str | None = None
    #: The epoch's data interval and its run's logical date, as ``EpochView`` has them.
    interval_start: Utc | None = None
    interval_end: Utc | None = None
    logical_date: Utc | None = None

    @model_serializer(mode="wrap")
    def _with_advice(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """The JSON form adds how to fail the run and the advice, for the Airflow at ``base_url`` (the
        serialization context's; ``$AIRFLOW_URL`` unknown)."""
        data: dict[str, Any] = handler(self)
        if info.mode != "json":
            return data
        base_url = (info.context or {}).get("base_url")
        then = data.pop("then")
        url = urls.dag_run_api("$AIRFLOW_URL" if base_url is None else base_url, self.dag_id, self.run_id)
        fail_run = {"ui": "Mark as failed", "method": "PATCH", "url": url, "body": {"state": "failed"}}
        return {**data, "fail_run": fail_run, "then": then, "advice": self.advice(base_url)}

    def fail_request(self, base_url: str | None) -> str:
        """The REST call that fails the run (``[api] base_url``, or ``$AIRFLOW_URL`` unknown)."""
        url = urls.dag_run_api("$AIRFLOW_URL" if base_url is None else base_url, self.dag_id, self.run_id)
        return f'PATCH {url} {{"state": "failed"}}'

    def advice(self, base_url: str | None) -> str:
        """What is wrong and what to do, in a sentence or three, the same in every door."""
        idle = (
            "no task of it ever ran"
            if self.last_activity is None
            else f"no task of it is alive or did anything since {_iso(self.last_activity)}"
        )
        text = (
            f"sink {self.sink_id} epoch {self.epoch} ({self.status}): run {self.run_id} of DAG {self.dag_id} is "
            f"'{self.run_state}' in Airflow, but {idle}; it will never finish by itself. Fail the run: the Airflow "
            f"UI's 'Mark as failed' on the run, or {self.fail_request(base_url)}."
        )
        if self.then is not None:
            text += f" Then settle the epoch, as {self.holds_back}: {self.then}"
        return text


class RunCheck(View):
    """The runs that will never finish, as ``operations.stale_runs`` found them, or why Airflow
    could not be asked (its database unreachable): a view says that, and still answers."""

    #: Shown in minutes, as ``threshold_minutes``.
    threshold: timedelta = Field(serialization_alias="threshold_minutes")
    stale: tuple[StaleRunView, ...] = Field(default=(), serialization_alias="stale_runs")
    #: Why Airflow's runs were not checked; ``None`` when they were (or no epoch needed it).
    not_checked: str | None = Field(default=None, serialization_alias="runs_not_checked")

    @field_serializer("threshold", when_used="json")
    def _minutes(self, threshold: timedelta) -> float:
        return threshold.total_seconds() / 60


def describe_write(pre: PreCommit) -> str:
    """``write <id>: N file(s), M row(s) in <tables>``: what a dry run says it would act on."""
    if not pre.written:
        return "no write (the run was aborted before its write produced one)"
    files = sum(len(t.data_files) for t in pre.tables)
    tables: Sequence[str] = [mask_userinfo(t.table) for t in pre.tables]
    return f"write {pre.write_id}: {files} file(s), {pre.record_count} row(s) in {', '.join(tables)}"


EpochView.model_rebuild()
