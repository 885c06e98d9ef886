"""The interfaces the coordinator runs over (meta store, sink committer, checkpoint source; design.md,
"Layers"), the epoch's row they hand it, and the kind of write that row holds (``WriteKind``).

Protocols, so that the coordinator stays free of SQLAlchemy, pyiceberg, fsspec, Airflow and Spark;
``store/``, ``sinks/`` and ``checkpoints/`` implement them. The kind of write is derived from the
pre-commit and the row, never stored, and every rule that differs by kind asks it here instead of
testing a field, so a new kind of write is one more value.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from airflow_provider_exactly_once.core.epochs import (
    EPOCH_MAX,
    AbortCause,
    AuditStage,
    AuditVerdict,
    CheckpointStatus,
    EpochAudit,
    EpochStatus,
)
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.precommit import PreCommit

#: What a commit records for a table it left unchanged (``core.ports.CommittedTables``).
EMPTY = "empty"

if TYPE_CHECKING:
    from .precommit import PreCommit, TableWrite


class Kind(StrEnum):
    """The kinds of write. A table's write is an append or an upsert; an epoch's write is also a
    revision when a newer generation's write replaces the committed one (design.md D12, D14)."""

    #: The record of an abort before anything was written (``PreCommit.nothing_written``).
    NOTHING = "nothing written"
    APPEND = "append"
    #: An append revision: swaps the committed write's files for its own.
    REVISION = "revision"
    UPSERT = "upsert"
    #: Changes by key replacing the committed write's, planned against the table before it.
    UPSERT_REVISION = "upsert revision"

    @classmethod
    def of_table(cls, table: TableWrite) -> Kind:
        """One table's write: changes by key carry their counts, rows do not."""
        return cls.APPEND if table.changes is None else cls.UPSERT

    @property
    def by_key(self) -> bool:
        """Changes by key (insert, update, delete), applied copy-on-write: the commit removes the
        files they rewrote and refuses when the table moved under them (``UpsertConflict``)."""
        return self in (Kind.UPSERT, Kind.UPSERT_REVISION)

    @property
    def stages_manifests(self) -> bool:
        """Whether persist writes the commit's manifests ahead (D16): an append's, a revision's and an
        upsert's are known then. An upsert's revision is not: what it removes depends on every commit
        since the write it revises (``sinks.iceberg.overwrites.files_to_revise``)."""
        return self in (Kind.APPEND, Kind.REVISION, Kind.UPSERT)


@dataclass(frozen=True)
class ReplacedWrite:
    """The committed write a Pending revision replaces: its commit removes exactly these files, and
    an abort of the revision makes this write the epoch's again, Committed as it was."""

    write_id: str
    pre_commit: PreCommit
    #: Per table, the snapshot that made it visible (``ports.CommittedTables``).
    committed: Mapping[str, str]
    table_uuids: Mapping[str, str] | None
    revision: int
    committed_at: datetime


