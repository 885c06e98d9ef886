"""What the operations service returns: plain frozen records with a JSON-safe ``to_dict()``.

The CLI prints them as tables or JSON and the UI's API returns ``to_dict()`` as is, so both show the
same numbers under the same names. Times are timezone-aware UTC (the meta store's clock) and become
ISO 8601 strings in ``to_dict()``. Locations and messages are masked (``core.redact``) as the records
are made, so no door that shows one can forget to; control characters are left for each door to
escape in its own way (JSON escapes them, the CLI's tables show them as ``\x1b``). What of an epoch
a caller who may read only some DAGs is shown is decided here too, once (``Redaction``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.history import Actor, ActorKind, HistoryEntry
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.store.queries import (
    UNPARSABLE,
    UnreadableEpoch,
    unparsable_reason,
    validation_faults,
)
from airflow_provider_exactly_once.store.runs import RunDates


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


def interval_start(epoch: int) -> datetime | None:
    """The data-interval start an interval-derived epoch stands for (ms since the Unix epoch).

    Run-keyed and custom epochs are numbers too; a value outside the calendar gives ``None``.
    """
    try:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch)
    except OverflowError:
        return None


@dataclass(frozen=True)
class SinkSummary:
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
    pending: int
    committed: int
    aborted: int
    oldest_pending_created_at: datetime | None
    #: Queued clean-ups not yet done: writes whose files still have to go.
    pending_cleanups: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "sink_id": self.sink_id,
            "kind": self.kind,
            "tables": list(self.tables),
            "root": self.root,
            "registered": self.registered,
            "checkpoint": self.checkpoint,
            "counts": {"pending": self.pending, "committed": self.committed, "aborted": self.aborted},
            "oldest_pending_created_at": _iso(self.oldest_pending_created_at),
            "pending_cleanups": self.pending_cleanups,
        }


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


@dataclass(frozen=True)
class TableView:
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "files": self.files,
            "rows": self.rows,
            "bytes": self.bytes,
            "snapshot": self.snapshot,
            "table_uuid": self.table_uuid,
            "changes": self.changes,
        }


@dataclass(frozen=True)
class EpochView:
    """One epoch's row, with its write's totals: what an operator needs to judge it."""

    sink_id: str
    epoch: int
    status: str
    write_id: str
    dag_id: str | None
    run_id: str | None
    try_number: int | None
    created_at: datetime
    updated_at: datetime
    #: Seconds since ``created_at`` by the meta store's clock when the view was read.
    age_seconds: float
    commit_decided_at: datetime | None
    rows: int
    files: int
    bytes: int
    tables: tuple[TableView, ...]
    error: str | None
    #: Something an operator must see though nothing failed (another DAG wrote this epoch, say).
    warning: str | None = None
    #: Queued clean-ups of this epoch not yet done (an Aborted epoch's files a crash left, replaced writes).
    pending_cleanups: int = 0
    #: The data interval of the run that wrote the epoch, and that run's logical date: what
    #: ``airflow tasks clear -s``/``-e`` and ``backfill create`` select a run by. A ``dags test DAG
    #: DATE`` run's logical date is its interval's end, a scheduled or backfilled run's its start.
    #: Without a record of the run (rows persisted before migration 0008, or outside a DAG run) the
    #: start is the instant the epoch number stands for, and the end and the logical date are ``None``.
    interval_start: datetime | None = field(default=None)
    interval_end: datetime | None = None
    logical_date: datetime | None = None
    #: False for an epoch aborted before its run produced a write (its reason is in ``error``).
    written: bool = True
    #: How often a newer generation's write replaced the committed one; the write in flight, if any.
    revision: int = 0
    replacing_write_id: str | None = None
    generation: str | None = None
    #: Every revision on record, oldest first (filled for one epoch's detail, empty in listings).
    revisions: tuple[RevisionView, ...] = ()
    #: For an incremental input, the upstream snapshots the write read (``core.input_ranges``).
    consumed: str | None = None
    #: Why the row's stored write cannot be read (naming the field at fault); ``None`` when it can.
    #: An unreadable epoch shows its row's own columns, and no tables, files or rows.
    unreadable: str | None = None

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
        )

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "sink_id": self.sink_id,
            "epoch": self.epoch,
            "status": self.status,
            "write_id": self.write_id,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "try_number": self.try_number,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "age_seconds": round(self.age_seconds, 3),
            "commit_decided_at": _iso(self.commit_decided_at),
            "rows": self.rows,
            "files": self.files,
            "bytes": self.bytes,
            "files_state": self.files_state,
            "tables": [t.to_dict() for t in self.tables],
            "error": self.error,
            "warning": self.warning,
            "consumed": self.consumed,
            "unreadable": self.unreadable,
            "pending_cleanups": self.pending_cleanups,
            "interval_start": _iso(self.interval_start),
            "interval_end": _iso(self.interval_end),
            "logical_date": _iso(self.logical_date),
            "written": self.written,
            "revision": self.revision,
            "replacing_write_id": self.replacing_write_id,
            "generation": self.generation,
            "revisions": [r.to_dict() for r in self.revisions],
        }


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


@dataclass(frozen=True)
class RevisionView:
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
    committed: Mapping[str, str] | None
    reason: str | None
    created_at: datetime
    updated_at: datetime
    #: The logical date of the run that wrote the revision (``None`` without a record of the run).
    logical_date: datetime | None = None

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "write_id": self.write_id,
            "status": self.status,
            "generation": self.generation,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "try_number": self.try_number,
            "rows": self.rows,
            "files": self.files,
            "committed": None if self.committed is None else dict(self.committed),
            "reason": self.reason,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "logical_date": _iso(self.logical_date),
        }


@dataclass(frozen=True)
class HistoryView:
    """One event of an epoch's history (``core.history``): what happened, when, by whom, why; the
    run's logical date and data interval where the store recorded that run."""

    at: datetime
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
    logical_date: datetime | None = None
    interval_start: datetime | None = None
    interval_end: datetime | None = None

    @classmethod
    def of(cls, entry: HistoryEntry, run: RunDates | None = None) -> HistoryView:
        actor = entry.actor
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
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": _iso(self.at),
            "event": self.event,
            "write_id": self.write_id,
            "status": self.status,
            "revision": self.revision,
            "actor": self.actor,
            "actor_name": self.actor_name,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "try_number": self.try_number,
            "run_type": self.run_type,
            "clear_number": self.clear_number,
            "reason": self.reason,
            "logical_date": _iso(self.logical_date),
            "interval_start": _iso(self.interval_start),
            "interval_end": _iso(self.interval_end),
        }


