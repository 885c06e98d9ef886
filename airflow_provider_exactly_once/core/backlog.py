"""Recovery's commit of a backlog: neighbouring Pending appends of a sink in one sink commit.

A sink whose commits stopped for a while (a catalog outage, a paused recovery) comes back with
hundreds of Pending epochs. Committed one by one, each pays what one Iceberg commit costs on a
table's whole history (load it, list its manifests, write metadata naming every snapshot), so the
backlog costs O(N²). Here up to ``BATCH_EPOCHS`` epochs that ``decisions.commits_in_batch`` lets
through share one sink commit (``BatchCommitter``), in which each still gets its own snapshot with
its own marker (invariant 1), in epoch order. Every step keeps its per-epoch guard:

1. the sink checks every write (``prepare_batch``); a write it refuses, or one that is more than an
   append, ends the batch before it and is committed on its own, as are its refusals;
2. each commit is decided by its own compare-and-swap, in one store transaction (``decide_commits``),
   before anything is visible; a row that moved ends the batch before it;
3. one sink commit per table, which first looks for the markers of every epoch (a crash after an
   earlier commit landed is settled there, as step 2 of the commit algorithm settles it for one);
4. each epoch is marked Committed with its snapshot by its own compare-and-swap, in one store
   transaction (``mark_committed_batch``).

A crash anywhere leaves Pending rows, decided or not, that the next pass takes through the same
steps. Whatever else goes wrong with a batch, its epochs are committed one at a time after all, by
the coordinator's own ``commit``, which reports each epoch's own error: the batch is only ever a
faster way to the outcome the single commits would have reached.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from .errors import MetaStoreUnavailable
from .faults import FaultHook
from .observe import Metrics, count_commit
from .outcomes import CommitOutcome, CommitResult, RecoveryReport
from .ports import BatchCommitter, CommitMark, EpochRecord, SinkCommitter, SinkStateStore
from .status import EpochStatus

__all__ = ["BATCH_EPOCHS", "EpochBatches"]

log = logging.getLogger(__name__)

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
