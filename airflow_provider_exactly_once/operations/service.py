"""What a person operating Airflow can do to the sinks: one service for the CLI and the UI.

Every action goes through the sink's coordinator, rebuilt from the sink registry as the recovery DAG
rebuilds it, so an operator's abort, commit or clean-up runs under the invariants of the DAG's own
tasks; a dry run says what the action would do and raises its refusal, writing nothing. Reads are
in ``reads.py``; a sink's delivery is kept a minute (``Deliveries``). The contract: design.md,
"The seven invariants" and D18 (delivery); the actions: docs/operations.md.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
from airflow_provider_exactly_once.core.cleanups import remove_orphans, scan_orphans, scan_stray
from airflow_provider_exactly_once.core.decisions import (
    Action,
    EpochLookups,
    abort_decision,
    commit_decision,
    recovery_decision,
)
from airflow_provider_exactly_once.core.delivery import FILE_SINK, SINGLE_TABLE, EpochDelivery, unknown
from airflow_provider_exactly_once.core.epochs import AuditStage, EpochStatus, abort_reason_fault, check_epoch
from airflow_provider_exactly_once.core.errors import (
    EpochNotFound,
    ExactlyOnceError,
    SinkUnavailable,
    find_control,
)
from airflow_provider_exactly_once.core.ports import CheckpointSource, CleanupTask, EpochRecord
from airflow_provider_exactly_once.defaults import DEFAULT_LOCK_TTL, DEFAULT_META_CONN_ID, DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.operations.reads import InvalidRequest, SinkNotFound, SinkReads
from airflow_provider_exactly_once.operations.views import ActionResult, describe_write
from airflow_provider_exactly_once.runtime.assembly import checkpoint_source, iceberg_catalog, reaching
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, SinkConfig
from airflow_provider_exactly_once.store import SqlSinkStateStore

if TYPE_CHECKING:
    from airflow_provider_exactly_once.core.cleanups import OrphanCandidate
    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.runtime.assembly import OpenedSink
    from airflow_provider_exactly_once.sinks.config import SinkConfig


def _holder() -> str:
    """Who holds a sink's lock during an operator's recovery or gc: shown to anyone who finds it taken."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "unknown"
    return f"eo-sink {user}@{socket.gethostname()} pid {os.getpid()}"[:250]


