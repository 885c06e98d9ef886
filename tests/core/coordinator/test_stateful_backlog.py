"""Hypothesis builds a backlog of Pending epochs and recovers it with a crash at any step of a batch
(``core/coordinator.py``), again and again: every epoch whose checkpoint completed ends committed exactly
once, each in its own marked snapshot, in epoch order on the table's history, and nothing else is
ever visible (invariants 1 to 3).

Checkpoints are final when an epoch is persisted, so every pass commits everything it can and epoch
order is a property of the table; ``test_stateful_invariants.py`` interleaves everything else.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis.stateful import invariant, rule

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_batch_recovery import history
from tests.support.pipeline import as_tuples, expected_rows
from tests.support.stateful import PipelineMachine, machine_settings

SINK = "backlog"
CRASHES = st.none() | st.sampled_from(
    [
        "iceberg.loaded",
        "batch.decided",
        "iceberg.before_catalog_update",
        "iceberg.after_catalog_update",
        "batch.visible",
        "batch.marked",
        "abort.marked",
    ]
)


class BacklogRecovery(PipelineMachine):
    sink = SINK

    def __init__(self) -> None:
        super().__init__()
        self.writes: dict[int, PreCommit] = {}
        self.checkpoints: dict[int, CheckpointStatus] = {}

    @rule(
        rows=st.sampled_from([0, 2, 3]),
        status=st.sampled_from([CheckpointStatus.COMPLETED, CheckpointStatus.COMPLETED, CheckpointStatus.FAILED]),
    )
    def persist_epoch(self, rows: int, status: CheckpointStatus) -> None:
        epoch = len(self.writes)
        pre = self.pipeline.write_iceberg(SINK, epoch, ["t"], rows=rows)
        self.coordinator.persist(pre)
        self.pipeline.checkpoint(SINK, epoch, status)
        self.writes[epoch], self.checkpoints[epoch] = pre, status

    @rule(crash=CRASHES)
    def recover(self, crash: str | None) -> None:
        def recover() -> None:
            report = self.coordinator.recover(SINK)
            assert report.ok, report.failed

        self.attempt(crash, recover)

    @invariant()
    def each_epoch_once_in_order_and_only_when_completed(self) -> None:
        shown = history(self.pipeline, "t", SINK, "main")
        epochs = [epoch for epoch, _ in shown]
        assert epochs == sorted(set(epochs)), f"invariant 1 or epoch order: the branch shows epochs {epochs}"
        for epoch, write_id in shown:
            assert write_id == self.writes[epoch].write_id
            assert self.checkpoints[epoch] is CheckpointStatus.COMPLETED, f"invariant 2: epoch {epoch}"
        for epoch, pre in self.writes.items():
            row = self.pipeline.store.get(SINK, epoch)
            if row is not None and row.status is EpochStatus.COMMITTED and not pre.is_empty:
                assert (epoch, pre.write_id) in shown, f"epoch {epoch} is Committed but not in the table"

    def teardown(self) -> None:
        try:
            self.recover(None)
            self.each_epoch_once_in_order_and_only_when_completed()
            for epoch, status in self.checkpoints.items():
                row = self.pipeline.store.get(SINK, epoch)
                assert row is not None
                wanted = EpochStatus.COMMITTED if status is CheckpointStatus.COMPLETED else EpochStatus.ABORTED
                assert row.status is wanted, f"invariant 3: epoch {epoch} left {row.status}"
            committed = [pre for e, pre in self.writes.items() if self.checkpoints[e] is CheckpointStatus.COMPLETED]
            assert as_tuples(self.pipeline.rows("t")) == expected_rows(committed, "ns.t")
        finally:
            self.dispose()


BacklogRecovery.TestCase.settings = machine_settings(max_examples=25, steps=12)
test_backlog_recovery = BacklogRecovery.TestCase
