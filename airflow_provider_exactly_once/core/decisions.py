"""Every rule about what may happen to an epoch, as pure functions of its row and of what they ask
beyond it (``Lookups``, each asked only when a rule needs it): persist, commit, abort, recovery, the
rewrite of a conflicted upsert and the revision of a committed upsert (design.md D14), and the
requests each step of the coordinator takes (design.md, "Layers").

The coordinator carries these decisions out and the dry runs of the UI and ``eo-sink`` print them,
built on the same lookups: keeping the rules and their refusals here, and only here, keeps a dry run
from promising what the action would refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from airflow_provider_exactly_once.core.epochs import (
    AbortCause,
    AuditVerdict,
    CheckpointStatus,
    EpochStatus,
    OnReprocess,
    is_newer,
    is_older,
)
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    AuditNotPassed,
    CheckpointFailed,
    CheckpointNotReady,
    EarlierEpochUndecided,
    EpochAborted,
    ExactlyOnceError,
    InvalidPreCommit,
    MetaStoreUnavailable,
    ReprocessRefused,
    RevisionInProgress,
    RewriteRefused,
    SinkReused,
    SinkUnavailable,
    UpsertConflict,
)
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange, range_read_elsewhere
from airflow_provider_exactly_once.core.ports import (
    EMPTY,
    CheckpointSource,
    CommitPlan,
    CommittedTables,
    EpochRecord,
    Kind,
    SinkCommitter,
    SinkStateStore,
    WriteKind,
)
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import RevisionBasis

CheckpointLookup = Callable[[], CheckpointStatus]


@dataclass(frozen=True)
class EpochLookups:
    """What the commit's rules (and recovery's) ask beyond the epoch's row."""

    checkpoint: CheckpointLookup
    #: The sink's Pending epochs: asked only for an upsert write (the upsert order).
    pending: Callable[[], Iterable[int]]
    #: The sink's Committed rows: asked only for an upsert revision (``untellable_revision``).
    committed: Callable[[], Iterable[EpochRecord]]
    #: Another epoch, committed or decided, whose range starts where the given one does: asked only
    #: for an incremental input's write (``core.input_ranges``).
    range_taken: Callable[[SnapshotRange], int | None] = lambda _: None
    #: Whether the sink is audited: its writes are published only after their audit passed (D23).
    audited: bool = False

    @classmethod
    def of(
        cls, store: SinkStateStore, checkpoints: CheckpointSource, sink_id: str, epoch: int, *, audited: bool = False
    ) -> EpochLookups:
        return cls(
            audited=audited,
            checkpoint=lambda: checkpoints.status(sink_id, epoch),
            pending=lambda: [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.PENDING)],
            committed=lambda: store.epochs_with_status(sink_id, EpochStatus.COMMITTED),
            range_taken=lambda reserved: store.input_ranges.sharing_start(sink_id, epoch, reserved),
        )


@dataclass(frozen=True)
class WriteLookups:
    """What persist's rules ask beyond the epoch's row about the write being persisted."""

    #: The write's tables' identities now: asked only of a Committed epoch (``recreated_tables``).
    identities: Callable[[], Mapping[str, str]]
    #: Whether the write was ever queued for clean-up: it must then never become the epoch's.
    discarded: Callable[[], bool]
    #: Whether a revision's commit replaced the write: asked only of an epoch ever revised.
    replaced: Callable[[], bool]
    #: The sink's Committed rows: asked only for an upsert revision (``untellable_revision``).
    committed: Callable[[], Iterable[EpochRecord]]

    @classmethod
    def of(cls, store: SinkStateStore, committer: SinkCommitter, write: PreCommit) -> WriteLookups:
        sink_id, epoch, write_id = write.sink_id, write.epoch, write.write_id
        return cls(
            identities=lambda: committer.identities(write),
            discarded=lambda: store.write_discarded(sink_id, epoch, write_id),
            replaced=lambda: store.revisions.was_replaced(sink_id, epoch, write_id),
            committed=lambda: store.epochs_with_status(sink_id, EpochStatus.COMMITTED),
        )


#: Where the rule is explained to operators; every refusal points there.
DOCUMENTED = "docs/operators.md, 'Reprocessing an upsert epoch'"