class SinkOperations(SinkReads):
    """Views of the sinks and their epochs (``SinkReads``), and the actions an operator may take on them.

    :param store: the meta store (the caller disposes of it).
    :param meta_conn_id: the meta-store connection the store came from, passed to the coordinators
        it rebuilds (they reuse ``store``). Each sink's Iceberg catalog comes from the sink's Iceberg
        connection, as in the recovery DAG.
    """

    def __init__(
        self,
        store: SqlSinkStateStore,
        *,
        meta_conn_id: str = DEFAULT_META_CONN_ID,
    ) -> None:
        super().__init__(store)
        self.meta_conn_id = meta_conn_id
        self._deliveries = Deliveries()

    def delivery(self, sink_id: str) -> EpochDelivery:
        """How the sink's epochs reach their tables, for one epoch's view (``operations.service``):
        a view, so a sink that is not registered, or whose catalog cannot be opened, is ``unknown``
        with why, never an error."""
        try:
            sink, _ = self._registration(sink_id)
        except ExactlyOnceError as exc:
            return unknown(None, exc)
        return self._deliveries.of(sink)

    # -- actions on one epoch ----------------------------------------------------------------------

    def abort(
        self,
        sink_id: str,
        epoch: int,
        *,
        reason: str,
        by: str | None = None,
        force: bool = False,
        files_lost: bool = False,
        dry_run: bool = False,
    ) -> ActionResult:
        """Abort the epoch's current write and delete its files, as the coordinator allows.

        The write the row holds now is the one aborted: should a rerun replace it meanwhile, only the
        write the operator saw is removed (the coordinator's "other write" path), never the new one.
        ``files_lost`` gives up a write whose data files are gone, even after its commit decision.
        ``by`` says who aborts (the UI's user): the row keeps ``"<reason> (by <by>)"``, and the cap on
        the reason (``ABORT_REASON_MAX_LENGTH``) is on what the person wrote.
        """
        reason = _reason_by(sink_id, epoch, reason, by)
        coordinator = self._coordinator(sink_id)
        if self.store.get(sink_id, epoch) is None and (reserved := self.store.input_ranges.range_of(sink_id, epoch)):
            # An incremental epoch whose write never persisted holds the newest range: the next
            # epoch waits for it to settle (core.input_ranges). Its abort is the record of that.
            detail = f"no write persisted; its range ({reserved.describe()}) goes to the next epoch"
            if dry_run:
                return ActionResult(
                    action="abort", sink_id=sink_id, epoch=epoch, dry_run=True, outcome="would abort", detail=detail
                )
            result = coordinator.abort(sink_id, epoch, reason=reason)
            return ActionResult(
                action="abort", sink_id=sink_id, epoch=epoch, dry_run=False, outcome=result.outcome.value, detail=detail
            )
        row = self._row(sink_id, epoch)
        if dry_run:
            return self._abort_plan(coordinator, row, force, files_lost)
        result = coordinator.abort(
            sink_id, epoch, reason=reason, write=row.pre_commit, force=force, files_lost=files_lost
        )
        return ActionResult(
            action="abort",
            sink_id=sink_id,
            epoch=epoch,
            dry_run=False,
            outcome=result.outcome.value,
            detail=f"{describe_write(row.pre_commit)}; {result.files_deleted} file(s) deleted",
            files_deleted=result.files_deleted,
        )

    def reject(
        self, sink_id: str, epoch: int, *, reason: str, by: str | None = None, dry_run: bool = False
    ) -> ActionResult:
        """Drop an audited write whose audit failed (design.md D23): the epoch becomes Aborted, its
        audit branch goes and its files are deleted once nothing references them. ``by`` as for ``abort``."""
        reason = _reason_by(sink_id, epoch, reason, by)
        coordinator = self._coordinator(sink_id)
        row = self._row(sink_id, epoch)
        audit = row.audit_of_write
        detail = describe_write(row.pre_commit) + (f"; failed checks: {audit.failing()}" if audit else "")
        if dry_run:
            outcome = "would reject" if row.stage == AuditStage.AUDIT_FAILED else f"refused: the epoch is {row.stage}"
            return ActionResult(
                action="reject", sink_id=sink_id, epoch=epoch, dry_run=True, outcome=outcome, detail=detail
            )
        result = coordinator.reject(sink_id, epoch, reason=reason)
        return ActionResult(
            action="reject",
            sink_id=sink_id,
            epoch=epoch,
            dry_run=False,
            outcome=result.outcome.value,
            detail=f"{detail}; {result.files_deleted} file(s) deleted",
            files_deleted=result.files_deleted,
        )

    def _abort_plan(
        self, coordinator: TwoPhaseCommitCoordinator, row: EpochRecord, force: bool, files_lost: bool
    ) -> ActionResult:
        sink_id, epoch = row.sink_id, row.epoch
        decision = abort_decision(
            row,
            None,
            lambda: self._checkpoints(sink_id).status(sink_id, epoch),
            replaced=lambda: False,  # the epoch's own write: never a replaced one
            force=force,
            files_lost=files_lost,
        ).raise_if_refused()

        def plan(outcome: str, detail: str) -> ActionResult:
            return ActionResult(
                action="abort", sink_id=sink_id, epoch=epoch, dry_run=True, outcome=outcome, detail=detail
            )

        if decision.action is Action.ALREADY_COMMITTED:
            return plan("already committed", f"nothing would change: {decision.why}")
        if decision.action is Action.ALREADY_ABORTED:
            return plan("already aborted", self._cleanup_plan(self.store.cleanups(sink_id, epoch)))
        if decision.action is Action.GIVE_UP_LOST_FILES:
            missing = coordinator.lost_files(row)  # raises the refusal the abort itself would raise
            shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            return plan(
                "would abort",
                f"{len(missing)} data file(s) lost ({shown}) and no table shows the epoch: the row would become "
                f"Aborted and what is left of {describe_write(row.pre_commit)} would be deleted",
            )
        locations = ", ".join(t.location for t in row.pre_commit.tables)
        return plan(
            "would abort",
            f"{decision.why}: the row would become Aborted and "
            f"{describe_write(row.pre_commit)} would be deleted from {locations}",
        )

    def commit(
        self, sink_id: str, epoch: int, *, dry_run: bool = False, allow_beyond_horizon: bool = False
    ) -> ActionResult:
        """Retry the commit of a Pending epoch (its checkpoint must have completed).

        ``allow_beyond_horizon`` commits an epoch older than the table's snapshot history, where
        the absence of its marker no longer proves it uncommitted: only after a person has read
        the table's history and found the epoch's rows absent (docs/operations.md). A person's
        commit is a recovery's: it checks every file of the write before its decision.
        """
        coordinator = self._coordinator(sink_id, allow_beyond_horizon=allow_beyond_horizon)
        row = self._row(sink_id, epoch)
        if dry_run:
            return self._commit_plan(coordinator, row)
        result = coordinator.commit(sink_id, epoch, recovery=True)
        committed = dict(result.record.committed or {})
        return ActionResult(
            action="commit",
            sink_id=sink_id,
            epoch=epoch,
            dry_run=False,
            outcome=result.outcome.value,
            detail=f"write {result.record.write_id}: " + ", ".join(f"{t} -> {s}" for t, s in sorted(committed.items())),
            report={"committed": committed, "write_id": result.record.write_id},
        )

    def _commit_plan(self, coordinator: TwoPhaseCommitCoordinator, row: EpochRecord) -> ActionResult:
        """The commit's own decision, on the same lookups; before a commit decision, the sink's own
        checks too (``coordinator.prepare``), so that a write the sink would refuse is refused here."""
        sink_id, epoch = row.sink_id, row.epoch
        lookups = EpochLookups.of(self.store, self._checkpoints(sink_id), sink_id, epoch)
        decision = commit_decision(row, lookups).raise_if_refused()
        if decision.action is Action.DECIDE_AND_COMMIT:
            coordinator.prepare(row, recovery=True)
        if decision.action is Action.ALREADY_COMMITTED:
            committed = dict(row.committed or {})
            return ActionResult(
                action="commit",
                sink_id=sink_id,
                epoch=epoch,
                dry_run=True,
                outcome="already committed",
                detail=f"nothing would change: {decision.why} ({committed})",
                report={"committed": committed, "write_id": row.write_id},
            )
        return ActionResult(
            action="commit",
            sink_id=sink_id,
            epoch=epoch,
            dry_run=True,
            outcome="would commit",
            detail=f"{decision.why}: {describe_write(row.pre_commit)} would become visible, one snapshot per table "
            "with the epoch's marker (skipped where the marker shows it already is)",
            report={"write_id": row.write_id},
        )

    def cleanup(self, sink_id: str, epoch: int, *, dry_run: bool = False) -> ActionResult:
        """Run the epoch's queued clean-ups again (an Aborted epoch whose files a crash left behind).

        The epoch's live write is never touched: only writes that can no longer become visible are
        queued, and the committer re-checks the sink before each delete.
        """
        coordinator = self._coordinator(sink_id)
        check_epoch(epoch)
        tasks = self.store.cleanups(sink_id, epoch)
        if not tasks and self.store.get(sink_id, epoch) is None:
            raise EpochNotFound(f"sink {sink_id!r} epoch {epoch} was never persisted and has no clean-up queued")
        if dry_run:
            return ActionResult(
                action="cleanup",
                sink_id=sink_id,
                epoch=epoch,
                dry_run=True,
                outcome="would clean up" if tasks else "nothing to clean up",
                detail=self._cleanup_plan(tasks),
                report={"cleanups": [_cleanup_dict(t) for t in tasks]},
            )
        report = coordinator.clean_up(sink_id, epoch)
        failed = {str(k): v for k, v in report.failed.items()}
        return ActionResult(
            action="cleanup",
            sink_id=sink_id,
            epoch=epoch,
            dry_run=False,
            outcome="failed" if failed else ("cleaned up" if tasks else "nothing to clean up"),
            detail=f"{len(tasks)} queued clean-up(s); {report.files_deleted} file(s) deleted"
            + (f"; failed: {'; '.join(failed.values())}" if failed else ""),
            files_deleted=report.files_deleted,
            ok=not failed,
            report={"failed": failed},
        )

    # -- actions on a sink -------------------------------------------------------------------------

    def recover(self, sink_id: str, *, dry_run: bool = False) -> ActionResult:
        """What the recovery DAG's task does for one sink, under the sink's lock (``recovery/sink.py``)."""
        sink, checkpoint = self._registration(sink_id)
        if dry_run:
            return self._recovery_plan(sink, checkpoint)
        from airflow_provider_exactly_once.recovery.sink import recover_sink

        report = recover_sink(self.store, sink_id, holder=_holder())
        return ActionResult(
            action="recover",
            sink_id=sink_id,
            epoch=None,
            dry_run=False,
            outcome="recovered" if report.ok else "failed",
            detail=report.summary(),
            files_deleted=report.files_deleted,
            ok=report.ok,
            report=report.model_dump(mode="json"),
        )

    def _recovery_plan(self, sink: SinkConfig, checkpoint: CheckpointConfig | None) -> ActionResult:
        sink_id = sink.sink_id
        source = checkpoint_source(checkpoint, self.store.checkpoints)
        commit: list[int] = []
        abort: list[int] = []
        waiting: list[int] = []
        unknown: dict[str, str] = {}
        refused: dict[str, str] = {}  # what the recovery would report failed, as the commit refuses it
        lists = {
            Action.COMMIT_DECIDED: commit,
            Action.DECIDE_AND_COMMIT: commit,
            Action.ABORT: abort,
            Action.ABORT_REVISION: abort,
        }
        for row in self.store.epochs_with_status(sink_id, EpochStatus.PENDING):
            try:
                decision = recovery_decision(row, EpochLookups.of(self.store, source, sink_id, row.epoch))
            except Exception as exc:  # recovery would report this epoch failed and go on
                unknown[str(row.epoch)] = f"{type(exc).__name__}: {exc}"
                continue
            if decision.error is not None:
                refused[str(row.epoch)] = f"{type(decision.error).__name__}: {decision.error}"
                continue
            lists.get(decision.action, waiting).append(row.epoch)
        tasks = self.store.cleanups(sink_id)
        scan: tuple[list[OrphanCandidate], list[OrphanCandidate], str | None]
        try:
            opened = self._open(sink)
        except ExactlyOnceError as exc:  # recovery would report the scan failed and go on with the epochs
            scan = [], [], str(exc)
        else:
            scan = scan_orphans(opened.sink_id, opened.write_folders, self.store.registry, DEFAULT_ORPHAN_GRACE)
        old, young, scan_error = scan
        report: dict[str, Any] = {
            "commit": commit,
            "abort": abort,
            "waiting": waiting,
            "checkpoint_unknown": unknown,
            "refused": refused,
            "cleanups": [_cleanup_dict(t) for t in tasks],
            "orphans": [_orphan_dict(c) for c in old],
            "orphans_kept": [c.write_id for c in young],
        }
        if scan_error:
            report["orphan_scan_failed"] = scan_error
        anything = commit or abort or refused or tasks or old
        return ActionResult(
            action="recover",
            sink_id=sink_id,
            epoch=None,
            dry_run=True,
            outcome="would recover" if anything else "nothing to do",
            detail=f"sink {sink_id!r}: would commit {commit}, abort {abort}, leave waiting {waiting}, "
            f"refuse {sorted(int(e) for e in refused)}, run "
            f"{len(tasks)} queued clean-up(s) and remove {len(old)} orphaned write location(s) "
            f"older than {DEFAULT_ORPHAN_GRACE}",
            report=report,
        )

    def gc(self, sink_id: str, *, grace: timedelta, dry_run: bool = False) -> ActionResult:
        """Remove the sink's orphaned write locations whose files are all older than ``grace``, and
        its stray files that old (``core.cleanups.StrayFiles``: an Iceberg fan-out's metadata files
        written by a commit that died before the catalog took them).

        Orphans go through the store's clean-up queue and the clean-up path with the sink's committer,
        under the sink's lock, exactly as the recovery DAG removes them; no epoch's status is touched.
        """
        if not isinstance(grace, timedelta) or grace < timedelta(0):
            raise InvalidRequest(f"sink {sink_id!r}: the orphan grace must be a non-negative duration, got {grace!r}")
        sink, _ = self._registration(sink_id)
        opened = self._open(sink)
        if dry_run:
            old, young, scan_error = scan_orphans(opened.sink_id, opened.write_folders, self.store.registry, grace)
            stray, stray_error = scan_stray(opened.write_folders, grace)
            if scan_error or stray_error:
                # The sink, not the request, is at fault: a refusal to retry, not a usage error.
                raise SinkUnavailable(f"the orphan scan failed: {scan_error or stray_error}")
            files = sum(c.age.files for c in old)
            return ActionResult(
                action="gc",
                sink_id=sink_id,
                epoch=None,
                dry_run=True,
                outcome="would remove orphans" if old or stray else "nothing to do",
                detail=f"{len(old)} orphaned write location(s) older than {grace} ({files} file(s)) and {len(stray)} stray "
                f"file(s) would be removed; {len(young)} younger or of unknown age kept",
                report={
                    "orphans": [_orphan_dict(c) for c in old],
                    "orphans_kept": [c.write_id for c in young],
                    "stray": stray,
                },
            )
        report = remove_orphans(
            self.store,
            self.store.registry,
            opened.committer,
            opened.write_folders,
            sink_id,
            holder=_holder(),
            grace=grace,
            lock_ttl=DEFAULT_LOCK_TTL,
            fault=opened.fault,
        )
        failed = dict(report.failed)
        return ActionResult(
            action="gc",
            sink_id=sink_id,
            epoch=None,
            dry_run=False,
            outcome="failed"
            if failed
            else ("removed orphans" if report.orphans_removed or report.stray_removed else "nothing to do"),
            detail=f"{len(report.orphans_removed)} orphaned write location(s) and {len(report.stray_removed)} stray file(s) "
            f"removed ({report.files_deleted} file(s)), {len(report.orphans_kept)} kept"
            + (f"; failed: {failed}" if failed else ""),
            files_deleted=report.files_deleted,
            ok=not failed,
            report={
                "orphans_removed": report.orphans_removed,
                "orphans_kept": report.orphans_kept,
                "stray_removed": report.stray_removed,
                "failed": failed,
            },
        )

    # -- helpers -----------------------------------------------------------------------------------

    def _registration(self, sink_id: str) -> tuple[SinkConfig, CheckpointConfig | None]:
        from airflow_provider_exactly_once.runtime.assembly import registered_configs

        registration = registered_configs(self.store.registry, sink_id)
        if registration is None:
            raise SinkNotFound(
                f"sink {sink_id!r} is not in the sink registry (the epoch operators register a sink on first use), "
                "so its coordinator cannot be rebuilt"
            )
        return registration

    def _coordinator(self, sink_id: str, *, allow_beyond_horizon: bool = False) -> TwoPhaseCommitCoordinator:
        return self._build(*self._registration(sink_id), allow_beyond_horizon=allow_beyond_horizon)

    def _build(
        self, sink: SinkConfig, checkpoint: CheckpointConfig | None, *, allow_beyond_horizon: bool = False
    ) -> TwoPhaseCommitCoordinator:
        """The sink's coordinator; a catalog that cannot be reached is ``SinkUnavailable`` naming it.

        Building it opens the sink's catalog (pyiceberg's SQL catalog connects at once), whose
        errors are the driver's own: turned here into one refusal that says which connection and
        catalog failed, with any credentials masked, instead of a traceback or a bare 500.
        """
        from airflow_provider_exactly_once.runtime.assembly import coordinator_for

        with reaching(sink):
            return coordinator_for(
                sink,
                checkpoint,
                meta_conn_id=self.meta_conn_id,
                store=self.store,
                allow_beyond_horizon=allow_beyond_horizon,
            )

    def _open(self, sink: SinkConfig) -> OpenedSink:
        """The sink's committer and write-folder listing, opened once; failures as ``_build`` says them."""
        from airflow_provider_exactly_once.runtime.assembly import open_sink

        with reaching(sink):
            return open_sink(sink)

    def _checkpoints(self, sink_id: str) -> CheckpointSource:
        """The sink's checkpoint source, as its coordinator has it (``runtime.assembly``)."""
        _, checkpoint = self._registration(sink_id)
        return checkpoint_source(checkpoint, self.store.checkpoints)

    def _cleanup_plan(self, tasks: Sequence[CleanupTask]) -> str:
        if not tasks:
            return "no clean-up is queued"
        files = sum(sum(len(t.data_files) for t in task.pre_commit.tables) for task in tasks)
        writes = ", ".join(task.write_id for task in tasks)
        return (
            f"{len(tasks)} queued clean-up(s) would run (write(s) {writes}; up to {files} listed file(s) "
            "plus anything else under their write locations), each only where the sink proves it unreferenced"
        )