@dataclass(frozen=True)
class WriteKind:
    """An epoch's write: its ``kind`` and, for a revision, the committed write it replaces."""

    kind: Kind
    #: The committed write a revision replaces (its commit removes that write's files); ``None``
    #: for every other kind.
    replaces: ReplacedWrite | None = None

    @classmethod
    def of(cls, pre_commit: PreCommit, replaces: ReplacedWrite | None = None) -> WriteKind:
        """The kind of ``pre_commit`` as the epoch's row holds it (``replaces``: the row's)."""
        if not pre_commit.written:
            return cls(Kind.NOTHING)
        by_key = any(Kind.of_table(t).by_key for t in pre_commit.tables)
        if replaces is None:
            return cls(Kind.UPSERT if by_key else Kind.APPEND)
        return cls(Kind.UPSERT_REVISION if by_key else Kind.REVISION, replaces)

    @property
    def by_key(self) -> bool:
        return self.kind.by_key

    @property
    def revises(self) -> bool:
        """A revision: the epoch stays Committed with the replaced write until this one commits."""
        return self.kind in (Kind.REVISION, Kind.UPSERT_REVISION)

    @property
    def stages_manifests(self) -> bool:
        return self.kind.stages_manifests

    def shows_replaced(self, table: str) -> bool:
        """Whether the write a revision replaces made a snapshot of its own in ``table`` (its marker
        is the table's newest for the epoch until this one commits)."""
        return self.replaces is not None and self.replaces.committed.get(table, EMPTY) != EMPTY

    @property
    def replaced_write_id(self) -> str | None:
        return None if self.replaces is None else self.replaces.write_id

    @property
    def batches(self) -> bool:
        """Whether recovery may commit it together with its neighbours (D15). Only a plain append:
        a revision replaces files the table must still hold when its snapshot is made, and changes
        by key are checked against the table just before them; both depend on what the epoch
        before them left."""
        return self.kind is Kind.APPEND

    @property
    def in_epoch_order(self) -> bool:
        """Whether the sink's epochs of this kind commit in epoch order (design.md, 'The Iceberg commit', step
        7): changes by key applied out of order would leave an older state of a key visible."""
        return self.by_key

    @property
    def rewritable(self) -> bool:
        """Whether a conflict with the table is cured by writing the epoch again (D14). Only plain
        changes by key: a revision conflicts with what was committed after the epoch, which a new
        write meets again."""
        return self.kind is Kind.UPSERT

    @property
    def lost_beyond_files(self) -> bool:
        """Whether the write counts as lost also when the sink's checks refuse it for good, not
        only when its data files are gone: a revision whose replaced files left the table can
        never replace them, and changes by key whose table moved under them can never be
        committed as written."""
        return self.revises or self.by_key


#: Per table: the snapshot id that made the epoch visible, or ``EMPTY`` when there was nothing to add.
CommittedTables = Mapping[str, str]


@dataclass(frozen=True)
class EpochRecord:
    """One row of ``pending_sink_state``; times are the database's, timezone-aware UTC."""

    sink_id: str
    epoch: int
    status: EpochStatus
    write_id: str
    pre_commit: PreCommit
    run_id: str | None
    try_number: int | None
    created_at: datetime
    updated_at: datetime
    #: When the coordinator durably decided to commit this write; from then on abort is refused.
    commit_decided_at: datetime | None
    committed: CommittedTables | None
    error: str | None
    #: The DAG whose run persisted (or aborted) the write; ``None`` outside Airflow and for older rows.
    dag_id: str | None = None
    #: Per table, the identity (``SinkCommitter.identities``) the epoch was committed to; ``None``
    #: before the commit and for rows committed before identities were recorded.
    table_uuids: Mapping[str, str] | None = None
    #: What a persist found suspicious about the epoch (a sink id reused by another DAG).
    warning: str | None = None
    #: How often a newer generation's write replaced the epoch's committed one (0: never).
    revision: int = 0
    #: While a revision is Pending: the committed write it replaces, still the visible one.
    replaces: ReplacedWrite | None = None
    #: Why an Aborted epoch's write was given up (``error`` says it in words); ``None`` otherwise
    #: and for rows aborted before the cause was recorded whose reason did not tell it.
    abort_cause: AbortCause | None = None
    #: An audited sink's write: its audit, once committed to its audit branch (design.md D23).
    audit: EpochAudit | None = None

    @property
    def kind(self) -> WriteKind:
        return WriteKind.of(self.pre_commit, self.replaces)

    @property
    def audit_of_write(self) -> EpochAudit | None:
        """The audit of the row's current write, if it has one (an earlier write's says nothing)."""
        return self.audit if self.audit is not None and self.audit.write_id == self.write_id else None

    @property
    def stage(self) -> str:
        """The status as operators read it: a Pending audited write is ``Auditing`` until its checks
        ran, then ``Audit failed`` or ``Audited`` (awaiting its publish), design.md D23."""
        audit = self.audit_of_write
        if self.status is not EpochStatus.PENDING or audit is None or self.commit_decided_at is not None:
            return self.status.value
        if audit.verdict is None:
            return AuditStage.AUDITING
        return AuditStage.AUDIT_FAILED if audit.verdict is AuditVerdict.FAILED else AuditStage.AUDITED

    def as_replaced(self) -> ReplacedWrite:
        """This Committed row as a revision replacing it records it."""
        return ReplacedWrite(
            write_id=self.write_id,
            pre_commit=self.pre_commit,
            committed=dict(self.committed or {}),
            table_uuids=None if self.table_uuids is None else dict(self.table_uuids),
            revision=self.revision,
            committed_at=self.updated_at,
        )


