"""One recovery pass over a sink's Pending epochs, in epoch order: the loop the recovery DAG, the
scheduler-start run and ``eo-sink recover`` share. It decides nothing itself: each epoch's fate is
``decisions.recovery_decision``, carried out through the coordinator's own ``commit`` and ``abort``,
so a recovered epoch goes through exactly the steps (and checks) its own tasks would have taken.
Neighbouring appends that ``decisions.commits_in_batch`` lets through are committed together
(``core/backlog.py``), through the same steps per epoch. Costs O(pending), not O(history): only the
``(sink_id, status)`` index is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .backlog import EpochBatches
from .bookkeeping import note_error
from .decisions import Action, Decision, commits_in_batch, recovery_decision
from .errors import ExactlyOnceError, MetaStoreUnavailable
from .lookups import EpochLookups
from .outcomes import AbortResult, CommitResult, RecoveryReport
from .ports import CheckpointSource, EpochRecord, SinkStateStore
from .status import EpochStatus

__all__ = ["EpochBatches", "EpochSteps", "recover_pending"]

log = logging.getLogger(__name__)


class EpochSteps(Protocol):
    """The steps recovery carries its decisions out through: the coordinator's own, so that a
    recovered epoch passes the same checks as one its tasks finished."""

    def commit(self, sink_id: str, epoch: int) -> CommitResult: ...

    def abort(self, sink_id: str, epoch: int, *, reason: str) -> AbortResult: ...


def recover_pending(
    coordinator: EpochSteps,
    store: SinkStateStore,
    checkpoints: CheckpointSource,
    sink_id: str,
    batches: EpochBatches | None = None,
) -> RecoveryReport:
    """Commit the Pending epochs whose commit was decided or whose checkpoint completed, abort those
    whose checkpoint failed, leave the rest waiting. One epoch's failure is reported (and kept on its
    row) and does not stop the others; an unreachable meta store stops the pass, to be retried whole.
    With ``batches``, runs of appends are committed together; an epoch committed on its own (an
    upsert, a revision) first lets the run before it commit, so the table's history keeps epoch order.
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
            coordinator.commit(sink_id, row.epoch)
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
        lookups = EpochLookups.of(store, checkpoints, sink_id, row.epoch)
        # A refusal (an upsert epoch behind an undecided one) is the epoch's failure, as the commit's would be.
        attempt(row, lambda: decided.append(recovery_decision(row, lookups).raise_if_refused()))  # noqa: B023
        if not decided:
            continue
        action = decided[0].action
        if action is Action.WAIT:
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