def revised_write(
    row: EpochRecord | None, generation: str | None, on_reprocess: str
) -> tuple[str, PreCommit, CommittedTables, Mapping[str, str]] | None:
    """The committed upsert write a write of ``generation`` would replace: its id, pre-commit,
    snapshots and tables' identities; ``None`` when such a write would not revise the epoch.

    A Committed epoch is revised by a newer generation (persist opens the revision). A revision in
    flight (Pending, ``replaces`` set) is written again by its own generation or a newer one (a retry,
    a rewrite after a conflict): that write still replaces the committed write, not the Pending one.
    """
    if on_reprocess != "replace" or row is None or generation is None:
        return None
    if row.status is EpochStatus.COMMITTED and is_newer(generation, row.pre_commit.generation):
        replaced = (row.write_id, row.pre_commit, row.committed or {}, row.table_uuids or {})
    elif row.status is EpochStatus.PENDING and (was := row.kind.replaces) is not None:
        if is_older(generation, row.pre_commit.generation):
            return None
        replaced = (was.write_id, was.pre_commit, was.committed, was.table_uuids or {})
    else:
        return None
    if not WriteKind.of(replaced[1]).by_key:
        return None
    return replaced


def revision_basis(
    row: EpochRecord | None, generation: str | None, on_reprocess: str
) -> Mapping[str, RevisionBasis] | None:
    """Per table, what a write of ``generation`` is planned against when it revises the epoch's
    committed changes (``revised_write``); ``None``: it is an ordinary write."""
    found = revised_write(row, generation, on_reprocess)
    if found is None:
        return None
    write_id, pre_commit, committed, identities = found
    return {
        t.table: _basis(write_id, t, committed.get(t.table), identities.get(t.table))
        for t in pre_commit.tables
        if Kind.of_table(t).by_key
    }


def _basis(write_id: str, written: TableWrite, committed: str | None, table_uuid: str | None) -> RevisionBasis:
    revised = {
        "table_uuid": table_uuid,
        "write_id": write_id,
        "added": list(written.data_files.paths()),
        "rewritten": [r.path for r in written.rewritten],
        "key_lower_bounds": written.key_lower_bounds,
        "key_upper_bounds": written.key_upper_bounds,
    }
    if written.revises is not None or committed is None or committed == EMPTY or not _is_id(committed):
        # A revision was itself planned at P, which it read; a write that committed nothing here
        # changed nothing, so the table it read is as good a P as any (the commit checks the rest).
        return RevisionBasis(**revised, snapshot_id=written.read_snapshot_id)
    return RevisionBasis(**revised, parent_of=int(committed))


def _is_id(text: str) -> bool:
    return text.lstrip("-").isdigit()


def revision_refusal(write: PreCommit, committed_write_id: str, committed: PreCommit) -> str | None:
    """Why ``write`` (a newer generation's) cannot revise the epoch's committed upsert write, in
    words that end an error message; ``None`` when it can."""
    if not (WriteKind.of(write).by_key and WriteKind.of(committed).by_key):
        kinds = {"committed": committed, "new": write}
        shown = ", ".join(
            f"the {name} write {'is' if WriteKind.of(w).by_key else 'is not'} changes by key"
            for name, w in kinds.items()
        )
        return (
            f"the sink's mode changed between the two writes ({shown}); an epoch committed as changes by key is "
            "revised only by changes by key, and an epoch of rows only by rows. Restore the sink's mode, or give "
            f"the new pipeline its own sink_id ({DOCUMENTED})"
        )
    unplanned = sorted(t.table for t in write.tables if t.revises is None)
    if unplanned:
        return (
            f"its changes to {unplanned} were planned against the table as it is now, not as it was before write "
            f"{committed_write_id}, so they cannot replace that write's changes (the write task did not find the "
            "epoch committed when it ran, or an older version of the package wrote it). Run the epoch again "
            f"(clear its run): its write is then planned as a revision ({DOCUMENTED})"
        )
    other = sorted({t.revises.write_id for t in write.tables if t.revises and t.revises.write_id != committed_write_id})
    if other:
        return (
            f"it was planned as a revision of write {other[0]}, but the epoch is committed with write "
            f"{committed_write_id} now (another revision committed meanwhile). Run the epoch again (clear its run) "
            f"to revise what the table shows ({DOCUMENTED})"
        )
    return None


def later_deletes_refusal(write: PreCommit, committed: Iterable[EpochRecord]) -> str | None:
    """Why a revision cannot be told well defined from the meta store, when the table cannot tell.

    A later epoch's delete of a key the table did not hold leaves no file behind, so the commit's
    checks against the table never see it; yet had this revision inserted that key, the later
    delete would have removed it. ``committed``: the sink's Committed epochs (their counts say
    whether such deletes happened). ``None`` when no later epoch of the revised tables made one.
    """
    tables = {t.table for t in write.tables if t.revises is not None}
    later = sorted(
        {
            row.epoch
            for row in committed
            if row.epoch > write.epoch
            for t in row.pre_commit.tables
            if t.table in tables and t.changes is not None and t.changes.deletes_of_absent_keys
        }
    )
    if not later:
        return None
    shown = ", ".join(str(e) for e in later[:5]) + (f" (and {len(later) - 5} more)" if len(later) > 5 else "")
    return (
        f"later epoch(s) {shown} deleted keys the table did not hold; such a delete leaves nothing in the table, so "
        "whether this revision inserts one of those keys (which the later delete would have removed) cannot be "
        f"told. Correct the keys with a new epoch's changes instead ({DOCUMENTED})"
    )


