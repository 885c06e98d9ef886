"""The two-phase-commit coordinator: the whole life of one epoch, in the order it happens.

    write (Spark) ──► persist ──► checkpoint COMPLETED? ──► decide commit ──► commit ──► mark Committed
                          │                │
                          │                └── FAILED (or given up) ──► mark Aborted ──► delete the write's files
                          └── a later write for the same epoch: replaces a Pending one (the old files are
                              cleaned), or is cleaned itself when the epoch is already decided or committed

Every method is idempotent and safe to run concurrently with itself (a retry racing a zombie): each
status change is a compare-and-swap in the store, and each sink commit is guarded by the marker in
the sink. The one ordering rule that makes the pieces safe together is the *commit decision*: a
commit first records, durably and by CAS, that this write will be committed (only once the
checkpoint is COMPLETED); from then on no abort and no replacing write can win, and until then no
byte of the write is visible. So abort and commit can never both act on one write, and a file is
only ever deleted for a write that can no longer become visible (invariant 4).

The coordinator alone decides what happens to an epoch; operators, the recovery DAG and the CLI only
call these methods. Orphaned write locations belong to no epoch: ``eo-sink gc`` and recovery queue
them under the reserved epoch and delete them through the same clean-up path (``core.cleanups``)
with the sink's committer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta

from .bookkeeping import note_error, record_warning, require_epoch, warn_other_dag
from .cleanups import clean_up, run_cleanups
from .decisions import Action, Decision, abort_decision, commit_decision, persist_decision
from .errors import AbortRefused, InvalidPreCommit, InvalidSinkConfig, StateConflict, UpsertConflict
from .faults import FaultHook, no_faults
from .generations import OnReprocess
from .identifiers import check_epoch, check_sink_id
from .lookups import EpochLookups, WriteLookups
from .lost_writes import lost_files, prepare_rewrite
from .observe import COMMIT_ERRORS, NO_METRICS, Metrics, count_abort, count_commit, safe
from .outcomes import (
    KEPT_OUTCOMES,
    AbortOutcome,
    AbortResult,
    CleanupReport,
    CommitOutcome,
    CommitResult,
    PersistOutcome,
    PersistResult,
    RecoveryReport,
    RewriteResult,
)
from .ports import CheckpointSource, CommitPlan, EpochRecord, SinkCommitter, SinkStateStore
from .precommit import PreCommit
from .recovery import EpochBatches, recover_pending
from .rewrite_decisions import persist_conflict_abort
from .status import AbortCause, EpochStatus
from .step_requests import AbortRequest, PersistRequest, RunAttempt, revision_plan

__all__ = ["TwoPhaseCommitCoordinator", "require_epoch"]

log = logging.getLogger(__name__)

#: How often persist (and abort) re-reads the row after losing a CAS race before it gives up.
_PERSIST_RACE_ROUNDS = 5


class TwoPhaseCommitCoordinator:
    """Drives epochs of any number of sinks over one store and one checkpoint source.

    ``committers`` maps each sink id to the committer of its sink (an Iceberg table set, a file
    directory). ``allow_beyond_horizon`` lets commits of epochs older than the sink's snapshot
    retention go ahead; it is for an operator who has checked by other means.
    """

    def __init__(
        self,
        store: SinkStateStore,
        committers: Mapping[str, SinkCommitter],
        checkpoints: CheckpointSource,
        *,
        allow_beyond_horizon: bool = False,
        on_reprocess: Mapping[str, OnReprocess] | None = None,
        fault: FaultHook = no_faults,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        for sink_id in committers:
            check_sink_id(sink_id)
        self._store = store
        self._committers = dict(committers)
        self._checkpoints = checkpoints
        self._allow_beyond_horizon = allow_beyond_horizon
        #: Per sink: what a newer generation's write does to a committed epoch (``"keep"`` unless given).
        self._on_reprocess = dict(on_reprocess or {})
        self._fault = fault
        #: Commit durations, files, rows, outcomes and aborts (``core.observe``); never decides anything.
        self._metrics = safe(metrics)
        #: Persist's one step for each action ``persist_decision`` can take.
        self._persist_steps: dict[
            Action, Callable[[PersistRequest, EpochRecord | None, Decision], PersistResult | None]
        ] = {
            Action.INSERT: self._insert,
            Action.REPLACE: self._replace,
            Action.REOPEN: self._reopen,
            Action.REVISE: self._revise,
            Action.KEEP: self._keep,
            Action.ALREADY_COMMITTED: self._keep,
            Action.ALREADY_REPLACED: self._keep,
            Action.DISCARD_LATE: self._discard_late,
            Action.DISCARD_UNDER_COMMIT: self._discard_late,
            Action.DISCARD_OLDER: self._discard_superseded,
            Action.DISCARD_KEPT: self._discard_superseded,
            Action.DISCARD_OTHER_TABLES: self._discard_refused,
            Action.DISCARD_REFUSED: self._discard_refused,
        }
        #: Abort's one step for each action ``abort_decision`` can take (a refusal is raised before).
        self._abort_steps: dict[Action, Callable[[AbortRequest, EpochRecord | None, Decision], AbortResult | None]] = {
            Action.RECORD_NO_WRITE: self._tombstone,
            Action.TOMBSTONE: self._tombstone,
            Action.REMOVE_OTHER_WRITE: self._remove_other_write,
            Action.ALREADY_COMMITTED: self._settled,
            Action.ALREADY_REPLACED: self._settled,
            Action.ALREADY_ABORTED: self._settled,
            Action.GIVE_UP_LOST_FILES: self._mark_aborted,
            Action.ABORT: self._mark_aborted,
            Action.ABORT_REVISION: self._mark_aborted,
        }

    # -- phase one: persist -----------------------------------------------------------------------

    def persist(
        self,
        pre_commit: PreCommit | Mapping[str, object] | str,
        *,
        run_id: str | None = None,
        try_number: int | None = None,
        dag_id: str | None = None,
    ) -> PersistResult:
        """Write the Pending row for a write. From here on the epoch can always be finished.

        Safe to repeat with the same write (a retried persist task). A different write for the same
        epoch replaces a Pending one that is not yet decided, re-opens an Aborted one, and is itself
        cleaned up when the epoch is already committed or its commit decided. A Committed epoch is
        re-opened for it only when a table the epoch went into was since dropped and re-created (the
        old commit proves nothing for the new table); a write for other tables than the epoch's is
        refused (``SinkReused``). What happens is ``persist_decision``'s; each action has one step
        below, which returns ``None`` when a concurrent attempt moved the row first.
        """
        pre = PreCommit.parse(pre_commit).as_written()
        committer = self._committer(pre.sink_id)
        try:
            plan = committer.prepare(pre)  # refuse what can never be committed before it is made durable
        except UpsertConflict as exc:
            # The table moved while the write ran: given up, for the group's rewrite task
            # (``prepare_rewrite``) to write the epoch again.
            cause, reason = persist_conflict_abort(exc, lambda: self._checkpoints.status(pre.sink_id, pre.epoch))
            self.abort(pre.sink_id, pre.epoch, reason=reason, write=pre, dag_id=dag_id, cause=cause)
            raise

        persisting = PersistRequest(pre, RunAttempt(run_id=run_id, try_number=try_number, dag_id=dag_id), plan)
        try:
            result = self._persist_rounds(persisting, WriteLookups.of(self._store, committer, pre))
        except Exception:
            if persisting.staged:  # recorded by no row this attempt knows of
                committer.tidy(persisting.staged[0], None)
            raise
        if persisting.staged:  # what the row does not record goes: no snapshot will ever list it
            ours = result.record.write_id == pre.write_id
            committer.tidy(persisting.staged[0], result.record.pre_commit if ours else None)
        return result

    def _persist_rounds(self, p: PersistRequest, lookups: WriteLookups) -> PersistResult:
        """Decide and take the step until one settles it. The first round decides as if the epoch had
        no row, the common case: the insert is refused (``StateConflict``) when it has one, read then."""
        on_reprocess = self._on_reprocess.get(p.pre.sink_id, "keep")
        row: EpochRecord | None = None
        for _ in range(1 + _PERSIST_RACE_ROUNDS):
            decision = persist_decision(row, p.pre, lookups, on_reprocess=on_reprocess).raise_if_refused()
            result = self._persist_steps[decision.action](p, row, decision)
            if result is not None:
                return result
            row = self._store.get(p.pre.sink_id, p.pre.epoch)
        raise StateConflict(
            f"{p.pre.describe()}: the epoch kept changing under {_PERSIST_RACE_ROUNDS} attempts to persist"
        )

    def _staged(self, p: PersistRequest, plan: CommitPlan | None = None) -> PreCommit:
        """The write with what its commit can write ahead (``SinkCommitter.stage``), again for a revision."""
        if not p.staged or plan is not None:
            p.staged[:] = [self._committer(p.pre.sink_id).stage(plan or p.plan)]
            self._fault("persist.staged")
        return p.staged[0]

    def _insert(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult | None:
        try:  # the store refuses a discarded write in the insert's own transaction
            record = self._store.insert_pending(self._staged(p), **p.attempt)
        except StateConflict:
            return None  # the epoch has a row (another persist inserted first): decide against it
        self._fault("persist.inserted")
        return PersistResult(PersistOutcome.PERSISTED, record, p.pre.write_id)

    def _replace(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult | None:
        assert row is not None
        try:
            record = self._store.replace_write(
                self._staged(p), expected_status=row.status, expected_write_id=row.write_id, **p.attempt
            )
        except StateConflict:
            return None  # the row moved under us (commit decided, aborted, replaced): look again
        self._fault("persist.replaced")
        self._run_cleanups(p.pre.sink_id, p.pre.epoch)  # the replaced write's files
        return PersistResult(PersistOutcome.REPLACED, record, p.pre.write_id)

    def _reopen(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult | None:
        assert row is not None
        try:
            record = self._store.reopen_committed(
                self._staged(p), expected_write_id=row.write_id, reason=decision.why, **p.attempt
            )
        except StateConflict:
            return None  # another persist re-opened it first: decide against its row
        log.warning("%s: %s", p.pre.describe(), decision.why)
        return PersistResult(PersistOutcome.REOPENED, record, p.pre.write_id, warning=decision.why)

    def _revise(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult | None:
        assert row is not None
        try:
            staged = self._staged(p, revision_plan(p.plan, row))  # its manifests, deletions included
            record = self._store.revisions.open_revision(staged, expected_write_id=row.write_id, **p.attempt)
        except StateConflict:
            return None  # another persist opened a revision first: decide against its row
        self._fault("persist.revised")
        log.warning("%s: %s", p.pre.describe(), decision.why)
        return PersistResult(PersistOutcome.REVISED, record, p.pre.write_id, warning=decision.why)

    def _keep(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult:
        """This write is the epoch's already (a retried persist), or a revision replaced it."""
        assert row is not None
        if decision.action is Action.ALREADY_REPLACED:
            log.info("%s: %s; %s", p.pre.describe(), decision.action.value, decision.why)
        return PersistResult(KEPT_OUTCOMES[decision.action], row, row.write_id)

    def _discard_late(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult:
        """The epoch's data is (or will be) an earlier write's: this one must never be seen."""
        assert row is not None
        self._discard(p.pre, f"late write: epoch holds write {row.write_id}")
        outcome = KEPT_OUTCOMES[decision.action]
        warning = warn_other_dag(self._store, p.pre, row, p.attempt["dag_id"])
        log.info("%s: %s with write %s; the new write was removed", p.pre.describe(), outcome, row.write_id)
        return PersistResult(outcome, row, row.write_id, warning=warning)

    def _discard_superseded(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult:
        """Another generation's write holds the epoch, and keeps it: this one is removed, and said."""
        assert row is not None
        self._discard(p.pre, f"{decision.action.value}: {decision.why}")
        record_warning(self._store, p.pre, f"{p.pre.describe()}: {decision.why}")
        return PersistResult(KEPT_OUTCOMES[decision.action], row, row.write_id, warning=decision.why)

    def _discard_refused(self, p: PersistRequest, row: EpochRecord | None, decision: Decision) -> PersistResult:
        """The write can never be the epoch's, and the caller must hear it as an error."""
        assert row is not None and decision.error is not None
        self._discard(p.pre, f"{decision.action.value}: {decision.error}")  # the refusal, in the epoch's history
        # Kept on the row too: the epoch is otherwise unchanged, and its page and the sink's picture show it.
        record_warning(self._store, p.pre, f"refused: {decision.error}")
        raise decision.error

    def _discard(self, pre: PreCommit, reason: str) -> None:
        """This write must never be the epoch's: its files go, through the clean-up queue."""
        self._store.enqueue_cleanup(pre, reason=reason)
        self._run_cleanups(pre.sink_id, pre.epoch)

    # -- phase two: commit ------------------------------------------------------------------------

    def commit(self, sink_id: str, epoch: int) -> CommitResult:
        """Make the epoch's persisted write visible exactly once, after its checkpoint completed."""
        started = time.monotonic()
        try:
            result = self._commit(sink_id, epoch)
        except Exception as exc:
            self._metrics.incr(COMMIT_ERRORS, 1, {"sink_id": sink_id, "error": type(exc).__name__})
            raise
        count_commit(self._metrics, sink_id, result, timedelta(seconds=time.monotonic() - started))
        return result

    def _commit(self, sink_id: str, epoch: int) -> CommitResult:
        committer = self._committer(sink_id)
        row = require_epoch(self._store, sink_id, epoch)
        lookups = EpochLookups.of(self._store, self._checkpoints, sink_id, epoch)
        decision = commit_decision(row, lookups).raise_if_refused()
        if decision.action is Action.ALREADY_COMMITTED:
            return CommitResult(CommitOutcome.ALREADY_COMMITTED, row)

        if decision.action is Action.DECIDE_AND_COMMIT:
            # Once decided, the write can only be committed; so decide only for a write the sink can
            # still take (its table may have changed since persist), and keep the others abortable.
            try:
                plan = self.prepare(row)
            except Exception as exc:
                now = require_epoch(self._store, sink_id, epoch)  # a newer write may have taken its files
                if (now.status, now.write_id) != (EpochStatus.PENDING, row.write_id):
                    return self._settled_by_other(sink_id, epoch, row.write_id)
                note_error(self._store, row, exc)
                raise
            try:
                row = self._store.decide_commit(sink_id, epoch, write_id=row.write_id)
            except StateConflict:
                return self._settled_by_other(sink_id, epoch, row.write_id)
            self._fault("commit.decided")
        else:
            # Decided earlier (a resumed commit): nothing prepared, the committer loads and checks afresh.
            plan = CommitPlan(row.pre_commit, row.replaces)

        try:
            committed = committer.commit(plan, row.created_at, allow_beyond_horizon=self._allow_beyond_horizon)
        except Exception as exc:
            note_error(self._store, row, exc)
            raise
        self._fault("commit.visible")

        try:
            record = self._store.mark_committed(
                sink_id,
                epoch,
                write_id=row.write_id,
                committed=committed,
                identities=committer.identities(row.pre_commit),
            )
        except StateConflict:
            return self._settled_by_other(sink_id, epoch, row.write_id)
        self._fault("commit.marked")
        log.info("%s committed: %s", row.pre_commit.describe(), dict(committed))
        return CommitResult(CommitOutcome.COMMITTED, record)

    def prepare(self, row: EpochRecord) -> CommitPlan:
        """``SinkCommitter.prepare`` right before the commit decision, as the commit's dry run runs it."""
        return self._committer(row.sink_id).prepare(row.pre_commit, replaces=row.replaces, check_files=True)

    def _settled_by_other(self, sink_id: str, epoch: int, write_id: str) -> CommitResult:
        """A CAS of ours lost: benign if a concurrent attempt committed the same write, loud otherwise."""
        row = require_epoch(self._store, sink_id, epoch)
        if row.status is EpochStatus.COMMITTED and row.write_id == write_id:
            return CommitResult(CommitOutcome.ALREADY_COMMITTED, row)
        raise StateConflict(
            f"sink {sink_id!r} epoch {epoch}: expected Pending write {write_id}, "
            f"found {row.status} write {row.write_id}; this attempt is stale and stops here"
        )

    # -- abort ------------------------------------------------------------------------------------

    def abort(
        self,
        sink_id: str,
        epoch: int,
        *,
        reason: str,
        write: PreCommit | None = None,
        force: bool = False,
        files_lost: bool = False,
        dag_id: str | None = None,
        cause: AbortCause | None = None,
    ) -> AbortResult:
        """Give up on a write and delete its files, but never against a durable commit decision.

        ``write`` names the write being given up (an abort task knows its own run's write); without it
        the epoch's persisted write is meant. A write that is not the epoch's has only its own files
        removed. Refused once the checkpoint COMPLETED, unless ``force`` (an operator deliberately
        dropping an epoch's data), and once a commit was decided, unless ``files_lost``: then the
        decision can never be carried out, and the abort goes ahead only if some of the write's
        files are gone and no table shows the epoch (``lost_files``). ``dag_id`` is recorded on the
        tombstone row of a write that was never persisted; ``cause``: why, when the caller knows
        better than ``abort_decision`` (an upsert conflict). Each action of the decision has one
        step below; the result is counted by outcome for the metrics.
        """
        self._committer(sink_id)  # an unknown sink is a configuration error, whatever the store holds
        check_epoch(epoch)
        if write is not None and (write.sink_id, write.epoch) != (sink_id, epoch):
            raise InvalidPreCommit(f"abort of sink {sink_id!r} epoch {epoch} was given {write.describe()}")
        aborting = AbortRequest(sink_id, epoch, reason, write, dag_id, cause)
        for _ in range(_PERSIST_RACE_ROUNDS):
            row = self._store.get(sink_id, epoch)
            decision = abort_decision(
                row,
                write,
                lambda: self._checkpoints.status(sink_id, epoch),
                replaced=lambda: (
                    write is not None and self._store.revisions.was_replaced(sink_id, epoch, write.write_id)
                ),
                force=force,
                files_lost=files_lost,
            ).raise_if_refused()
            result = self._abort_steps[decision.action](aborting, row, decision)
            if result is not None:
                count_abort(self._metrics, sink_id, result)
                return result
        raise StateConflict(f"sink {sink_id!r} epoch {epoch}: kept changing under {_PERSIST_RACE_ROUNDS} aborts")

    def _tombstone(self, a: AbortRequest, row: EpochRecord | None, decision: Decision) -> AbortResult | None:
        """A row for a write never persisted, so that a late persist of it cannot resurrect deleted
        files; without a write, the record that the epoch was given up and why."""
        try:
            record = self._store.insert_aborted(
                a.write or PreCommit.nothing_written(a.sink_id, a.epoch),
                reason=a.reason,
                dag_id=a.dag_id,
                cause=a.cause or decision.cause,
            )
        except StateConflict:
            return None  # a persist won: decide against its row
        self._fault("abort.marked")
        outcome = AbortOutcome.NOT_PERSISTED if a.write is not None else AbortOutcome.NO_WRITE
        return AbortResult(outcome, self._run_cleanups(a.sink_id, a.epoch), record)

    def _remove_other_write(self, a: AbortRequest, row: EpochRecord | None, decision: Decision) -> AbortResult:
        assert a.write is not None and row is not None
        self._store.enqueue_cleanup(a.write, reason=f"abort: {a.reason}")
        return AbortResult(AbortOutcome.OTHER_WRITE_REMOVED, self._run_cleanups(a.sink_id, a.epoch), row)

    def _settled(self, a: AbortRequest, row: EpochRecord | None, decision: Decision) -> AbortResult:
        """Already committed (or replaced by a committed revision), or already aborted: its queued
        clean-ups run again, as a crashed abort may have left them."""
        if decision.action is Action.ALREADY_ABORTED:
            return AbortResult(AbortOutcome.ALREADY_ABORTED, self._run_cleanups(a.sink_id, a.epoch), row)
        return AbortResult(AbortOutcome.ALREADY_COMMITTED, 0, row)

    def _mark_aborted(self, a: AbortRequest, row: EpochRecord | None, decision: Decision) -> AbortResult:
        """Aborted, and the write's files deleted; a revision's abort leaves the epoch Committed
        with the write it would have replaced, whatever made it give up (lost files included)."""
        assert row is not None
        if decision.action is Action.GIVE_UP_LOST_FILES:
            missing = self.lost_files(row)  # refuses unless the files are lost and no table shows the epoch
            log.warning("%s: giving up a write with %d data file(s) lost", row.pre_commit.describe(), len(missing))
        decided = row.commit_decided_at is not None
        try:
            if row.kind.revises:
                record = self._store.revisions.abort_revision(
                    a.sink_id, a.epoch, write_id=row.write_id, reason=a.reason, decided=decided
                )
            else:
                cause = a.cause or decision.cause
                record = self._store.mark_aborted(
                    a.sink_id, a.epoch, write_id=row.write_id, reason=a.reason, decided=decided, cause=cause
                )
        except StateConflict:
            latest = require_epoch(self._store, a.sink_id, a.epoch)
            if latest.status is EpochStatus.ABORTED and latest.write_id == row.write_id:
                return AbortResult(AbortOutcome.ALREADY_ABORTED, self._run_cleanups(a.sink_id, a.epoch), latest)
            raise AbortRefused(
                f"sink {a.sink_id!r} epoch {a.epoch}: changed while aborting (now {latest.status}, write "
                f"{latest.write_id}, commit decided: {latest.commit_decided_at is not None})"
            ) from None
        self._fault("abort.marked")
        deleted = self._run_cleanups(a.sink_id, a.epoch)
        self._fault("abort.cleaned")
        what = f"revision {row.revision} aborted, write {record.write_id} stays" if row.kind.revises else "aborted"
        log.info("%s %s (%s); %d file(s) deleted", row.pre_commit.describe(), what, a.reason, deleted)
        outcome = AbortOutcome.REVISION_ABORTED if row.kind.revises else AbortOutcome.ABORTED
        return AbortResult(outcome, deleted, record)

    def lost_files(self, row: EpochRecord) -> list[str]:
        """A Pending write's lost data files, when reason enough to give it up; ``AbortRefused`` otherwise."""
        return lost_files(self._committer(row.sink_id), row)

    # -- rewrite after an upsert conflict -----------------------------------------------------------

    def prepare_rewrite(self, sink_id: str, epoch: int, *, run_writes: Collection[str] = ()) -> RewriteResult:
        """Make way for writing an upsert epoch again after its write conflicted
        (``lost_writes.prepare_rewrite``). ``run_writes``: the writes the run made so far."""
        return prepare_rewrite(
            require_epoch(self._store, sink_id, epoch),
            self._committer(sink_id),
            lambda: self._checkpoints.status(sink_id, epoch),
            lambda reason: self.abort(sink_id, epoch, reason=reason, files_lost=True, cause=AbortCause.UPSERT_CONFLICT),
            run_writes,
        )

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, sink_id: str) -> RecoveryReport:
        """Finish what crashes left half done for one sink: its Pending epochs (``core.recovery``), then clean-ups."""
        committer, beyond = self._committer(sink_id), self._allow_beyond_horizon
        batches = EpochBatches.of(sink_id, self._store, committer, self._fault, self._metrics, beyond)
        report = recover_pending(self, self._store, self._checkpoints, sink_id, batches)
        report.files_deleted += self._run_cleanups(sink_id, None, report)
        return report

    # -- clean-up ---------------------------------------------------------------------------------

    def clean_up(self, sink_id: str, epoch: int | None = None) -> CleanupReport:
        """Run the queued clean-ups of a sink (or of one epoch) alone (``cleanups.clean_up``)."""
        return clean_up(self._store, self._committer(sink_id), sink_id, epoch, fault=self._fault)

    def _run_cleanups(self, sink_id: str, epoch: int | None, report: CleanupReport | None = None) -> int:
        """Delete the files of queued writes that can no longer become visible (``core.cleanups``)."""
        return run_cleanups(self._store, self._committer(sink_id), sink_id, epoch, report=report, fault=self._fault)

    def _committer(self, sink_id: str) -> SinkCommitter:
        check_sink_id(sink_id)
        try:
            return self._committers[sink_id]
        except KeyError:
            raise InvalidSinkConfig(
                f"no committer is configured for sink {sink_id!r} (known: {sorted(self._committers)})"
            ) from None