@dataclass(frozen=True)
class CleanupTask:
    """A write whose files must go: aborted, replaced by a later write, or refused as a late duplicate."""

    id: int
    sink_id: str
    epoch: int
    write_id: str
    pre_commit: PreCommit
    reason: str
    created_at: datetime
    #: For a write replaced by a newer revision: table -> the snapshot that removed its files. They
    #: stay while a retained snapshot older than that one may still reference them.
    removed_by: Mapping[str, str] | None = None


@dataclass(frozen=True)
class CommitMark:
    """One epoch of a batch to mark Committed (``SinkStateStore.mark_committed_batch``)."""

    epoch: int
    write_id: str
    committed: CommittedTables
    identities: Mapping[str, str]


class SinkRevisions(Protocol):
    """The store's transitions of an epoch's revisions (``store.revisions``): a newer generation's
    write replacing the committed one, atomically (invariant 1)."""

    def open_revision(
        self,
        pre_commit: PreCommit,
        *,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
    ) -> EpochRecord:
        """``Committed -> Pending`` with ``pre_commit`` as the next revision; the committed write stays
        visible and is kept in ``replaces``. ``StateConflict`` when the row moved."""
        ...

    def abort_revision(
        self, sink_id: str, epoch: int, *, write_id: str, reason: str, decided: bool = False
    ) -> EpochRecord:
        """An undecided Pending revision given up: the write it replaces is the epoch's again,
        Committed; the revision's write is queued for clean-up. ``StateConflict`` when the row moved."""
        ...

    def was_replaced(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether this write was the epoch's committed write until a revision's commit replaced it."""
        ...


class InputRangeChain(Protocol):
    """The reserved ranges of incremental inputs (``store.input_ranges``, ``core.input_ranges``)."""

    def sharing_start(self, sink_id: str, epoch: int, reserved: SnapshotRange) -> int | None:
        """Another epoch whose non-empty range starts where ``reserved`` does, committed or decided."""
        ...


class SinkStateStore(Protocol):
    """``pending_sink_state`` and its companions. Every status change is a compare-and-swap.

    A CAS that matches no row raises ``StateConflict``; an unreachable database raises
    ``MetaStoreUnavailable`` with nothing half-written (each method is one transaction).
    """

    @property
    def revisions(self) -> SinkRevisions:
        """Revisions of epochs (a companion on the same database)."""
        ...

    @property
    def input_ranges(self) -> InputRangeChain:
        """The ranges incremental epochs reserved (a companion on the same database)."""
        ...

    def now(self) -> datetime:
        """The database's clock: the one ``created_at`` is written with."""
        ...

    def get(self, sink_id: str, epoch: int) -> EpochRecord | None: ...

    def insert_pending(
        self, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None = None
    ) -> EpochRecord:
        """``(none) -> Pending``; ``StateConflict`` if a row already exists.

        Refuses a write ever queued for clean-up (``write_discarded``) with ``EpochAborted``
        (``decisions.discarded_error``), asked in the insert's own transaction once the row was
        inserted: persist tries a first write's insert without reading the row or the queue first,
        and no clean-up can be queued between the check and the insert.
        """
        ...

    def replace_write(
        self,
        pre_commit: PreCommit,
        *,
        expected_status: EpochStatus,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
    ) -> EpochRecord:
        """``Pending -> Pending`` (a newer write, only while no commit is decided) or ``Aborted -> Pending``.

        In the same transaction, a replaced Pending write is queued for cleanup (an Aborted one was
        queued when it was aborted). ``created_at`` is kept: it bounds the marker walk from below.
        """
        ...

    def insert_aborted(
        self, pre_commit: PreCommit, *, reason: str, dag_id: str | None = None, cause: AbortCause | None = None
    ) -> EpochRecord:
        """``(none) -> Aborted`` for a write aborted before it was ever persisted, queuing its cleanup.

        The row is the tombstone that makes a late persist of the same write fail instead of
        resurrecting deleted files; ``StateConflict`` if a row exists (persist won the race).
        """
        ...

    def write_discarded(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether this write was ever queued for cleanup (it must then never be persisted)."""
        ...

    def decide_commit(self, sink_id: str, epoch: int, *, write_id: str, audit: EpochAudit | None = None) -> EpochRecord:
        """Set ``commit_decided_at`` on the Pending row of this write (idempotent once set); with
        ``audit``, a publish's passed audit is recorded in the same transaction (design.md D23)."""
        ...

    def mark_committed(
        self,
        sink_id: str,
        epoch: int,
        *,
        write_id: str,
        committed: CommittedTables,
        identities: Mapping[str, str] | None = None,
    ) -> EpochRecord:
        """``Pending -> Committed`` for this write, with the identity of each table it went into; clears ``error``."""
        ...

    def decide_commits(self, sink_id: str, writes: Sequence[tuple[int, str]]) -> Sequence[int]:
        """``decide_commit`` for several ``(epoch, write_id)`` of a sink in one transaction, each by its
        own CAS, in order, stopping at the first whose row moved: the epochs decided, a prefix."""
        ...

    def mark_committed_batch(self, sink_id: str, marks: Sequence[CommitMark]) -> Sequence[int]:
        """``mark_committed`` for several decided Pending writes (no revision) in one transaction, each
        by its own CAS; a row that moved is left as it is. The epochs marked."""
        ...

    def reopen_committed(
        self,
        pre_commit: PreCommit,
        *,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
        reason: str,
    ) -> EpochRecord:
        """``Committed -> Pending`` with a new write, only for an epoch whose tables were re-created
        since (its commit proves nothing for the new tables); ``reason`` becomes the row's warning."""
        ...

    def record_audit(self, sink_id: str, epoch: int, audit: EpochAudit) -> EpochRecord:
        """Keep ``audit`` on the Pending row of its write while no commit is decided: committed to its
        audit branch, or judged (design.md D23). ``StateConflict`` when the row moved."""
        ...

    def record_warning(self, sink_id: str, epoch: int, *, warning: str) -> None:
        """Keep a warning for operators on the row, whatever its status."""
        ...

    def mark_aborted(
        self,
        sink_id: str,
        epoch: int,
        *,
        write_id: str,
        reason: str,
        decided: bool = False,
        cause: AbortCause | None = None,
    ) -> EpochRecord:
        """``Pending -> Aborted`` for this write, only while no commit is decided; queues its cleanup.

        ``decided`` reverses that: only a row whose commit *is* decided (a write whose data files
        were lost, given up by an operator who checked that no table shows it)."""
        ...

    def record_error(self, sink_id: str, epoch: int, *, write_id: str, error: str) -> None:
        """Note the last failure on the row (no status change); a row of another write is left alone."""
        ...

    def enqueue_cleanup(self, pre_commit: PreCommit, *, reason: str) -> CleanupTask:
        """Queue a write that never became (or no longer is) the row's write."""
        ...

    def cleanups(self, sink_id: str, epoch: int | None = None) -> Sequence[CleanupTask]:
        """Queued clean-ups not yet done, oldest first."""
        ...

    def complete_cleanup(self, cleanup_id: int) -> None: ...

    def epochs_with_status(self, sink_id: str, status: EpochStatus) -> Sequence[EpochRecord]:
        """Served by the ``(sink_id, status)`` index: recovery costs O(pending), not O(history)."""
        ...

    def sink_ids(self) -> Sequence[str]: ...


#: The epoch an orphaned write is queued under: nothing on storage says which epoch an abandoned,
#: never-persisted write was for. ``SinkStateStore.write_discarded`` matches it for every epoch, so a
#: very late persist of a write removed as an orphan fails instead of pointing at deleted files.
ORPHAN_EPOCH = EPOCH_MAX


class SinkRegistry(Protocol):
    """What the recovery DAG and the operations tools need beyond the epochs: how to rebuild each
    sink (its registered configurations), which writes the store answers for (orphans), and one
    recovery at a time per sink (a lock with an expiry).
    """

    def register_sink(
        self, sink_id: str, sink_config: Mapping[str, Any], checkpoint_config: Mapping[str, Any] | None
    ) -> None:
        """Record (or update) the sink's configurations; a ``checkpoint_config`` of ``None`` keeps
        the registered one."""
        ...

    def registered_sinks(self) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """Every registered sink as ``(sink_id, sink_config, checkpoint_config)``, by sink id."""
        ...

    def registered_sink(self, sink_id: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """One sink's ``(sink_config, checkpoint_config)``, or ``None`` if never registered."""
        ...

    def known_writes(self, sink_id: str, write_ids: Sequence[str]) -> set[str]:
        """The given write ids the store still answers for; any other write found on storage is an
        orphan candidate."""
        ...

    def enqueue_orphan_cleanup(self, pre_commit: PreCommit, *, reason: str, written_since: datetime) -> CleanupTask:
        """Queue an orphaned write (epoch ``ORPHAN_EPOCH``) for the coordinator's clean-up path;
        ``StateConflict`` if the store's records say it is no orphan."""
        ...

    def acquire_sink_lock(self, sink_id: str, holder: str, *, ttl: timedelta) -> tuple[bool, str, datetime]:
        """Take the sink's lock for ``ttl`` unless another holder has it unexpired: ``(acquired,
        holder, expires_at)``, naming the current holder on refusal."""
        ...

    def release_sink_lock(self, sink_id: str, holder: str) -> bool:
        """Give the lock back; ``False`` when ``holder`` no longer had it."""
        ...


@dataclass(frozen=True)
class VisibleEpoch:
    """What a committer found of an epoch in its sink."""

    #: Per table that shows the epoch: the snapshot id (or a file-sink token) that holds it.
    tables: CommittedTables
    #: The write id the sink's marker names, per table (``None`` where the sink keeps none).
    write_ids: Mapping[str, str | None]


class FileCheck(StrEnum):
    """How ``SinkCommitter.prepare`` looks for the write's files right before the commit decision
    (design.md, 'The Iceberg commit', step 3): so that a file removed since persist refuses the
    epoch while it is still abortable, not after its commit is decided."""

    #: Not at all: persist, whose files were just written, and the checks that only ask what the
    #: commit would refuse besides.
    NONE = "none"
    #: The manifests persist wrote below the write location, one request per table: unreferenced
    #: as the data files are, a removal that took the files takes them too. Every file of a write
    #: that has none. The commit task's check of an epoch persisted within the coordinator's
    #: ``full_file_check_after``.
    OWN_MANIFESTS = "own manifests"
    #: Every data file, one listing per write location: an older epoch, and every recovery.
    EVERY_FILE = "every file"


@dataclass(frozen=True)
class CommitPlan:
    """One write's commit as a value: what ``SinkCommitter.prepare`` checked, for ``commit`` to apply.

    ``CommitPlan(pre_commit, replaces)``, with nothing prepared, is a valid plan: the committer then
    loads and checks every table itself (a commit decided earlier, resumed after a crash). A
    prepared plan also carries, per table, the state the sink checked (opaque here; an Iceberg
    committer keeps the table it loaded), when and by which committer. A committer uses that state
    only if it prepared it and only while it is fresh (``fresh_state``), and its commit still
    asserts what the state showed (an Iceberg append asserts the branch head), so a stale or
    repeated plan costs a reload or a conflict retry, never a wrong commit. A plan lives in one
    process for one commit attempt; it is never persisted (``prepared_at`` is a monotonic clock).
    """

    pre_commit: PreCommit
    #: A revision's: the committed write whose files the commit removes in the same step.
    replaces: ReplacedWrite | None = None
    #: Per table of the write: the sink's prepared state; empty for a plan built without ``prepare``.
    prepared: Mapping[str, object] = field(default_factory=dict)
    #: ``time.monotonic()`` when preparing began (so before any state was taken); ``None``: unprepared.
    prepared_at: float | None = None
    #: The committer that prepared the state; no other one uses it.
    prepared_by: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        replaced = self.replaces
        if replaced is not None and (
            (replaced.pre_commit.sink_id, replaced.pre_commit.epoch) != (self.pre_commit.sink_id, self.pre_commit.epoch)
            or replaced.write_id == self.pre_commit.write_id
        ):
            raise InvalidPreCommit(
                f"{self.pre_commit.describe()}: a commit can only replace another write of the same epoch, "
                f"not {replaced.pre_commit.describe()}"
            )
        if self.prepared and (self.prepared_at is None or self.prepared_by is None):
            raise InvalidPreCommit(f"{self.pre_commit.describe()}: prepared state needs prepared_at and prepared_by")
        unknown = set(self.prepared) - {write.table for write in self.pre_commit.tables}
        if unknown:
            raise InvalidPreCommit(f"{self.pre_commit.describe()}: prepared state for other tables {sorted(unknown)}")
        object.__setattr__(self, "prepared", MappingProxyType(dict(self.prepared)))

    @property
    def kind(self) -> WriteKind:
        return WriteKind.of(self.pre_commit, self.replaces)

    def fresh_state(self, committer: object, max_age_s: float) -> Mapping[str, object]:
        """The prepared state ``committer`` may use: its own, prepared at most ``max_age_s`` ago; else
        nothing (the committer loads and checks afresh)."""
        if self.prepared_by is not committer or self.prepared_at is None:
            return {}
        return self.prepared if time.monotonic() - self.prepared_at <= max_age_s else {}


@runtime_checkable
class SinkCommitter(Protocol):
    """Makes one epoch visible in one sink, idempotently (design.md, 'The Iceberg commit' and 'The file-sink commit').

    ``since`` is the row's ``created_at``: nothing of the epoch can have become visible before it,
    which bounds every look-back by what happened since the write, not by the sink's history.
    """

    def prepare(
        self, pre_commit: PreCommit, *, replaces: ReplacedWrite | None = None, check_files: FileCheck = FileCheck.NONE
    ) -> CommitPlan:
        """Refuse what can never be committed, and return the plan ``commit`` applies.

        Runs before persisting (the plan is handed to ``stage``) and again right before the commit decision, so
        a refusal always leaves the epoch abortable: unknown table, paths outside the table or sink
        location, partition values that do not match the spec the write was made for, incompatible
        schema, a table or branch the append would refuse. With ``replaces`` (a revision) it also
        refuses what the commit would: a replaced file no longer in the table
        (``ReplacedFilesMissing``), or a sink that cannot replace at all (``CommitRefused``).
        ``check_files`` (right before the decision, not at persist) refuses missing files too
        (``MissingDataFiles``), looking as ``FileCheck`` says.
        Changes nothing. Raises ``InvalidPreCommit``, ``UnknownTable``, ``SchemaMismatch``,
        ``CommitRefused``, or ``SinkUnavailable`` (retryable) when the sink cannot be asked.
        """
        ...

    def stage(self, plan: CommitPlan) -> PreCommit:
        """At persist: write what the commit can write ahead of time, below the write location, and
        return the pre-commit that records it (``plan.pre_commit`` when there is nothing to stage).
        Staged files are only an optimisation: a commit that finds them stale or gone writes its own."""
        ...

    def tidy(self, staged: PreCommit, recorded: PreCommit | None) -> None:
        """After a persist that staged ``staged``: delete what ``stage`` wrote for the write that
        ``recorded`` (the row's pre-commit of the same write) does not list, from this attempt or
        earlier ones; with no row of the write, only what this attempt staged. Best effort: never raises."""
        ...

    def find_committed(self, pre_commit: PreCommit, since: datetime) -> VisibleEpoch:
        """Which tables already show (sink, epoch), by its marker, from a freshly loaded state."""
        ...

    def commit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        """Make ``plan.pre_commit`` visible, once per table; return every table's snapshot id or ``EMPTY``.

        ``plan`` comes from ``prepare`` or is built unprepared (``CommitPlan(pre_commit, replaces)``);
        either way every table is checked again, on prepared state only while it is fresh, before
        any is changed. Idempotent: a table already showing the write is skipped, so the same plan
        or a new one may be committed again. ``MissingDataFiles``, ``SchemaMismatch``,
        ``CommitRefused``, ``ForeignWriteVisible`` and ``MarkerHorizonExceeded`` are refusals;
        ``CommitOutcomeUnknown``, ``SinkUnavailable`` and ``CommitConflictExhausted`` are retryable
        and leave nothing to delete. With ``plan.replaces`` (a revision), each table's one snapshot
        also removes exactly that write's files; a sink that cannot do so atomically refuses.
        """
        ...

    def delete_replaced(
        self, pre_commit: PreCommit, removed_by: Mapping[str, str], recorded_at: datetime
    ) -> int | None:
        """Delete the files of a write a revision replaced, once nothing retained may list them.

        ``removed_by`` names per table the snapshot that removed them; ``None`` means not yet (the
        clean-up stays queued, and that is no failure).
        """
        ...

    def missing_files(self, pre_commit: PreCommit) -> Sequence[str]:
        """The write's data files that are gone from where its commit would read them.

        Raises ``AbortRefused`` where the write may already be partly visible (a file sink whose
        moves began), ``SinkUnavailable`` when storage cannot be asked.
        """
        ...

    def delete_write(self, pre_commit: PreCommit, since: datetime) -> int:
        """Delete the write's files if, on a fresh look, none is visible (invariant 4).

        Returns how many files were deleted; raises ``ForeignWriteVisible`` or
        ``AbortRefused`` instead of deleting anything that is or may be referenced.
        """
        ...

    def identities(self, pre_commit: PreCommit) -> Mapping[str, str]:
        """Per target of the write, what tells this incarnation of it from one re-created under the
        same name (an Iceberg table's UUID), as last seen by ``prepare``/``commit``; no I/O.

        A commit recorded against one identity proves nothing for another: a table dropped and
        re-created under the same name does not hold the epochs the old one held. Targets without
        such an identity (a file sink's directory) are left out.
        """
        ...


@runtime_checkable
class BatchCommitter(SinkCommitter, Protocol):
    """A committer that can make several epochs' appends visible in one sink commit, each epoch still
    with its own snapshot and marker (invariant 1), in epoch order: how recovery clears a backlog
    (``core/coordinator.py``). Optional: a committer without it commits every epoch on its own."""

    def prepare_batch(self, pre_commits: Sequence[PreCommit]) -> Sequence[CommitPlan | None]:
        """``SinkCommitter.prepare`` with ``FileCheck.EVERY_FILE`` for each write (recovery's check),
        a table loaded once; ``None``
        for a write that must be committed on its own (refused, or more than an append)."""
        ...

    def commit_batch(
        self, plans: Sequence[CommitPlan], since: Sequence[datetime], *, allow_beyond_horizon: bool = False
    ) -> Sequence[CommittedTables]:
        """``SinkCommitter.commit`` of every plan (``since[i]`` for ``plans[i]``), in order, landing per
        table whole or not at all; raises what ``commit`` raises, for the batch as a whole."""
        ...


@runtime_checkable
class AuditingCommitter(SinkCommitter, Protocol):
    """A committer that can commit a write where only its audit reads it, before publishing it
    (design.md D23): an Iceberg committer, on a branch of each table, one per epoch."""

    def audit_branch(self, pre_commit: PreCommit) -> str:
        """The name of the epoch's audit branch (the same in every table of the write)."""
        ...

    def commit_audit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        """``commit`` of the plan's write (a revision's: replacing ``plan.replaces``) onto its audit
        branch, made from the sink branch's head when it is missing or shows another write;
        idempotent by the marker on that branch. A fresh prepared plan is used as ``commit`` uses it."""
        ...

    def drop_audit(self, pre_commit: PreCommit, since: datetime) -> None:
        """Remove the write's audit branch and expire the audit snapshots of the write that no branch
        or tag reads any more, so that its files count as unreferenced again (invariant 4)."""
        ...


@runtime_checkable
class CheckpointSource(Protocol):
    """The upstream's word on an epoch (design.md, 'Checkpoint sources'). ``COMPLETED``/``FAILED`` are final."""

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus: ...

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus: ...