def untellable_revision(write: PreCommit, committed: Callable[[], Iterable[EpochRecord]]) -> ReprocessRefused | None:
    """An upsert revision the table cannot prove well defined (``later_deletes_refusal``), at persist
    and again before its commit decision (a later epoch may have committed since). The sink's
    Committed rows are asked for only of an upsert revision."""
    if not any(t.revises is not None for t in write.tables):
        return None
    why = later_deletes_refusal(write, committed())
    return None if why is None else ReprocessRefused(f"{write.describe()}: revision refused: {why}")


class Action(StrEnum):
    """What to do with an epoch. Refusals carry their error in ``Decision.error``."""

    REFUSE = "refuse"
    # persist
    INSERT = "insert the Pending row"
    KEEP = "keep: this write is already the epoch's"
    ALREADY_REPLACED = "nothing: a revision replaced this write, and its files wait in the clean-up queue"
    REPLACE = "replace the earlier, undecided write"
    REOPEN = "re-open the Committed epoch for the re-created table"
    DISCARD_LATE = "discard the late write: the epoch is committed with an earlier one"
    DISCARD_UNDER_COMMIT = "discard the late write: the commit of an earlier one is decided"
    DISCARD_OTHER_TABLES = "discard the write: the epoch was committed to other tables"
    DISCARD_REFUSED = "discard the newer generation's write and refuse: it cannot replace the upsert epoch's changes"
    DISCARD_OLDER = "discard the write: a newer generation's write holds the epoch"
    DISCARD_KEPT = "discard the newer generation's write: the sink keeps what it committed (on_reprocess='keep')"
    REVISE = "open a revision: the newer generation's write replaces the committed one once it commits"
    # commit (and persist and abort of the write an epoch committed)
    ALREADY_COMMITTED = "nothing: already committed"
    DECIDE_AND_COMMIT = "validate, record the commit decision, commit"
    COMMIT_DECIDED = "commit the decided write"
    # abort
    RECORD_NO_WRITE = "record the epoch as Aborted without a write"
    TOMBSTONE = "record the unpersisted write as Aborted, remove its files"
    REMOVE_OTHER_WRITE = "remove the files of a write that is not the epoch's"
    ALREADY_ABORTED = "nothing: already aborted (run its queued clean-ups)"
    GIVE_UP_LOST_FILES = "abort the write whose files are lost, once that is checked"
    ABORT = "mark Aborted, remove the write's files"
    ABORT_REVISION = "give up the revision: the write it replaces stays visible and the epoch Committed"
    # recovery
    WAIT = "wait for the checkpoint"
    COMMIT_AUDIT = "commit the write to its audit branch"
    ALREADY_AUDITED = "nothing: the write is on its audit branch already, or its publish decided"
    WAIT_FOR_AUDIT = "wait for the audit: it has not run, or it failed (reprocess or reject the epoch)"
    # rewrite after an upsert conflict
    REWRITE = "write the epoch again: its write conflicts with the table, the next write replaces it"
    GIVE_UP_AND_REWRITE = "give up the decided write (it can never be committed) and write the epoch again"


@dataclass(frozen=True)
class Decision:
    action: Action
    #: The error to raise: for ``REFUSE`` before anything is done, for ``DISCARD_OTHER_TABLES``
    #: once the write's files are removed.
    error: ExactlyOnceError | None = None
    #: Why, in words an operator reads in a dry run (the checkpoint's status, the decision time).
    why: str = ""
    #: For an action that marks the epoch Aborted: the cause recorded on the row.
    cause: AbortCause | None = None

    def raise_if_refused(self) -> Decision:
        if self.action is Action.REFUSE and self.error is not None:
            raise self.error
        return self


def refuse(error: ExactlyOnceError) -> Decision:
    return Decision(Action.REFUSE, error)


def epoch_name(row: EpochRecord) -> str:
    return f"sink {row.sink_id!r} epoch {row.epoch}"


# -- persist ------------------------------------------------------------------------------------------


