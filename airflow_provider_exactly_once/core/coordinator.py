"""The two-phase-commit coordinator: the whole life of one epoch in the order it happens, carrying out
the decisions of ``core/decisions.py`` over the ports.

Also here because only the coordinator runs them: what it keeps on a row besides the status, the
metrics port (a failing backend never decides an epoch), the recovery pass with its batches (D15)
and the writes that can never commit as written (D14). The operators, the recovery DAG and the CLI
only call these methods. The contract: design.md, "The seven invariants", "Layers" and D1.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from airflow_provider_exactly_once.core.cleanups import clean_up, run_cleanups
from airflow_provider_exactly_once.core.decisions import (
    REWRITE_REASON,
    AbortRequest,
    Action,
    CheckpointLookup,
    Decision,
    EpochLookups,
    PersistRequest,
    RunAttempt,
    WriteLookups,
    abort_decision,
    audit_decision,
    audit_refusal,
    commit_decision,
    commits_in_batch,
    files_lost_refusal,
    other_dag_warning,
    persist_conflict_abort,
    persist_decision,
    recovery_decision,
    revision_plan,
    rewrite_decision,
)
from airflow_provider_exactly_once.core.epochs import (
    AbortCause,
    AuditCheck,
    AuditVerdict,
    EpochAudit,
    EpochStatus,
    OnReprocess,
    check_epoch,
    check_sink_id,
)
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    AuditNotPassed,
    EpochNotFound,
    ExactlyOnceError,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    ReplacedFilesMissing,
    StateConflict,
    UpsertConflict,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.outcomes import (
    KEPT_OUTCOMES,
    AbortOutcome,
    AbortResult,
    CleanupReport,
    CommitOutcome,
    CommitResult,
    PersistOutcome,
    PersistResult,
    RecoveryReport,
    RewriteOutcome,
    RewriteResult,
)
from airflow_provider_exactly_once.core.ports import (
    AuditingCommitter,
    BatchCommitter,
    CheckpointSource,
    CommitMark,
    CommitPlan,
    EpochRecord,
    FileCheck,
    SinkCommitter,
    SinkStateStore,
)
from airflow_provider_exactly_once.core.precommit import PreCommit

log = logging.getLogger(__name__)

#: Seconds from the commit call to the Committed mark, for a commit that made the epoch visible.
COMMIT_DURATION = "commit.duration"
#: Commits by ``outcome`` (``committed``, ``already_committed``) and failed commit attempts (``error``).
COMMITS = "commits"
COMMIT_ERRORS = "commit.errors"
#: Data files and rows an epoch's commit made visible (counters; zero for an empty epoch).
COMMIT_FILES = "commit.files"
COMMIT_ROWS = "commit.rows"
COMMIT_BYTES = "commit.bytes"
#: An upsert epoch's committed changes: rows inserted, updated and deleted by key.
COMMIT_INSERTED = "commit.rows_inserted"
COMMIT_UPDATED = "commit.rows_updated"
COMMIT_DELETED = "commit.rows_deleted"
#: Iceberg commit conflicts that sent a table's commit back to reload and re-check its marker.
COMMIT_RETRIES = "commit.retries"
#: Aborts by ``outcome`` and the files they deleted.
ABORTS = "aborts"
#: Audits judged, tagged by verdict, and the time from the audit commit to the verdict (design.md D23).
AUDITS = "audits"
AUDIT_DURATION = "audit.duration"
ABORT_FILES_DELETED = "abort.files_deleted"
#: How long after its persist (the row's ``created_at``) an epoch's commit looks only at the manifests
#: the write's persist wrote before its decision (``FileCheck.OWN_MANIFESTS``); an older one's looks
#: at every file. Well inside the age an orphan-file removal spares (Iceberg's ``remove_orphan_files``:
#: 3 days by default), so that no file of a younger write can be an orphan removal's yet
#: (design.md, 'The Iceberg commit', step 3; ``[exactly_once] full_file_check_after_seconds``).
FULL_FILE_CHECK_AFTER = timedelta(days=1)
#: Gauges per sink, set by the recovery task: how many epochs are Pending and how old the oldest is.
PENDING_EPOCHS = "pending_epochs"
OLDEST_PENDING_AGE = "oldest_pending_age_seconds"


class Metrics(Protocol):
    """Where the coordinator's measurements go. ``tags`` always holds ``sink_id``."""

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None: ...

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None: ...

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None: ...


