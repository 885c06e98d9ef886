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
call these methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from .errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    ExactlyOnceError,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    SinkReused,
    StateConflict,
)
from .faults import FaultHook, no_faults
from .identifiers import check_epoch, check_sink_id
from .observe import (
    ABORT_FILES_DELETED,
    ABORTS,
    COMMIT_BYTES,
    COMMIT_DURATION,
    COMMIT_ERRORS,
    COMMIT_FILES,
    COMMIT_ROWS,
    COMMITS,
    NO_METRICS,
    Metrics,
    safe,
    write_totals,
)
from .ports import (
    CheckpointSource,
    EpochRecord,
    SinkCommitter,
    SinkStateStore,
)
from .precommit import PreCommit
from .status import CheckpointStatus, EpochStatus

log = logging.getLogger(__name__)

#: How often persist re-reads the row after losing a CAS race before it gives up.
_PERSIST_RACE_ROUNDS = 5


class PersistOutcome(StrEnum):
    PERSISTED = "persisted"
    ALREADY_PERSISTED = "already persisted"
    REPLACED = "replaced an earlier write"
    ALREADY_COMMITTED = "already committed"
    COMMIT_DECIDED = "an earlier write is being committed"
    REOPENED = "re-opened: the table was re-created since the epoch was committed"


