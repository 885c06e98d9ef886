"""Every rule about what may happen to an epoch, as pure functions of its row and what they may ask.

The coordinator carries these decisions out (with the store's compare-and-swap guarding each step
against a concurrent attempt); the UI's and ``eo-sink``'s dry runs print them. Keeping the rules
and their refusal messages here, and only here, is what keeps a dry run from promising what the
real action would refuse.

A decision names an ``Action`` and, for a refusal, the error to raise. What a rule needs beyond the
row (the checkpoint, the sink's other epochs, the store's record of a write) it asks through
``core/lookups.py``, only when it needs the answer; an action and its dry run build those lookups
the same way, so they decide on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from .errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EarlierEpochUndecided,
    EpochAborted,
    ExactlyOnceError,
    InvalidPreCommit,
    ReprocessRefused,
    RevisionInProgress,
    SinkReused,
)
from .generations import OnReprocess, is_newer, is_older
from .input_ranges import range_read_elsewhere
from .lookups import CheckpointLookup, EpochLookups, WriteLookups
from .ports import EpochRecord
from .precommit import PreCommit
from .status import AbortCause, CheckpointStatus, EpochStatus
from .upsert_revisions import revision_refusal, untellable_revision
from .write_kinds import WriteKind


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
    newer generation (``core.generations``) than the row's replaces a committed one through a
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
                # before them (core.upsert_revisions); the commit checks what came after.
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
    """Upsert epochs of a sink commit in epoch order (design.md section 5, step 7): changes by key
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
        "ahead once they are committed or aborted (eo-sink show SINK EPOCH says why one waits)"
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
    refusal: ExactlyOnceError | None = upsert_order_refusal(row, lookups.pending)
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
    return _decide_after_completed(row, lookups)


def commits_in_batch(row: EpochRecord, decision: Decision) -> bool:
    """Whether recovery may commit the epoch together with its neighbours (``core/backlog.py``): one
    sink commit holding one marked snapshot per epoch, in epoch order, instead of one commit each.

    Only a kind that batches (``WriteKind.batches``: a plain append) qualifies; the others commit
    on their own, as does a write the sink cannot batch (``BatchCommitter.prepare_batch``). Nothing else about the epoch changes: the same
    decision (``recovery_decision``), the same commit decision by CAS before anything is visible.
    """
    if decision.action not in (Action.DECIDE_AND_COMMIT, Action.COMMIT_DECIDED):
        return False
    return row.kind.batches