class NoMetrics:
    """The default: measurements go nowhere (tests, scripts, deployments without metrics)."""

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        return None

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        return None

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        return None


NO_METRICS: Metrics = NoMetrics()


class SafeMetrics:
    """Wraps a backend so that its failure is logged once per call and never raised.

    A commit that made an epoch visible must report COMMITTED even when the StatsD host is down.
    """

    def __init__(self, inner: Metrics) -> None:
        self._inner = inner

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        try:
            self._inner.incr(name, count, tags)
        except Exception:  # a metrics backend's failure must not change an epoch's outcome
            log.warning("metrics: could not emit %s", name, exc_info=True)

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        try:
            self._inner.gauge(name, value, tags)
        except Exception:  # as above
            log.warning("metrics: could not emit %s", name, exc_info=True)

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        try:
            self._inner.timing(name, duration, tags)
        except Exception:  # as above
            log.warning("metrics: could not emit %s", name, exc_info=True)


def safe(metrics: Metrics) -> Metrics:
    """``metrics`` wrapped in ``SafeMetrics`` (once); ``NO_METRICS`` as it is."""
    if metrics is NO_METRICS or isinstance(metrics, SafeMetrics):
        return metrics
    return SafeMetrics(metrics)


def write_totals(pre_commit: PreCommit) -> tuple[int, int, int]:
    """Files, rows and bytes of a write, over all its tables."""
    files = rows = size = 0
    for table in pre_commit.tables:
        files += len(table.data_files)
        rows += table.data_files.record_count()
        size += table.data_files.size_in_bytes()
    return files, rows, size


def report_pending(store: SinkStateStore, sink_id: str, metrics: Metrics) -> tuple[int, float]:
    """Set the sink's Pending gauges from the store's ``(sink_id, status)`` index; returns them.

    The age is measured on the database's clock, the one ``created_at`` was written with, so a
    worker's clock skew cannot make a fresh epoch look stuck. No Pending epoch: count 0, age 0.
    """
    pending = store.epochs_with_status(sink_id, EpochStatus.PENDING)
    age = 0.0
    if pending:
        oldest = min(row.created_at for row in pending)
        age = max(0.0, (store.now() - oldest).total_seconds())
    tags = {"sink_id": sink_id}
    metrics.gauge(PENDING_EPOCHS, float(len(pending)), tags)
    metrics.gauge(OLDEST_PENDING_AGE, age, tags)
    return len(pending), age


def count_commit(metrics: Metrics, sink_id: str, result: CommitResult, took: timedelta) -> None:
    """Count a commit by outcome; only the attempt that made the epoch visible counts its files and rows,
    so the counters add up to what the tables hold however often a commit is retried or rerun."""
    tags = {"sink_id": sink_id}
    metrics.incr(COMMITS, 1, {**tags, "outcome": result.outcome.name.lower()})
    if result.outcome is CommitOutcome.COMMITTED:
        files, rows, size = write_totals(result.record.pre_commit)
        metrics.timing(COMMIT_DURATION, took, tags)
        metrics.incr(COMMIT_FILES, files, tags)
        metrics.incr(COMMIT_ROWS, rows, tags)
        metrics.incr(COMMIT_BYTES, size, tags)
        changes = [t.changes for t in result.record.pre_commit.tables if t.changes is not None]
        if changes:
            metrics.incr(COMMIT_INSERTED, sum(c.inserted for c in changes), tags)
            metrics.incr(COMMIT_UPDATED, sum(c.updated for c in changes), tags)
            metrics.incr(COMMIT_DELETED, sum(c.deleted for c in changes), tags)