def persist_decision(
    row: EpochRecord | None,
    write: PreCommit,
    lookups: WriteLookups,
    *,
    on_reprocess: OnReprocess = "keep",
) -> Decision:
    """What a persist of ``write`` does to the epoch's row as it is now.

    A table re-created since the epoch's commit makes the old commit prove nothing. A write of a
    newer generation (``core.epochs``) than the row's replaces a committed one through a
    revision when the sink's ``on_reprocess`` is ``"replace"``; a write of an older one (a zombie of
    a run since cleared) never takes the epoch. A write a revision replaces is settled (``_replaced``).
    """
    if not write.written:
        return refuse(
            InvalidPreCommit(f"{write.describe()}: a write lists at least one table; this is the record of an abort")
        )
    if row is None:
        return Decision(Action.INSERT)
    if row.write_id == write.write_id:
        if row.status is EpochStatus.ABORTED:
            return refuse(
                EpochAborted(
                    f"{write.describe()} was aborted and its files removed; run the write again for a new write"
                )
            )
        return Decision(Action.ALREADY_COMMITTED if row.status is EpochStatus.COMMITTED else Action.KEEP)
    if (settled := _replaced(row, write, lookups.replaced)) is not None:
        return settled
    if row.status is EpochStatus.COMMITTED:
        committed_to = sorted(t.table for t in row.pre_commit.tables)
        targets = sorted(t.table for t in write.tables)
        if committed_to != targets:
            return Decision(
                Action.DISCARD_OTHER_TABLES,
                SinkReused(
                    f"{write.describe()} targets {targets}, but the sink's epoch {write.epoch} was committed to "
                    f"{committed_to} (write {row.write_id}, DAG {row.dag_id or 'unknown'}, run "
                    f"{row.run_id or 'unknown'}); the new write was removed. A sink id names one destination "
                    "for its whole history: give the new pipeline or table its own sink_id"
                ),
            )
        recreated = recreated_tables(row, lookups.identities())
        if recreated:
            return refuse(discarded_error(write)) if lookups.discarded() else Decision(Action.REOPEN, why=recreated)
        if is_newer(write.generation, row.pre_commit.generation):
            newer = f"generation {write.generation} is newer than the committed write's ({row.pre_commit.generation})"
            upsert = WriteKind.of(write).by_key or row.kind.by_key
            refusal = revision_refusal(write, row.write_id, row.pre_commit) if upsert else None
            if on_reprocess == "replace" and refusal is not None:
                # Changes by key replace the committed ones only when planned against the table
                # before them (core.decisions); the commit checks what came after.
                return Decision(
                    Action.DISCARD_REFUSED,
                    ReprocessRefused(
                        f"{write.describe()}: {newer}, but {refusal}. The new write was removed; the epoch keeps "
                        f"write {row.write_id} and the table what it shows"
                    ),
                )
            if on_reprocess == "replace":
                if lookups.discarded():
                    return refuse(discarded_error(write))
                untellable = untellable_revision(write, lookups.committed)
                if untellable is not None:
                    return Decision(Action.DISCARD_REFUSED, untellable)
                return Decision(
                    Action.REVISE, why=f"{newer}: revision {row.revision + 1} will replace write {row.write_id}"
                )
            return Decision(
                Action.DISCARD_KEPT,
                why=f"{newer}, but the sink keeps what it committed (on_reprocess='keep'): write {row.write_id} "
                "stays, the new write was removed",
            )
        return Decision(Action.DISCARD_LATE, why=f"epoch committed with write {row.write_id}")
    if is_older(write.generation, row.pre_commit.generation):
        return Decision(
            Action.DISCARD_OLDER,
            why=f"write {row.write_id} of the newer generation {row.pre_commit.generation} holds the epoch "
            f"(this write's: {write.generation})",
        )
    if row.status is EpochStatus.PENDING and row.commit_decided_at is not None:
        if is_newer(write.generation, row.pre_commit.generation):
            return refuse(
                RevisionInProgress(
                    f"{write.describe()} of generation {write.generation} is newer than write {row.write_id}, whose "
                    "commit is under way; retry once it is committed, and this write replaces it"
                )
            )
        return Decision(Action.DISCARD_UNDER_COMMIT, why=f"epoch holds write {row.write_id}, its commit decided")
    return refuse(discarded_error(write)) if lookups.discarded() else Decision(Action.REPLACE)


def _replaced(row: EpochRecord, write: PreCommit, replaced: Callable[[], bool]) -> Decision | None:
    """A write a Pending revision replaces (its row names it) or a committed one replaced (the store's
    record, asked only of an epoch ever revised) is settled: the revision's commit queues its files
    to wait for snapshot expiry (D12), and a second clean-up of it could never succeed."""
    if row.kind.replaced_write_id == write.write_id or (row.revision > 0 and replaced()):
        return Decision(Action.ALREADY_REPLACED, why=f"the epoch holds write {row.write_id} of revision {row.revision}")
    return None


