"""Whether an upsert epoch is written again after its write conflicted with the table (design.md
D14): the rewrite task's decision, and the cause persist records when it gives such a write up.

Apart from the other steps' decisions (``core/decisions.py``) because only changes by key can
conflict so, and because what it asks (whether the write still conflicts, whether a table shows
it) is the sink's, through the lookups ``lost_writes.prepare_rewrite`` builds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from .decisions import Action, Decision, epoch_name, refuse
from .errors import MetaStoreUnavailable, RewriteRefused, SinkUnavailable, UpsertConflict
from .lookups import CheckpointLookup
from .ports import EpochRecord
from .status import AbortCause, CheckpointStatus, EpochStatus

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
    nor a revision of a committed epoch (``core.upsert_revisions``): it conflicts with what was
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