def count_abort(metrics: Metrics, sink_id: str, result: AbortResult) -> None:
    tags = {"sink_id": sink_id}
    metrics.incr(ABORTS, 1, {**tags, "outcome": result.outcome.name.lower()})
    if result.files_deleted:
        metrics.incr(ABORT_FILES_DELETED, result.files_deleted, tags)


def require_epoch(store: SinkStateStore, sink_id: str, epoch: int) -> EpochRecord:
    """The epoch's row; ``EpochNotFound`` (naming sink and epoch) when it was never persisted."""
    check_epoch(epoch)
    row = store.get(sink_id, epoch)
    if row is None:
        raise EpochNotFound(f"sink {sink_id!r} epoch {epoch} was never persisted")
    return row


def note_error(store: SinkStateStore, row: EpochRecord, exc: Exception) -> None:
    """Keep the last failure on the row, where the UI and ``eo-sink show`` give it to operators."""
    try:
        store.record_error(row.sink_id, row.epoch, write_id=row.write_id, error=f"{type(exc).__name__}: {exc}")
    except MetaStoreUnavailable:
        log.warning("could not record the error on sink %r epoch %d", row.sink_id, row.epoch)


def record_warning(store: SinkStateStore, pre: PreCommit, warning: str) -> None:
    """Said at WARNING and kept on the epoch's row, where the UI and eo-sink show it."""
    log.warning("%s", warning)
    try:
        store.record_warning(pre.sink_id, pre.epoch, warning=warning)
    except MetaStoreUnavailable:
        log.warning("could not record the warning on sink %r epoch %d", pre.sink_id, pre.epoch)


def warn_other_dag(store: SinkStateStore, pre: PreCommit, row: EpochRecord, dag_id: str | None) -> str | None:
    """A write from another DAG for an epoch already settled: the sink id may be reused by mistake."""
    warning = other_dag_warning(pre, row, dag_id)
    if warning is not None:
        record_warning(store, pre, warning)
    return warning


#: Epochs per sink commit: enough that a commit's cost on the table's history is shared widely,
#: few enough that a batch that fails and falls back to single commits costs little more.
BATCH_EPOCHS = 100

#: Fault points, in the order one batch passes them.
FAULT_DECIDED = "batch.decided"
FAULT_VISIBLE = "batch.visible"
FAULT_MARKED = "batch.marked"