def write_kept(row: EpochRecord | None, generation: str | None, on_reprocess: OnReprocess) -> str | None:
    """Why a write task may skip its work: the sink keeps the epoch as committed (``"keep"``), and a
    write of this newer generation would only be discarded by persist. ``None``: write."""
    if on_reprocess != "keep" or row is None or row.status is not EpochStatus.COMMITTED:
        return None
    if not is_newer(generation, row.pre_commit.generation):
        return None
    return (
        f"{epoch_name(row)} is committed with write {row.write_id} ({row.pre_commit.record_count} row(s)) and the sink "
        "keeps what it committed (on_reprocess='keep'): this run's newer generation writes nothing and applies "
        "nothing new. To replace the epoch, give the sink on_reprocess='replace'"
    )


def other_dag_warning(pre: PreCommit, row: EpochRecord, dag_id: str | None) -> str | None:
    """What to tell when a write from another DAG meets an epoch already settled: the sink id may be
    reused by mistake, and that pipeline's epochs are then not being written. ``None``: same DAG."""
    if dag_id is None or row.dag_id is None or dag_id == row.dag_id:
        return None
    return (
        f"sink {pre.sink_id!r} epoch {pre.epoch} holds write {row.write_id} of DAG {row.dag_id!r}; a write "
        f"from DAG {dag_id!r} was discarded. If another pipeline reuses this sink id, give it its own "
        "sink_id: its epochs are not being written"
    )


def upsert_order_refusal(row: EpochRecord, pending_epochs: Callable[[], Iterable[int]]) -> EarlierEpochUndecided | None:
    """Upsert epochs of a sink commit in epoch order (design.md, 'The Iceberg commit', step 7): changes by key
    applied out of order would leave an older state of a key visible. ``pending_epochs``: the sink's
    undecided epochs, listed only for an upsert write (a backlog of appends must not list its Pending
    rows at every commit). Asked before a commit is decided; a decided commit goes on."""
    if not row.kind.in_epoch_order:
        return None
    earlier = sorted(epoch for epoch in pending_epochs() if epoch < row.epoch)
    if not earlier:
        return None
    shown = ", ".join(str(e) for e in earlier[:5]) + (f" (and {len(earlier) - 5} more)" if len(earlier) > 5 else "")
    return EarlierEpochUndecided(
        f"{row.pre_commit.describe()}: upsert epochs commit in epoch order, and {len(earlier)} earlier epoch(s) of "
        f"the sink are still undecided (Pending): {shown}. Nothing was committed; the commit is retried, and goes "
        "ahead once they are committed or aborted (eo-sink show SINK EPOCH says why one waits; on an audited sink, "
        "an epoch whose audit failed holds the later ones until it is reprocessed or rejected)"
    )


def discarded_error(write: PreCommit) -> EpochAborted:
    """A write whose files were handed to clean-up must never become the epoch's write."""
    return EpochAborted(
        f"{write.describe()} was discarded (aborted or replaced) and its files removed; run the write again for a new write"
    )


def recreated_tables(row: EpochRecord, identities: Mapping[str, str]) -> str | None:
    """Why the epoch's commit proves nothing any more, when a table it went into was re-created.

    Rows committed before identities were recorded have none: for them nothing can be told, and
    the commit stands as before.
    """
    if not row.table_uuids:
        return None
    changed = [
        f"{table} (was {before}, now {identities[table]})"
        for table, before in sorted(row.table_uuids.items())
        if table in identities and identities[table] != before
    ]
    if not changed:
        return None
    return (
        f"sink {row.sink_id!r} epoch {row.epoch} was committed by write {row.write_id} into a table since "
        f"dropped and re-created: {', '.join(changed)}; the epoch is re-opened for the new write"
    )


# -- commit -------------------------------------------------------------------------------------------


def commit_decision(row: EpochRecord, lookups: EpochLookups) -> Decision:
    """Commit only what the checkpoint completed, or what was decided already (invariant 2); upsert
    epochs in epoch order, and an upsert revision only while it can be told well defined.

    The sink's own checks (``SinkCommitter.prepare``: the schema, a revision's replaced files, an
    upsert's conflicts) follow in the commit; everything decided on the meta store's record is
    decided here."""
    if row.status is EpochStatus.COMMITTED:
        return Decision(Action.ALREADY_COMMITTED, why=f"write {row.write_id} is committed")
    if row.status is EpochStatus.ABORTED:
        return refuse(EpochAborted(f"{epoch_name(row)} is Aborted: it cannot be committed"))
    if row.commit_decided_at is not None:
        return Decision(Action.COMMIT_DECIDED, why=f"commit decided at {row.commit_decided_at.isoformat()}")
    status = lookups.checkpoint()
    if status is CheckpointStatus.FAILED:
        return refuse(CheckpointFailed(f"{epoch_name(row)}: checkpoint FAILED; the epoch must be aborted"))
    if status is CheckpointStatus.PENDING:
        return refuse(CheckpointNotReady(f"{epoch_name(row)}: checkpoint still PENDING"))
    return _decide_after_completed(row, lookups)