@dataclass(frozen=True)
class CheckpointView:
    """The checkpoint source's word on an epoch, or why it could not be had."""

    sink_id: str
    epoch: int
    #: ``"COMPLETED"``, ``"FAILED"``, ``"PENDING"``, or ``None`` when the source could not answer.
    status: str | None
    #: Why ``status`` is ``None`` (the source's error), else ``None``.
    detail: str | None
    #: The registered checkpoint source's kind (``"metastore"``, ``"markers"``, ``"streaming"``).
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "sink_id": self.sink_id,
            "epoch": self.epoch,
            "status": self.status,
            "detail": self.detail,
            "source": self.source,
        }


@dataclass(frozen=True)
class ActionResult:
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
    report: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", mask_userinfo(self.detail))
        object.__setattr__(self, "report", _masked(dict(self.report)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "sink_id": self.sink_id,
            "epoch": self.epoch,
            "dry_run": self.dry_run,
            "outcome": self.outcome,
            "detail": self.detail,
            "files_deleted": self.files_deleted,
            "ok": self.ok,
            "report": dict(self.report),
        }


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
        return replace(
            view,
            error=self.text(view.error),
            warning=self.text(view.warning),
            unreadable=self.text(view.unreadable),
            revisions=tuple(self.revision(r) for r in view.revisions),
        )

    def revision(self, view: RevisionView) -> RevisionView:
        if not _hides(self.readable, ActorKind.TASK, view.dag_id):
            return replace(view, reason=self.text(view.reason))
        return replace(
            view,
            dag_id=ANOTHER_DAG,
            run_id=None,
            try_number=None,
            generation=None,
            logical_date=None,
            reason=None if view.reason is None else HIDDEN_TEXT,
        )

    def event(self, view: HistoryView) -> HistoryView:
        if not _hides(self.readable, view.actor, view.dag_id):
            return replace(view, reason=self.text(view.reason))
        return replace(
            view,
            actor_name=ANOTHER_DAG,
            dag_id=ANOTHER_DAG,
            run_id=None,
            try_number=None,
            run_type=None,
            clear_number=None,
            reason=None if view.reason is None else HIDDEN_TEXT,
            logical_date=None,
            interval_start=None,
            interval_end=None,
        )


def _hides(readable: frozenset[str], kind: str, dag_id: str | None) -> bool:
    return dag_id is not None and dag_id not in readable and kind != ActorKind.RECOVERY


def describe_write(pre: PreCommit) -> str:
    """``write <id>: N file(s), M row(s) in <tables>``: what a dry run says it would act on."""
    if not pre.written:
        return "no write (the run was aborted before its write produced one)"
    files = sum(len(t.data_files) for t in pre.tables)
    tables: Sequence[str] = [mask_userinfo(t.table) for t in pre.tables]
    return f"write {pre.write_id}: {files} file(s), {pre.record_count} row(s) in {', '.join(tables)}"