@dataclass(frozen=True)
class EpochBatches:
    """Commits runs of a sink's Pending appends together; ``alone`` commits one epoch by itself
    (the coordinator's ``commit``, reporting into the recovery report)."""

    sink_id: str
    store: SinkStateStore
    committer: BatchCommitter
    fault: FaultHook
    metrics: Metrics
    allow_beyond_horizon: bool = False
    size: int = BATCH_EPOCHS

    @classmethod
    def of(
        cls,
        sink_id: str,
        store: SinkStateStore,
        committer: SinkCommitter,
        fault: FaultHook,
        metrics: Metrics,
        allow_beyond_horizon: bool,
    ) -> EpochBatches | None:
        """Batches for a committer that can make them; ``None`` (every epoch alone) otherwise."""
        if not isinstance(committer, BatchCommitter):
            return None
        return cls(sink_id, store, committer, fault, metrics, allow_beyond_horizon)

    def commit(self, rows: Sequence[EpochRecord], report: RecoveryReport, alone: Callable[[EpochRecord], None]) -> None:
        """Commit ``rows`` (each let through by ``commits_in_batch``, in epoch order), ``size`` at a
        time; an epoch that cannot join a batch is committed alone where it stands in the order."""
        pending = list(rows)
        while pending:
            chunk = pending[: self.size]
            settled = self._commit_prefix(chunk, report, alone)
            if settled < len(chunk):
                alone(chunk[settled])
                settled += 1
            pending = pending[settled:]

    def _commit_prefix(
        self, rows: list[EpochRecord], report: RecoveryReport, alone: Callable[[EpochRecord], None]
    ) -> int:
        """Commit the longest prefix of ``rows`` that can go together; how many rows were settled."""
        try:
            plans = list(self.committer.prepare_batch([row.pre_commit for row in rows]))
            count = next((i for i, plan in enumerate(plans) if plan is None), len(rows))
            undecided = [(row.epoch, row.write_id) for row in rows[:count] if row.commit_decided_at is None]
            decided = set(self.store.decide_commits(self.sink_id, undecided)) if undecided else set()
            count = next(
                (i for i, row in enumerate(rows[:count]) if row.commit_decided_at is None and row.epoch not in decided),
                count,
            )
            if count == 0:
                return 0
            rows = rows[:count]
            self.fault(FAULT_DECIDED)
            started = time.monotonic()
            committed = self.committer.commit_batch(
                [plan for plan in plans[:count] if plan is not None],
                [row.created_at for row in rows],
                allow_beyond_horizon=self.allow_beyond_horizon,
            )
            self.fault(FAULT_VISIBLE)
            marks = [
                CommitMark(row.epoch, row.write_id, tables, self.committer.identities(row.pre_commit))
                for row, tables in zip(rows, committed, strict=True)
            ]
            marked = set(self.store.mark_committed_batch(self.sink_id, marks))
            self.fault(FAULT_MARKED)
        except MetaStoreUnavailable:
            raise  # nothing else can make progress either; the recovery task is retried whole
        except Exception as exc:
            log.warning(
                "sink %r: %d epoch(s) from %d could not be committed together (%s: %s); committing them one at a time",
                self.sink_id,
                len(rows),
                rows[0].epoch,
                type(exc).__name__,
                exc,
            )
            for row in rows:
                alone(row)
            return len(rows)

        took = timedelta(seconds=(time.monotonic() - started) / count)
        for row, tables in zip(rows, committed, strict=True):
            if row.epoch in marked:
                report.committed.append(row.epoch)
                record = dataclasses.replace(row, status=EpochStatus.COMMITTED, committed=tables)
                count_commit(self.metrics, self.sink_id, CommitResult(CommitOutcome.COMMITTED, record), took)
            else:
                alone(row)  # its row moved under the batch: its own commit tells settled from stale
        log.info("sink %r: %d epoch(s) from %d committed in one commit", self.sink_id, len(marked), rows[0].epoch)
        return count


class EpochSteps(Protocol):
    """The steps recovery carries its decisions out through: the coordinator's own, so that a
    recovered epoch passes the same checks as one its tasks finished."""

    def commit(self, sink_id: str, epoch: int, *, recovery: bool = False) -> CommitResult: ...

    def abort(self, sink_id: str, epoch: int, *, reason: str) -> AbortResult: ...


def recover_pending(
    coordinator: EpochSteps,
    store: SinkStateStore,
    checkpoints: CheckpointSource,
    sink_id: str,
    batches: EpochBatches | None = None,
    *,
    audited: bool = False,
) -> RecoveryReport:
    """Commit the Pending epochs whose commit was decided or whose checkpoint completed, abort those
    whose checkpoint failed, leave the rest waiting. One epoch's failure is reported (and kept on its
    row) and does not stop the others; an unreachable meta store stops the pass, to be retried whole.
    With ``batches``, runs of appends are committed together; an epoch committed on its own (an
    upsert, a revision) first lets the run before it commit, so the table's history keeps epoch order.
    An audited sink's epochs (D23) are published one by one once their audit passed, and wait for it
    otherwise, named in the report.
    """
    report = RecoveryReport(sink_id)
    run: list[EpochRecord] = []

    def attempt(row: EpochRecord, action: Callable[[], object]) -> None:
        try:
            action()
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
            note_error(store, row, exc)

    def commit_alone(row: EpochRecord) -> None:
        def commit() -> None:
            coordinator.commit(sink_id, row.epoch, recovery=True)
            report.committed.append(row.epoch)

        attempt(row, commit)

    def commit_run() -> None:
        if run and batches is not None:
            batches.commit(run, report, commit_alone)
        run.clear()

    def abort(row: EpochRecord) -> None:
        aborted = coordinator.abort(sink_id, row.epoch, reason="recovery: checkpoint FAILED")
        report.aborted.append(row.epoch)
        report.files_deleted += aborted.files_deleted

    for row in sorted(store.epochs_with_status(sink_id, EpochStatus.PENDING), key=lambda r: r.epoch):
        decided: list[Decision] = []
        lookups = EpochLookups.of(store, checkpoints, sink_id, row.epoch, audited=audited)
        # A refusal (an upsert epoch behind an undecided one) is the epoch's failure, as the commit's would be.
        attempt(row, lambda: decided.append(recovery_decision(row, lookups).raise_if_refused()))  # noqa: B023
        if not decided:
            continue
        action = decided[0].action
        if action in (Action.WAIT, Action.WAIT_FOR_AUDIT):
            report.waiting.append(row.epoch)
        elif action in (Action.ABORT, Action.ABORT_REVISION):
            attempt(row, lambda: abort(row))  # noqa: B023
        elif batches is not None and commits_in_batch(row, decided[0]):
            run.append(row)
            if len(run) >= batches.size:
                commit_run()
        else:
            commit_run()
            commit_alone(row)
    commit_run()
    return report