def _decide_after_completed(row: EpochRecord, lookups: EpochLookups) -> Decision:
    """The rules that still hold an undecided epoch back once its checkpoint COMPLETED. A decided
    commit goes on whatever they say: it was decided under them."""
    refusal: ExactlyOnceError | None = audit_refusal(row) if lookups.audited else None
    if refusal is None:
        refusal = upsert_order_refusal(row, lookups.pending)
    if refusal is None and row.kind.revises:
        refusal = untellable_revision(row.pre_commit, lookups.committed)
    if refusal is None:
        refusal = range_read_elsewhere(row.sink_id, row.epoch, row.pre_commit.source_positions, lookups.range_taken)
    return refuse(refusal) if refusal is not None else Decision(Action.DECIDE_AND_COMMIT, why="checkpoint COMPLETED")


# -- abort --------------------------------------------------------------------------------------------


def abort_decision(
    row: EpochRecord | None,
    write: PreCommit | None,
    checkpoint: CheckpointLookup,
    *,
    replaced: Callable[[], bool],
    force: bool = False,
    files_lost: bool = False,
) -> Decision:
    """Never abort against a commit decision, nor (unless forced) a write whose checkpoint completed.

    ``write`` is the write being given up (an abort task's own); ``None`` means the epoch's. A
    decided write is given up only when its files are lost (``files_lost``), which the coordinator
    then checks against the sink (``TwoPhaseCommitCoordinator.lost_files``). A write a revision
    replaces is settled (``_replaced``).
    """
    if row is None:
        # Recorded even without a write, so that the abort and its reason are seen in the UI and eo-sink.
        return Decision(Action.RECORD_NO_WRITE if write is None else Action.TOMBSTONE, cause=AbortCause.GIVEN_UP)
    if write is not None and write.write_id != row.write_id:
        return _replaced(row, write, replaced) or Decision(Action.REMOVE_OTHER_WRITE)
    if row.status is EpochStatus.COMMITTED:
        return Decision(Action.ALREADY_COMMITTED, why=f"write {row.write_id} is committed")
    if row.status is EpochStatus.ABORTED:
        return Decision(Action.ALREADY_ABORTED)
    if files_lost:
        return Decision(Action.GIVE_UP_LOST_FILES, cause=AbortCause.FILES_LOST)
    if row.commit_decided_at is not None:
        return refuse(
            AbortRefused(
                f"{epoch_name(row)}: the commit of write {row.write_id} was decided at "
                f"{row.commit_decided_at.isoformat()}; it will be committed (commit task or recovery), not "
                "aborted. Only if its data files are lost for good: abort with files_lost=True "
                "(eo-sink abort SINK EPOCH --reason ... --files-lost)"
            )
        )
    if row.kind.revises:
        # The epoch stays committed with the write the revision would replace (invariant 3 holds),
        # so a completed checkpoint does not hold a revision that its run gave up.
        return Decision(
            Action.ABORT_REVISION, why=f"revision {row.revision} given up; write {row.kind.replaced_write_id} stays"
        )
    if force:
        return Decision(Action.ABORT, why="forced", cause=AbortCause.FORCED)
    status = checkpoint()
    if status is CheckpointStatus.COMPLETED:
        return refuse(
            AbortRefused(
                f"{epoch_name(row)}: checkpoint COMPLETED, so the epoch must be committed; "
                "abort with force=True only to drop its data on purpose"
            )
        )
    failed = status is CheckpointStatus.FAILED
    return Decision(
        Action.ABORT,
        why=f"checkpoint {status.value}",
        cause=AbortCause.CHECKPOINT_FAILED if failed else AbortCause.GIVEN_UP,
    )


def files_lost_refusal(row: EpochRecord, visible_tables: list[str], missing: list[str]) -> AbortRefused | None:
    """Giving up a write for lost files is refused while it is partly visible or nothing is lost."""
    what = row.pre_commit.describe()
    if visible_tables:
        return AbortRefused(
            f"{what}: table(s) {', '.join(sorted(visible_tables))} already show the epoch, so it is partly "
            "visible; restore the missing files and commit it (eo-sink commit SINK EPOCH)"
        )
    if not missing:
        return AbortRefused(
            f"{what}: every data file of the write is in storage, so nothing is lost; commit it (eo-sink commit SINK EPOCH)"
        )
    return None


# -- recovery -----------------------------------------------------------------------------------------