def _reason_by(sink_id: str, epoch: int, reason: str, by: str | None) -> str:
    """An abort's (or a reject's) reason as the row keeps it: ``"<reason> (by <by>)"``; the cap on
    the reason (``ABORT_REASON_MAX_LENGTH``) is on what the person wrote."""
    if (fault := abort_reason_fault(reason)) is not None:
        raise InvalidRequest(f"sink {sink_id!r} epoch {epoch}: {fault}")
    if by is None:
        return reason
    if (control := find_control(by)) is not None:
        raise InvalidRequest(f"sink {sink_id!r} epoch {epoch}: who acts ({by!r}) holds the control character {control}")
    return f"{reason} (by {by})"


def _cleanup_dict(task: CleanupTask) -> dict[str, Any]:
    return {
        "id": task.id,
        "epoch": task.epoch,
        "write_id": task.write_id,
        "reason": task.reason,
        "files": sum(len(t.data_files) for t in task.pre_commit.tables),
        "locations": [t.location for t in task.pre_commit.tables],
        "created_at": task.created_at.isoformat(),
    }


def _orphan_dict(candidate: OrphanCandidate) -> dict[str, Any]:
    return {
        "write_id": candidate.write_id,
        "locations": [loc.location for loc in candidate.locations],
        "files": candidate.age.files,
        "newest_file_at": None if candidate.age.newest is None else candidate.age.newest.isoformat(),
    }