def lost_files(committer: SinkCommitter, row: EpochRecord) -> list[str]:
    """The data files of a Pending write that are gone, when that is reason enough to give it up.

    Refused (``AbortRefused``) while a table shows the epoch's write (it is partly visible: only
    restoring the files and committing keeps it whole) and while every file is there (commit).
    A revision's files count as lost also when those of the write it replaces left the table
    (``ReplacedFilesMissing``): the replacement can then never be made, and the earlier write stays.
    So do an upsert's when the table moved under it (``UpsertConflict``): its changes can then
    never be committed as written, and must be written again.
    """
    shown = shown_tables(committer, row)
    missing = [] if shown else list(committer.missing_files(row.pre_commit))
    if not shown and row.kind.lost_beyond_files:
        try:
            committer.prepare(row.pre_commit, replaces=row.replaces)
        except ReplacedFilesMissing as exc:
            missing += exc.missing
        except UpsertConflict as exc:
            missing += exc.conflicting
    refusal = files_lost_refusal(row, shown, missing)
    if refusal is not None:
        raise refusal
    return missing


def shown_tables(committer: SinkCommitter, row: EpochRecord) -> list[str]:
    """The tables that show this write's commit (of a revision: its own, not the write it replaces)."""
    visible = committer.find_committed(row.pre_commit, row.created_at)
    return [t for t in visible.tables if not row.kind.revises or visible.write_ids.get(t) == row.write_id]


def prepare_rewrite(
    row: EpochRecord,
    committer: SinkCommitter,
    checkpoint: CheckpointLookup,
    give_up: Callable[[str], AbortResult],
    run_writes: Collection[str] = (),
) -> RewriteResult:
    """Make way for writing an upsert epoch again after its write conflicted (``rewrite_decision``).

    A write persist refused for a conflict is Aborted already. An undecided write stays Pending: the
    next write's persist replaces it and removes its files. A decided one is given up as lost
    (``give_up``: the coordinator's abort with ``files_lost``, which checks that no table shows it),
    so that the next write re-opens the epoch. Refused (``RewriteRefused``) for a write that can
    still commit. ``run_writes``: the writes the run made so far (its write task's and earlier
    rewrites').
    """

    def conflict() -> UpsertConflict | None:
        try:
            committer.prepare(row.pre_commit, replaces=row.replaces)
        except UpsertConflict as exc:
            return exc
        return None

    shown = lambda: shown_tables(committer, row)  # noqa: E731
    decision = rewrite_decision(row, run_writes, conflict, checkpoint, shown).raise_if_refused()
    if decision.action is Action.ALREADY_COMMITTED:
        return RewriteResult(RewriteOutcome.ALREADY_COMMITTED, row, decision.why)
    if decision.action is Action.GIVE_UP_AND_REWRITE:
        given_up = give_up(f"{REWRITE_REASON}: {decision.why}")
        log.warning("%s: %s", row.pre_commit.describe(), decision.why)
        return RewriteResult(RewriteOutcome.GAVE_UP, given_up.record or row, decision.why)
    log.warning("%s: %s", row.pre_commit.describe(), decision.why)
    return RewriteResult(RewriteOutcome.REWRITE, row, decision.why)