def audit_decision(row: EpochRecord, lookups: EpochLookups) -> Decision:
    """Commit an audited sink's write to its audit branch once its checkpoint completed (design.md
    D23): the checks then read the epoch as it would be published. Once there, or once its publish is
    decided, nothing more; a write of an epoch already published has nothing left to audit."""
    if row.status is EpochStatus.COMMITTED:
        return Decision(Action.ALREADY_COMMITTED, why=f"write {row.write_id} is published")
    if row.status is EpochStatus.ABORTED:
        return refuse(EpochAborted(f"{epoch_name(row)} is Aborted: it cannot be audited"))
    if row.commit_decided_at is not None or row.audit_of_write is not None:
        return Decision(Action.ALREADY_AUDITED, why=f"write {row.write_id} is on its audit branch")
    status = lookups.checkpoint()
    if status is CheckpointStatus.FAILED:
        return refuse(CheckpointFailed(f"{epoch_name(row)}: checkpoint FAILED; the epoch must be aborted"))
    if status is CheckpointStatus.PENDING:
        return refuse(CheckpointNotReady(f"{epoch_name(row)}: checkpoint still PENDING"))
    return Decision(Action.COMMIT_AUDIT, why="checkpoint COMPLETED")


def audit_refusal(row: EpochRecord) -> AuditNotPassed | None:
    """An audited sink publishes a write only after its audit passed (D23); asked before the
    publish is decided, so a decided publish goes on whatever a later audit says."""
    audit = row.audit_of_write
    if audit is None:
        return AuditNotPassed(
            f"{row.pre_commit.describe()}: the sink is audited, and the write was not committed to its audit "
            "branch yet: its audit has not run"
        )
    if audit.verdict is None:
        return AuditNotPassed(f"{row.pre_commit.describe()}: its audit on branch {audit.branch} has not concluded")
    if audit.verdict is AuditVerdict.FAILED:
        return AuditNotPassed(
            f"{row.pre_commit.describe()}: its audit failed ({audit.failing()}); main is untouched. Reprocess the "
            f"run to write the epoch again, or reject it (eo-sink reject {row.sink_id} {row.epoch})"
        )
    return None


def recovery_decision(row: EpochRecord, lookups: EpochLookups) -> Decision:
    """A Pending epoch after a crash: commit what was decided or completed, abort what failed. What
    the commit would refuse (``commit_decision``) is refused here, so a dry run lists it as refused."""
    if row.commit_decided_at is not None:
        return Decision(Action.COMMIT_DECIDED, why=f"commit decided at {row.commit_decided_at.isoformat()}")
    status = lookups.checkpoint()
    if status is CheckpointStatus.PENDING:
        return Decision(Action.WAIT)
    if status is CheckpointStatus.FAILED:
        action = Action.ABORT_REVISION if row.kind.revises else Action.ABORT
        return Decision(action, why="checkpoint FAILED", cause=AbortCause.CHECKPOINT_FAILED)
    if lookups.audited and (held := audit_refusal(row)) is not None:
        return Decision(Action.WAIT_FOR_AUDIT, why=str(held))
    return _decide_after_completed(row, lookups)


def commits_in_batch(row: EpochRecord, decision: Decision) -> bool:
    """Whether recovery may commit the epoch together with its neighbours (``core/coordinator.py``): one
    sink commit holding one marked snapshot per epoch, in epoch order, instead of one commit each.

    Only a kind that batches (``WriteKind.batches``: a plain append) qualifies; the others commit
    on their own, as does a write the sink cannot batch (``BatchCommitter.prepare_batch``). Nothing else about the epoch changes: the same
    decision (``recovery_decision``), the same commit decision by CAS before anything is visible.
    """
    if decision.action not in (Action.DECIDE_AND_COMMIT, Action.COMMIT_DECIDED):
        return False
    return row.kind.batches


#: How the reason recorded on a write given up for a rewrite begins, for operators; the rewrite
#: task recognises such an abort by its cause (``AbortCause.UPSERT_CONFLICT``), not these words.
REWRITE_REASON = "upsert conflict: the epoch is written again"

ConflictLookup = Callable[[], UpsertConflict | None]


def persist_conflict_abort(conflict: UpsertConflict, checkpoint: CheckpointLookup) -> tuple[AbortCause, str]:
    """The cause and reason persist records when it gives up an upsert write whose table moved under
    it: given up for a rewrite (the group's rewrite task writes the epoch again), unless the
    checkpoint already FAILED, when no rewrite follows (``rewrite_decision``) and the record says
    why the epoch ended."""
    try:
        failed = checkpoint() is CheckpointStatus.FAILED
    except (MetaStoreUnavailable, SinkUnavailable):
        failed = False  # the rewrite task reads it again, and refuses then
    if failed:
        return AbortCause.CHECKPOINT_FAILED, f"checkpoint FAILED; the write also conflicted: {conflict}"
    return AbortCause.UPSERT_CONFLICT, f"{REWRITE_REASON}: {conflict}"