class CommitOutcome(StrEnum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already committed"


class AbortOutcome(StrEnum):
    ABORTED = "aborted"
    ALREADY_ABORTED = "already aborted"
    ALREADY_COMMITTED = "already committed"
    NOT_PERSISTED = "not persisted; the write's files were removed"
    OTHER_WRITE_REMOVED = "the write was not the epoch's; its files were removed"
    NOTHING_TO_ABORT = "nothing to abort"


@dataclass(frozen=True)
class PersistResult:
    outcome: PersistOutcome
    record: EpochRecord
    #: The write whose data the epoch holds (or will): differs from the persisted write's id when
    #: the epoch was already committed or decided with an earlier one.
    write_id: str
    #: Something an operator must hear about (also kept on the row): the task logs it at WARNING.
    warning: str | None = None


@dataclass(frozen=True)
class CommitResult:
    outcome: CommitOutcome
    record: EpochRecord


@dataclass(frozen=True)
class AbortResult:
    outcome: AbortOutcome
    files_deleted: int
    record: EpochRecord | None


@dataclass
class RecoveryReport:
    sink_id: str
    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    files_deleted: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


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
        fault: FaultHook = no_faults,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        for sink_id in committers:
            check_sink_id(sink_id)
        self._store = store
        self._committers = dict(committers)
        self._checkpoints = checkpoints
        self._allow_beyond_horizon = allow_beyond_horizon
        self._fault = fault
        #: Commit durations, files, rows, outcomes and aborts (``core.observe``); never decides anything.
        self._metrics = safe(metrics)

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
        refused (``SinkReused``).
        """
        pre = PreCommit.parse(pre_commit)
        committer = self._committer(pre.sink_id)
        committer.validate(pre)  # refuse what can never be committed before it is made durable

        for _ in range(_PERSIST_RACE_ROUNDS):
            row = self._store.get(pre.sink_id, pre.epoch)
            if row is not None and row.write_id == pre.write_id:
                if row.status is EpochStatus.ABORTED:
                    raise EpochAborted(
                        f"{pre.describe()} was aborted and its files removed; run the write again for a new write"
                    )
                outcome = (
                    PersistOutcome.ALREADY_COMMITTED
                    if row.status is EpochStatus.COMMITTED
                    else PersistOutcome.ALREADY_PERSISTED
                )
                return PersistResult(outcome, row, row.write_id)

            if row is not None and row.status is EpochStatus.COMMITTED:
                self._refuse_other_tables(pre, row)
                recreated = _recreated_tables(row, committer.identities(pre))
                if recreated:
                    self._refuse_discarded(pre)
                    try:
                        record = self._store.reopen_committed(
                            pre,
                            expected_write_id=row.write_id,
                            run_id=run_id,
                            try_number=try_number,
                            dag_id=dag_id,
                            reason=recreated,
                        )
                    except StateConflict:
                        continue  # another persist re-opened it first: decide against its row
                    log.warning("%s: %s", pre.describe(), recreated)
                    return PersistResult(PersistOutcome.REOPENED, record, pre.write_id, warning=recreated)

            if row is not None and (
                row.status is EpochStatus.COMMITTED
                or (row.status is EpochStatus.PENDING and row.commit_decided_at is not None)
            ):
                # The epoch's data is (or will be) the earlier write's: this one must never be seen.
                self._store.enqueue_cleanup(pre, reason=f"late write: epoch holds write {row.write_id}")
                self._run_cleanups(pre.sink_id, pre.epoch)
                outcome = (
                    PersistOutcome.ALREADY_COMMITTED
                    if row.status is EpochStatus.COMMITTED
                    else PersistOutcome.COMMIT_DECIDED
                )
                warning = self._warn_other_dag(pre, row, dag_id)
                log.info("%s: %s with write %s; the new write was removed", pre.describe(), outcome, row.write_id)
                return PersistResult(outcome, row, row.write_id, warning=warning)

            self._refuse_discarded(pre)  # from here the write would become the epoch's
            if row is None:
                try:
                    record = self._store.insert_pending(pre, run_id=run_id, try_number=try_number, dag_id=dag_id)
                except StateConflict:
                    continue  # another persist inserted first: decide against its row
                self._fault("persist.inserted")
                return PersistResult(PersistOutcome.PERSISTED, record, pre.write_id)

            try:
                record = self._store.replace_write(
                    pre,
                    expected_status=row.status,
                    expected_write_id=row.write_id,
                    run_id=run_id,
                    try_number=try_number,
                    dag_id=dag_id,
                )
            except StateConflict:
                continue  # the row moved under us (commit decided, aborted, replaced): look again
            self._fault("persist.replaced")
            self._run_cleanups(pre.sink_id, pre.epoch)  # the replaced write's files
            return PersistResult(PersistOutcome.REPLACED, record, pre.write_id)

        raise StateConflict(
            f"{pre.describe()}: the epoch kept changing under {_PERSIST_RACE_ROUNDS} attempts to persist"
        )

    def _refuse_discarded(self, pre: PreCommit) -> None:
        """A write whose files were handed to clean-up (aborted before it was persisted, replaced, or
        removed as an orphan) must never become the epoch's write."""
        if self._store.write_discarded(pre.sink_id, pre.epoch, pre.write_id):
            raise EpochAborted(
                f"{pre.describe()} was discarded (aborted or replaced) and its files removed; "
                "run the write again for a new write"
            )

    def _refuse_other_tables(self, pre: PreCommit, row: EpochRecord) -> None:
        """A Committed epoch of other tables proves nothing for this write's: refuse, remove the write."""
        committed_to = sorted(t.table for t in row.pre_commit.tables)
        targets = sorted(t.table for t in pre.tables)
        if committed_to == targets:
            return
        self._store.enqueue_cleanup(pre, reason=f"sink reused: epoch committed to {committed_to}")
        self._run_cleanups(pre.sink_id, pre.epoch)
        raise SinkReused(
            f"{pre.describe()} targets {targets}, but the sink's epoch {pre.epoch} was committed to "
            f"{committed_to} (write {row.write_id}, DAG {row.dag_id or 'unknown'}, run {row.run_id or 'unknown'}); "
            "the new write was removed. A sink id names one destination for its whole history: give the "
            "new pipeline or table its own sink_id"
        )

    def _warn_other_dag(self, pre: PreCommit, row: EpochRecord, dag_id: str | None) -> str | None:
        """A write from another DAG for an epoch already settled: the sink id may be reused by mistake."""
        if dag_id is None or row.dag_id is None or dag_id == row.dag_id:
            return None
        warning = (
            f"sink {pre.sink_id!r} epoch {pre.epoch} holds write {row.write_id} of DAG {row.dag_id!r}; a write "
            f"from DAG {dag_id!r} was discarded. If another pipeline reuses this sink id, give it its own "
            "sink_id: its epochs are not being written"
        )
        log.warning("%s", warning)
        try:
            self._store.record_warning(pre.sink_id, pre.epoch, warning=warning)
        except MetaStoreUnavailable:
            log.warning("could not record the warning on sink %r epoch %d", pre.sink_id, pre.epoch)
        return warning

    # -- phase two: commit ------------------------------------------------------------------------

    def commit(self, sink_id: str, epoch: int) -> CommitResult:
        """Make the epoch's persisted write visible exactly once, after its checkpoint completed."""
        started = time.monotonic()
        try:
            result = self._commit(sink_id, epoch)
        except Exception as exc:
            self._metrics.incr(COMMIT_ERRORS, 1, {"sink_id": sink_id, "error": type(exc).__name__})
            raise
        tags = {"sink_id": sink_id}
        self._metrics.incr(COMMITS, 1, {**tags, "outcome": result.outcome.name.lower()})
        if result.outcome is CommitOutcome.COMMITTED:
            # Only the attempt that made the epoch visible counts its files and rows, so the counters
            # add up to what the tables hold however often a commit is retried or rerun.
            files, rows, size = write_totals(result.record.pre_commit)
            self._metrics.timing(COMMIT_DURATION, timedelta(seconds=time.monotonic() - started), tags)
            self._metrics.incr(COMMIT_FILES, files, tags)
            self._metrics.incr(COMMIT_ROWS, rows, tags)
            self._metrics.incr(COMMIT_BYTES, size, tags)
        return result

    def _commit(self, sink_id: str, epoch: int) -> CommitResult:
        committer = self._committer(sink_id)
        row = self._require(sink_id, epoch)
        if row.status is EpochStatus.COMMITTED:
            return CommitResult(CommitOutcome.ALREADY_COMMITTED, row)
        if row.status is EpochStatus.ABORTED:
            raise EpochAborted(f"sink {sink_id!r} epoch {epoch} is Aborted: it cannot be committed")

        if row.commit_decided_at is None:
            checkpoint = self._checkpoints.status(sink_id, epoch)
            if checkpoint is CheckpointStatus.FAILED:
                raise CheckpointFailed(f"sink {sink_id!r} epoch {epoch}: checkpoint FAILED; the epoch must be aborted")
            if checkpoint is CheckpointStatus.PENDING:
                raise CheckpointNotReady(f"sink {sink_id!r} epoch {epoch}: checkpoint still PENDING")
            # Once decided, the write can only be committed; so decide only for a write the sink can
            # still take (its table may have changed since persist), and keep the others abortable.
            try:
                committer.validate(row.pre_commit)
            except Exception as exc:
                self._note_error(row, exc)
                raise
            try:
                row = self._store.decide_commit(sink_id, epoch, write_id=row.write_id)
            except StateConflict:
                return self._settled_by_other(sink_id, epoch, row.write_id)
            self._fault("commit.decided")

        try:
            committed = committer.commit(
                row.pre_commit, row.created_at, allow_beyond_horizon=self._allow_beyond_horizon
            )
        except Exception as exc:
            self._note_error(row, exc)
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

    def _settled_by_other(self, sink_id: str, epoch: int, write_id: str) -> CommitResult:
        """A CAS of ours lost: benign if a concurrent attempt committed the same write, loud otherwise."""
        row = self._require(sink_id, epoch)
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
    ) -> AbortResult:
        """Give up on a write and delete its files (``_abort``), counted by outcome for the metrics.

        ``dag_id`` is recorded on the tombstone row of a write that was never persisted."""
        result = self._abort(
            sink_id, epoch, reason=reason, write=write, force=force, files_lost=files_lost, dag_id=dag_id
        )
        tags = {"sink_id": sink_id}
        self._metrics.incr(ABORTS, 1, {**tags, "outcome": result.outcome.name.lower()})
        if result.files_deleted:
            self._metrics.incr(ABORT_FILES_DELETED, result.files_deleted, tags)
        return result

    def _abort(
        self,
        sink_id: str,
        epoch: int,
        *,
        reason: str,
        write: PreCommit | None = None,
        force: bool = False,
        files_lost: bool = False,
        dag_id: str | None = None,
    ) -> AbortResult:
        """Give up on a write and delete its files, but never against a durable commit decision.

        ``write`` names the write being given up (an abort task knows its own run's write); without it
        the epoch's persisted write is meant. A write that is not the epoch's has only its own files
        removed. Refused once the checkpoint COMPLETED, unless ``force`` (an operator deliberately
        dropping an epoch's data), and once a commit was decided, unless ``files_lost``: then the
        decision can never be carried out, and the abort goes ahead only if some of the write's
        files are gone and no table shows the epoch (``lost_files``).
        """
        self._committer(sink_id)  # an unknown sink is a configuration error, whatever the store holds
        check_epoch(epoch)
        if write is not None and (write.sink_id, write.epoch) != (sink_id, epoch):
            raise InvalidPreCommit(f"abort of sink {sink_id!r} epoch {epoch} was given {write.describe()}")
        row = self._store.get(sink_id, epoch)

        if row is None:
            if write is None:
                return AbortResult(AbortOutcome.NOTHING_TO_ABORT, 0, None)
            try:
                # A tombstone row, so that a late persist of this write cannot resurrect deleted files.
                record = self._store.insert_aborted(write, reason=reason, dag_id=dag_id)
            except StateConflict:
                # persist won
                return self._abort(
                    sink_id, epoch, reason=reason, write=write, force=force, files_lost=files_lost, dag_id=dag_id
                )
            self._fault("abort.marked")
            return AbortResult(AbortOutcome.NOT_PERSISTED, self._run_cleanups(sink_id, epoch), record)

        if write is not None and write.write_id != row.write_id:
            self._store.enqueue_cleanup(write, reason=f"abort: {reason}")
            return AbortResult(AbortOutcome.OTHER_WRITE_REMOVED, self._run_cleanups(sink_id, epoch), row)

        if row.status is EpochStatus.COMMITTED:
            return AbortResult(AbortOutcome.ALREADY_COMMITTED, 0, row)
        if row.status is EpochStatus.ABORTED:
            return AbortResult(AbortOutcome.ALREADY_ABORTED, self._run_cleanups(sink_id, epoch), row)

        if files_lost:
            missing = self.lost_files(row)
            log.warning("%s: giving up a write with %d data file(s) lost", row.pre_commit.describe(), len(missing))
        elif row.commit_decided_at is not None:
            raise AbortRefused(
                f"sink {sink_id!r} epoch {epoch}: the commit of write {row.write_id} was decided at "
                f"{row.commit_decided_at.isoformat()}; it will be committed (commit task or recovery), not "
                "aborted. Only if its data files are lost for good: abort with files_lost=True "
                "(eo-sink abort SINK EPOCH --reason ... --files-lost)"
            )
        elif not force and self._checkpoints.status(sink_id, epoch) is CheckpointStatus.COMPLETED:
            raise AbortRefused(
                f"sink {sink_id!r} epoch {epoch}: checkpoint COMPLETED, so the epoch must be committed; "
                "abort with force=True only to drop its data on purpose"
            )
        try:
            record = self._store.mark_aborted(
                sink_id, epoch, write_id=row.write_id, reason=reason, decided=row.commit_decided_at is not None
            )
        except StateConflict:
            latest = self._require(sink_id, epoch)
            if latest.status is EpochStatus.ABORTED and latest.write_id == row.write_id:
                return AbortResult(AbortOutcome.ALREADY_ABORTED, self._run_cleanups(sink_id, epoch), latest)
            raise AbortRefused(
                f"sink {sink_id!r} epoch {epoch}: changed while aborting (now {latest.status}, write "
                f"{latest.write_id}, commit decided: {latest.commit_decided_at is not None})"
            ) from None
        self._fault("abort.marked")
        deleted = self._run_cleanups(sink_id, epoch)
        self._fault("abort.cleaned")
        log.info("%s aborted (%s); %d file(s) deleted", row.pre_commit.describe(), reason, deleted)
        return AbortResult(AbortOutcome.ABORTED, deleted, record)

    def lost_files(self, row: EpochRecord) -> list[str]:
        """The data files of a Pending write that are gone, when that is reason enough to give it up.

        Refused (``AbortRefused``) while a table shows the epoch (it is partly visible: only
        restoring the files and committing keeps it whole) and while every file is there (commit).
        """
        committer = self._committer(row.sink_id)
        what = row.pre_commit.describe()
        visible = committer.find_committed(row.pre_commit, row.created_at)
        if visible.tables:
            raise AbortRefused(
                f"{what}: table(s) {', '.join(sorted(visible.tables))} already show the epoch, so it is partly "
                "visible; restore the missing files and commit it (eo-sink commit SINK EPOCH)"
            )
        missing = list(committer.missing_files(row.pre_commit))
        if not missing:
            raise AbortRefused(
                f"{what}: every data file of the write is in storage, so nothing is lost; commit it "
                "(eo-sink commit SINK EPOCH)"
            )
        return missing

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, sink_id: str) -> RecoveryReport:
        """Finish what crashes left half done for one sink; costs O(pending), not O(history).

        Pending epochs whose commit was decided or whose checkpoint completed are committed; those
        whose checkpoint failed are aborted; the rest keep waiting. Then every queued clean-up runs.
        One epoch's failure is reported and does not stop the others.
        """
        self._committer(sink_id)
        report = RecoveryReport(sink_id)
        for row in sorted(self._store.epochs_with_status(sink_id, EpochStatus.PENDING), key=lambda r: r.epoch):
            try:
                if row.commit_decided_at is None:
                    checkpoint = self._checkpoints.status(sink_id, row.epoch)
                    if checkpoint is CheckpointStatus.PENDING:
                        report.waiting.append(row.epoch)
                        continue
                    if checkpoint is CheckpointStatus.FAILED:
                        aborted = self.abort(sink_id, row.epoch, reason="recovery: checkpoint FAILED")
                        report.aborted.append(row.epoch)
                        report.files_deleted += aborted.files_deleted
                        continue
                self.commit(sink_id, row.epoch)
                report.committed.append(row.epoch)
            except MetaStoreUnavailable:
                raise  # nothing else can make progress either; the recovery task is retried whole
            except Exception as exc:
                # Whatever one epoch raises (a refusal, a driver's error, a bug) is that epoch's: it is
                # kept on its row and reported, and the sink's other epochs are still tried.
                log.warning(
                    "recovery of sink %r epoch %d failed: %s: %s",
                    sink_id,
                    row.epoch,
                    type(exc).__name__,
                    exc,
                    exc_info=not isinstance(exc, ExactlyOnceError),
                )
                report.failed[row.epoch] = f"{type(exc).__name__}: {exc}"
                self._note_error(row, exc)
        report.files_deleted += self._run_cleanups(sink_id, None, report)
        return report

    # -- clean-up ---------------------------------------------------------------------------------

    def clean_up(self, sink_id: str, epoch: int | None = None) -> RecoveryReport:
        """Run the queued clean-ups of a sink (or of one epoch) alone, without touching any epoch's status.

        What an operator asks for after a crash left an Aborted epoch's files, or after queuing
        orphaned write locations; the same checks as every other delete apply (invariant 4). A
        clean-up that fails is in the report's ``failed`` and stays queued.
        """
        self._committer(sink_id)
        if epoch is not None:
            check_epoch(epoch)
        report = RecoveryReport(sink_id)
        report.files_deleted = self._run_cleanups(sink_id, epoch, report)
        return report

    def _run_cleanups(self, sink_id: str, epoch: int | None, report: RecoveryReport | None = None) -> int:
        """Delete the files of queued writes that can no longer become visible.

        The committer re-checks the sink itself before deleting (invariant 4); here the store is
        asked first, so a write that is (again) the epoch's live write is never touched.
        """
        deleted = 0
        committer = self._committer(sink_id)
        for task in self._store.cleanups(sink_id, epoch):
            row = self._store.get(task.sink_id, task.epoch)
            if row is not None and row.write_id == task.write_id and row.status is not EpochStatus.ABORTED:
                if row.status is EpochStatus.COMMITTED:
                    self._store.complete_cleanup(task.id)  # its files are the table's now
                continue
            since = min(row.created_at, task.created_at) if row is not None else task.created_at
            try:
                deleted += committer.delete_write(task.pre_commit, since)
            except Exception as exc:
                if report is None or isinstance(exc, MetaStoreUnavailable):
                    raise
                report.failed[task.epoch] = f"clean-up of write {task.write_id}: {type(exc).__name__}: {exc}"
                continue
            self._fault("cleanup.deleted")
            self._store.complete_cleanup(task.id)
        return deleted

    # -- helpers ----------------------------------------------------------------------------------

    def _committer(self, sink_id: str) -> SinkCommitter:
        check_sink_id(sink_id)
        try:
            return self._committers[sink_id]
        except KeyError:
            raise InvalidSinkConfig(
                f"no committer is configured for sink {sink_id!r} (known: {sorted(self._committers)})"
            ) from None

    def _require(self, sink_id: str, epoch: int) -> EpochRecord:
        return require_epoch(self._store, sink_id, epoch)

    def _note_error(self, row: EpochRecord, exc: Exception) -> None:
        """Keep the last failure on the row for operators; never let that hide the failure itself."""
        try:
            self._store.record_error(
                row.sink_id, row.epoch, write_id=row.write_id, error=f"{type(exc).__name__}: {exc}"
            )
        except MetaStoreUnavailable:
            log.warning("could not record the error on sink %r epoch %d", row.sink_id, row.epoch)


def require_epoch(store: SinkStateStore, sink_id: str, epoch: int) -> EpochRecord:
    """The epoch's row; ``EpochNotFound`` (naming sink and epoch) when it was never persisted."""
    check_sink_id(sink_id)
    check_epoch(epoch)
    row = store.get(sink_id, epoch)
    if row is None:
        raise EpochNotFound(f"sink {sink_id!r} epoch {epoch} was never persisted")
    return row


def _recreated_tables(row: EpochRecord, identities: Mapping[str, str]) -> str | None:
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