#: How long a fan-out's answer is kept: a connection changed by hand shows within a minute.
TTL_S = 60.0


def delivery_of(sink: SinkConfig) -> EpochDelivery:
    """The sink's answer, its catalog opened only for a fan-out (pyiceberg is imported only then)."""
    if isinstance(sink, FileSinkConfig):
        return FILE_SINK
    if len(sink.tables) == 1:
        return SINGLE_TABLE
    from airflow_provider_exactly_once.sinks.iceberg.table_transactions import TableTransactions

    try:
        with reaching(sink):
            catalog = iceberg_catalog(sink)
    except ExactlyOnceError as exc:
        return unknown(len(sink.tables), exc)
    return TableTransactions(catalog).delivery(len(sink.tables))


class Deliveries:
    """Each sink's answer, kept ``ttl_s`` seconds; threads may ask at once (the UI's handlers run in
    a pool), and none waits for another's catalog."""

    def __init__(
        self,
        ttl_s: float = TTL_S,
        *,
        find: Callable[[SinkConfig], EpochDelivery] = delivery_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._find = find
        self._clock = clock
        #: Per sink id: its registration as asked about, when, and the answer.
        self._kept: dict[str, tuple[str, float, EpochDelivery]] = {}
        self._lock = threading.Lock()

    def of(self, sink: SinkConfig) -> EpochDelivery:
        registration = json.dumps(sink.model_dump(mode="json"), sort_keys=True, default=str)
        now = self._clock()
        with self._lock:
            kept = self._kept.get(sink.sink_id)
        if kept is not None and kept[0] == registration and now - kept[1] < self._ttl_s:
            return kept[2]
        found = self._find(sink)
        with self._lock:
            self._kept[sink.sink_id] = (registration, now, found)
        return found
