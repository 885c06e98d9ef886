"""One recovery pass over a sink's Pending epochs, in epoch order: the loop the recovery DAG, the
scheduler-start run and ``eo-sink recover`` share. It decides nothing itself: each epoch's fate is
``decisions.recovery_decision``, carried out through the coordinator's own ``commit`` and ``abort``,
so a recovered epoch goes through exactly the steps (and checks) its own tasks would have taken.
Costs O(pending), not O(history): only the ``(sink_id, status)`` index is read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .bookkeeping import note_error
from .decisions import Action, recovery_decision
from .errors import ExactlyOnceError, MetaStoreUnavailable
from .outcomes import RecoveryReport
from .ports import CheckpointSource, SinkStateStore
from .status import EpochStatus

if TYPE_CHECKING:
    from .coordinator import TwoPhaseCommitCoordinator

__all__ = ["recover_pending"]

log = logging.getLogger(__name__)


def recover_pending(
    coordinator: TwoPhaseCommitCoordinator, store: SinkStateStore, checkpoints: CheckpointSource, sink_id: str
) -> RecoveryReport:
    """Commit the Pending epochs whose commit was decided or whose checkpoint completed, abort those
    whose checkpoint failed, leave the rest waiting. One epoch's failure is reported (and kept on its
    row) and does not stop the others; an unreachable meta store stops the pass, to be retried whole."""
    report = RecoveryReport(sink_id)
    for row in sorted(store.epochs_with_status(sink_id, EpochStatus.PENDING), key=lambda r: r.epoch):
        try:
            decision = recovery_decision(row, lambda: checkpoints.status(sink_id, row.epoch))  # noqa: B023
            if decision.action is Action.WAIT:
                report.waiting.append(row.epoch)
                continue
            if decision.action in (Action.ABORT, Action.ABORT_REVISION):
                aborted = coordinator.abort(sink_id, row.epoch, reason="recovery: checkpoint FAILED")
                report.aborted.append(row.epoch)
                report.files_deleted += aborted.files_deleted
                continue
            coordinator.commit(sink_id, row.epoch)
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
            note_error(store, row, exc)
    return report
