"""Working through a sink's clean-up queue: deleting the files of writes nobody may see again.

Kept beside the coordinator rather than in it because every phase ends here (a replaced write, an
abort, a late or discarded write, a replaced revision, an orphan) and the rules are the same for
all: the store is asked first, so a write that is (again) the epoch's live write is never touched,
and the committer re-checks the sink itself before deleting anything (invariant 4). A task is done
only once its files are gone; until then it stays queued and the next run tries again.
"""

from __future__ import annotations

from datetime import datetime

from .errors import MetaStoreUnavailable
from .faults import FaultHook, no_faults
from .identifiers import check_epoch
from .outcomes import CleanupReport
from .ports import CleanupTask, SinkCommitter, SinkStateStore
from .status import EpochStatus

__all__ = ["clean_up", "run_cleanups"]


def clean_up(
    store: SinkStateStore, committer: SinkCommitter, sink_id: str, epoch: int | None, *, fault: FaultHook = no_faults
) -> CleanupReport:
    """Run the queued clean-ups of a sink (or of one epoch) alone, without touching any epoch's status.

    What an operator asks for after a crash left an Aborted epoch's files, or after queuing
    orphaned write locations; the same checks as every other delete apply (invariant 4). A
    clean-up that fails is in the report's ``failed`` and stays queued.
    """
    if epoch is not None:
        check_epoch(epoch)
    report = CleanupReport(sink_id)
    report.files_deleted = run_cleanups(store, committer, sink_id, epoch, report=report, fault=fault)
    return report


def run_cleanups(
    store: SinkStateStore,
    committer: SinkCommitter,
    sink_id: str,
    epoch: int | None,
    *,
    report: CleanupReport | None = None,
    fault: FaultHook = no_faults,
) -> int:
    """Run the sink's queued clean-ups (or one epoch's); the number of files deleted.

    Without a ``report`` the first failure is raised; with one, each failure is recorded there
    against its epoch and the others still run (what recovery and ``eo-sink gc`` want).
    """
    deleted = 0
    for task in store.cleanups(sink_id, epoch):
        if not task.pre_commit.written:  # the record of an abort without a write has no files
            store.complete_cleanup(task.id)
            continue
        row = store.get(task.sink_id, task.epoch)
        if row is not None and row.write_id == task.write_id and row.status is not EpochStatus.ABORTED:
            if row.status is EpochStatus.COMMITTED:
                store.complete_cleanup(task.id)  # its files are the table's now
            continue
        since = min(row.created_at, task.created_at) if row is not None else task.created_at
        try:
            freed = _delete(committer, task, since)
        except Exception as exc:
            if report is None or isinstance(exc, MetaStoreUnavailable):
                raise
            report.failed[task.epoch] = f"clean-up of write {task.write_id}: {type(exc).__name__}: {exc}"
            continue
        if freed is None:
            continue  # not yet: older snapshots still list a replaced write's files
        deleted += freed
        fault("cleanup.deleted")
        store.complete_cleanup(task.id)
    return deleted


def _delete(committer: SinkCommitter, task: CleanupTask, since: datetime) -> int | None:
    if task.removed_by is not None:
        # A write a revision replaced: older snapshots list its files until they expire.
        return committer.delete_replaced(task.pre_commit, task.removed_by, task.created_at)
    return committer.delete_write(task.pre_commit, since)