def rewrite_decision(
    row: EpochRecord,
    run_writes: Collection[str],
    conflict: ConflictLookup,
    checkpoint: CheckpointLookup,
    shown: Callable[[], list[str]],
) -> Decision:
    """Whether a rewrite task writes the epoch again after its persist or commit failed (design.md D14).

    Only a write that can never be committed as written is written again: an upsert write whose
    table moved under it (``conflict`` checks that against the table now), or one that persist
    already gave up for that reason. A commit that failed for any other reason keeps its write,
    which a retry of the commit can still make visible; writing again would only discard it. A
    decided write is given up first (``files_lost``), because the next write's persist cannot replace
    it, unless a table shows it (``shown``): the conflict is then its own commit, which crashed before
    the row was marked. A failed checkpoint is never written again,
    nor a revision of a committed epoch (``core.decisions``): it conflicts with what was
    committed after the epoch, which a new write meets again. ``run_writes`` are the writes of this
    run: an epoch committed with another write means this run's was refused, which the run must show.
    """
    if row.status is EpochStatus.COMMITTED:
        if row.write_id in run_writes:
            return Decision(Action.ALREADY_COMMITTED, why=f"write {row.write_id} of this run is committed")
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)} is committed with write {row.write_id}, which is not one of this run's "
                f"({', '.join(sorted(run_writes)) or 'none'}): this run's write was refused or discarded, and "
                "writing it again would meet the same refusal; the failed task upstream says why"
            )
        )
    if row.kind.revises:
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)}: revision {row.revision} (write {row.write_id}) conflicts with the table; a revision "
                f"of an upsert epoch meets the same later changes when written again. Give it up (eo-sink abort "
                f"{row.sink_id} {row.epoch} --reason ...; add --files-lost once its commit was decided): "
                f"write {row.kind.replaced_write_id} stays committed"
            )
        )
    if row.status is EpochStatus.ABORTED and row.abort_cause is not AbortCause.UPSERT_CONFLICT:
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)} is Aborted ({row.error or 'no reason recorded'}), not for an upsert conflict; "
                "nothing is written again here. Clear the run to write the epoch again once its input is right"
            )
        )
    if row.commit_decided_at is None and checkpoint() is CheckpointStatus.FAILED:
        return refuse(RewriteRefused(f"{epoch_name(row)}: checkpoint FAILED; the epoch is aborted, not written again"))
    if row.status is EpochStatus.ABORTED:
        return Decision(Action.REWRITE, why=f"write {row.write_id} was given up: {row.error}")
    if not row.kind.rewritable:
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)}: write {row.write_id} is not an upsert; only an upsert conflict is rewritten"
            )
        )
    found = conflict()
    if found is None:
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)}: write {row.write_id} can still be committed (its commit failed for another reason: "
                f"{row.error or 'see the commit task log'}); it is kept, not written again. Clear the commit task "
                f"or run eo-sink commit {row.sink_id} {row.epoch}"
            )
        )
    if row.commit_decided_at is None:
        return Decision(Action.REWRITE, why=str(found))
    if visible := shown():
        why = f"table(s) {', '.join(sorted(visible))} show the commit of write {row.write_id}, decided"
        return refuse(
            RewriteRefused(
                f"{epoch_name(row)}: {why}; it is not written again. Commit it (eo-sink commit {row.sink_id} {row.epoch}, "
                "or the recovery DAG): the commit finds it there and marks the epoch Committed"
            )
        )
    return Decision(Action.GIVE_UP_AND_REWRITE, why=str(found))


class RunAttempt(TypedDict):
    """The task attempt a write came from, as each of the store's persist transitions records it."""

    run_id: str | None
    try_number: int | None
    dag_id: str | None


@dataclass(frozen=True)
class PersistRequest:
    """One persist: the write, the task attempt that made it, and what the sink checked of it."""

    pre: PreCommit
    attempt: RunAttempt
    #: ``SinkCommitter.prepare``'s plan, for a step that records the write to stage it.
    plan: CommitPlan
    #: The write as staged (``SinkCommitter.stage``), once a step did: at most once per persist.
    staged: list[PreCommit] = field(default_factory=list)


@dataclass(frozen=True)
class AbortRequest:
    """One abort: of which epoch and write (``None``: the epoch's), why, and by which DAG."""

    sink_id: str
    epoch: int
    reason: str
    write: PreCommit | None
    dag_id: str | None
    cause: AbortCause | None


def revision_plan(plan: CommitPlan, committed: EpochRecord) -> CommitPlan:
    """``plan`` as the revision of the Committed row ``committed``, for persist to stage the
    revision's deletions with its write."""
    return dataclasses.replace(plan, replaces=committed.as_replaced())


__all__ = ["AbortRequest", "PersistRequest", "RunAttempt", "revision_plan"]