#: How often persist (and abort) re-reads the row after losing a CAS race before it gives up.
_PERSIST_RACE_ROUNDS = 5


class TwoPhaseCommitCoordinator:
    """Drives epochs of any number of sinks over one store and one checkpoint source.

    ``committers`` maps each sink id to the committer of its sink (an Iceberg table set, a file
    directory). ``allow_beyond_horizon`` lets commits of epochs older than the sink's snapshot
    retention go ahead; it is for an operator who has checked by other means. ``full_file_check_after``:
    how long after its persist an epoch's commit checks only the write's own manifests before its
    decision, not every file (``FULL_FILE_CHECK_AFTER``; 0: every commit checks every file).
    """

    def __init__(
        self,
        store: SinkStateStore,
        committers: Mapping[str, SinkCommitter],
        checkpoints: CheckpointSource,
        *,
        allow_beyond_horizon: bool = False,
        full_file_check_after: timedelta = FULL_FILE_CHECK_AFTER,
        on_reprocess: Mapping[str, OnReprocess] | None = None,
        audited: Collection[str] = (),
        fault: FaultHook = no_faults,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        for sink_id in committers:
            check_sink_id(sink_id)
        self._store = store
        self._committers = dict(committers)
        self._checkpoints = checkpoints
        self._allow_beyond_horizon = allow_beyond_horizon
        if not isinstance(full_file_check_after, timedelta) or full_file_check_after < timedelta(0):
            raise InvalidSinkConfig(
                f"full_file_check_after must be a non-negative timedelta, got {full_file_check_after!r}"
            )
        self._full_file_check_after = full_file_check_after
        #: Per sink: what a newer generation's write does to a committed epoch (``"keep"`` unless given).
        self._on_reprocess = dict(on_reprocess or {})
        #: The sinks whose writes are audited before they are published (design.md D23).
        self._audited = frozenset(audited)
        self._fault = fault
        #: Commit durations, files, rows, outcomes and aborts (``core.coordinator``); never decides anything.
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
        no row, the common case: the insert is refused (``StateConflict``) when it has one, read then.
        On a sink that replaces reprocessed epochs the first round reads the row: a revision is then
        staged once, as a revision, not first as an append that the revision's manifests supersede."""
        on_reprocess = self._on_reprocess.get(p.pre.sink_id, "keep")
        row = self._store.get(p.pre.sink_id, p.pre.epoch) if on_reprocess == "replace" else None
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

    def commit(
        self,
        sink_id: str,
        epoch: int,
        *,
        recovery: bool = False,
        audit_checks: Sequence[AuditCheck] | None = None,
    ) -> CommitResult:
        """Make the epoch's persisted write visible exactly once, after its checkpoint completed.

        ``recovery``: a recovery's or a person's commit, off the hot path, checks every file of the
        write before its decision (``prepare``). ``audit_checks``: a publish's (design.md D23), the
        checks of an audit that all passed, recorded with the commit decision in one transaction;
        a failed one is recorded alone (``judge_audit``) and refuses the publish."""
        started = time.monotonic()
        try:
            result = self._commit(sink_id, epoch, recovery, audit_checks)
        except Exception as exc:
            self._metrics.incr(COMMIT_ERRORS, 1, {"sink_id": sink_id, "error": type(exc).__name__})
            raise
        count_commit(self._metrics, sink_id, result, timedelta(seconds=time.monotonic() - started))
        return result

    def _commit(
        self, sink_id: str, epoch: int, recovery: bool, audit_checks: Sequence[AuditCheck] | None
    ) -> CommitResult:
        committer = self._committer(sink_id)
        row = require_epoch(self._store, sink_id, epoch)
        passed = self._passing(row, audit_checks)
        if passed is not None:
            row = dataclasses.replace(row, audit=passed)  # decided as judged; recorded with the decision
        lookups = EpochLookups.of(self._store, self._checkpoints, sink_id, epoch, audited=sink_id in self._audited)
        decision = commit_decision(row, lookups).raise_if_refused()
        if decision.action is Action.ALREADY_COMMITTED:
            return CommitResult(CommitOutcome.ALREADY_COMMITTED, row)

        if decision.action is Action.DECIDE_AND_COMMIT:
            # Once decided, the write can only be committed; so decide only for a write the sink can
            # still take (its table may have changed since persist), and keep the others abortable.
            try:
                plan = self.prepare(row, recovery=recovery)
            except Exception as exc:
                now = require_epoch(self._store, sink_id, epoch)  # a newer write may have taken its files
                if (now.status, now.write_id) != (EpochStatus.PENDING, row.write_id):
                    return self._settled_by_other(sink_id, epoch, row.write_id)
                note_error(self._store, row, exc)
                raise
            try:
                row = self._store.decide_commit(sink_id, epoch, write_id=row.write_id, audit=passed)
            except StateConflict:
                return self._settled_by_other(sink_id, epoch, row.write_id)
            if passed is not None:
                self._count_audit(passed, row)
                self._fault("audit.ran")
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

    # -- write, audit, publish (design.md D23) -------------------------------------------------------

    def commit_audit(self, sink_id: str, epoch: int) -> EpochRecord:
        """Commit an audited sink's write to its audit branch once its checkpoint completed, where its
        checks read it and ``main``'s readers do not; the row keeps the audit snapshots. Idempotent:
        the branch's marker tells a repeated attempt that the commit happened."""
        committer = self._auditing(sink_id)
        row = require_epoch(self._store, sink_id, epoch)
        lookups = EpochLookups.of(self._store, self._checkpoints, sink_id, epoch, audited=True)
        decision = audit_decision(row, lookups).raise_if_refused()
        if decision.action is not Action.COMMIT_AUDIT:
            return row
        try:
            # The sink's checks, and its files there (design.md step 3), before any commit; the plan
            # then carries the audit commit, as it carries a publish's.
            plan = self.prepare(row)
            snapshots = committer.commit_audit(plan, row.created_at, allow_beyond_horizon=self._allow_beyond_horizon)
        except Exception as exc:
            note_error(self._store, row, exc)
            raise
        self._fault("audit.committed")
        branch = committer.audit_branch(row.pre_commit)
        audit = EpochAudit(write_id=row.write_id, branch=branch, snapshots=snapshots, committed_at=self._store.now())
        try:
            record = self._store.record_audit(sink_id, epoch, audit)
        except StateConflict:
            now = require_epoch(self._store, sink_id, epoch)
            if now.write_id == row.write_id and (now.audit_of_write or now.status is EpochStatus.COMMITTED):
                return now  # a concurrent attempt recorded it, or published it
            committer.drop_audit(row.pre_commit, row.created_at)  # another write holds the epoch now
            raise
        log.info("%s committed to audit branch %s: %s", row.pre_commit.describe(), audit.branch, dict(snapshots))
        return record

    def judge_audit(self, sink_id: str, epoch: int, checks: Sequence[AuditCheck], *, write_id: str) -> EpochRecord:
        """Keep what the audit's checks found on the write's row: passed when every check did, and
        the publish may then be decided; failed otherwise, and ``main`` stays untouched. A cleared
        audit judges the same audit snapshot again; once the publish is decided, nothing changes."""
        row = require_epoch(self._store, sink_id, epoch)
        audit = row.audit_of_write
        if row.write_id != write_id or audit is None or row.status is not EpochStatus.PENDING:
            raise StateConflict(
                f"sink {sink_id!r} epoch {epoch}: no audit of write {write_id} to judge (the epoch holds "
                f"{row.stage} write {row.write_id})"
            )
        if row.commit_decided_at is not None:
            return row
        judged = audit.judged(checks)
        record = self._store.record_audit(sink_id, epoch, judged)
        self._fault("audit.ran")
        self._count_audit(judged, record)
        return record

    def _passing(self, row: EpochRecord, checks: Sequence[AuditCheck] | None) -> EpochAudit | None:
        """A publish's audit as its checks judge it, when every one passed and it is the row's write's
        to judge; a failing verdict is recorded at once and refuses the publish (``AuditNotPassed``)."""
        audit = row.audit_of_write
        if checks is None or audit is None or row.status is not EpochStatus.PENDING or row.commit_decided_at:
            return None
        judged = audit.judged(checks)
        if judged.verdict is not AuditVerdict.PASSED:
            failed = self.judge_audit(row.sink_id, row.epoch, checks, write_id=row.write_id)
            raise audit_refusal(failed) or AuditNotPassed(f"{row.pre_commit.describe()}: its audit did not pass")
        return judged

    def _count_audit(self, audit: EpochAudit, record: EpochRecord) -> None:
        tags = {"sink_id": record.sink_id, "verdict": str(audit.verdict)}
        self._metrics.incr(AUDITS, 1, tags)
        if audit.committed_at is not None:
            self._metrics.timing(AUDIT_DURATION, record.updated_at - audit.committed_at, tags)

    def reject(self, sink_id: str, epoch: int, *, reason: str) -> AbortResult:
        """Drop an audited write that failed its audit: the epoch becomes Aborted (cause ``rejected``),
        its audit branch goes and its files are deleted once nothing references them."""
        row = require_epoch(self._store, sink_id, epoch)
        audit = row.audit_of_write
        if row.status is not EpochStatus.PENDING or audit is None or audit.verdict is not AuditVerdict.FAILED:
            raise AbortRefused(
                f"sink {sink_id!r} epoch {epoch} is {row.stage}: only a write whose audit failed is rejected; "
                "abort it instead (eo-sink abort)"
            )
        write = row.pre_commit
        return self.abort(
            sink_id, epoch, reason=f"rejected: {reason}", write=write, force=True, cause=AbortCause.REJECTED
        )

    def _auditing(self, sink_id: str) -> AuditingCommitter:
        committer = self._committer(sink_id)
        if sink_id not in self._audited or not isinstance(committer, AuditingCommitter):
            raise InvalidSinkConfig(f"sink {sink_id!r} is not audited: its writes are committed without an audit")
        return committer

    def prepare(self, row: EpochRecord, *, recovery: bool = False) -> CommitPlan:
        """``SinkCommitter.prepare`` right before the commit decision, as the commit's dry run runs it:
        the write's own manifests checked while it is younger than ``full_file_check_after``, every file
        of it when older, and in every recovery (design.md, 'The Iceberg commit', step 3)."""
        young = datetime.now(UTC) - row.created_at < self._full_file_check_after
        check = FileCheck.OWN_MANIFESTS if young and not recovery else FileCheck.EVERY_FILE
        return self._committer(row.sink_id).prepare(row.pre_commit, replaces=row.replaces, check_files=check)

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
        (``prepare_rewrite``). ``run_writes``: the writes the run made so far."""
        return prepare_rewrite(
            require_epoch(self._store, sink_id, epoch),
            self._committer(sink_id),
            lambda: self._checkpoints.status(sink_id, epoch),
            lambda reason: self.abort(sink_id, epoch, reason=reason, files_lost=True, cause=AbortCause.UPSERT_CONFLICT),
            run_writes,
        )

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, sink_id: str) -> RecoveryReport:
        """Finish what crashes left half done for one sink: its Pending epochs (``core.coordinator``), then clean-ups."""
        committer, beyond = self._committer(sink_id), self._allow_beyond_horizon
        audited = sink_id in self._audited
        batches = (
            None if audited else EpochBatches.of(sink_id, self._store, committer, self._fault, self._metrics, beyond)
        )
        report = recover_pending(self, self._store, self._checkpoints, sink_id, batches, audited=audited)
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


__all__ = [
    "BATCH_EPOCHS",
    "FULL_FILE_CHECK_AFTER",
    "EpochBatches",
    "EpochSteps",
    "TwoPhaseCommitCoordinator",
    "note_error",
    "record_warning",
    "recover_pending",
    "require_epoch",
    "warn_other_dag",
]
