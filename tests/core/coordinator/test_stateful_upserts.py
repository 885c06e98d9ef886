"""Hypothesis interleaves upsert epochs' writes, persists, commits, aborts, crashes, recoveries,
another writer's compaction and the rewrites that answer it, and checks the table against a model: the committed epochs' changes
applied one after the other, in the order their snapshots were committed.

What that catches: a change applied twice or lost, a deleted key back, a key visible twice (a write
committed over rows it never saw), an epoch visible before its checkpoint completed, and epochs
committed out of epoch order while an earlier one was undecided. The writes come from the test's
own copy-on-write writer (``tests/support/upsert_writer.py``), which follows the Spark job's rule.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import hypothesis.strategies as st
from hypothesis.stateful import Bundle, invariant, rule

from airflow_provider_exactly_once.core.epochs import AbortCause, CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EarlierEpochUndecided,
    EpochAborted,
    EpochNotFound,
    RewriteRefused,
    UpsertConflict,
)
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_stateful_invariants import ABORT_CRASHES, COMMIT_CRASHES, PERSIST_CRASHES
from tests.support.pipeline import Pipeline
from tests.support.stateful import PipelineMachine, machine_settings
from tests.support.upsert_writer import ARROW, Changes, keyed_pipeline, write_upsert

SINK = "stateful-upserts"
EPOCHS = st.integers(min_value=0, max_value=2)
CHANGES = st.dictionaries(
    st.integers(min_value=0, max_value=3), st.none() | st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4
)
EXPECTED = (
    CheckpointNotReady,
    CheckpointFailed,
    EpochNotFound,
    EpochAborted,
    AbortRefused,
    EarlierEpochUndecided,
    UpsertConflict,
    RewriteRefused,
)


class UpsertLifecycle(PipelineMachine):
    writes = Bundle("writes")
    sink = SINK

    def __init__(self) -> None:
        super().__init__()
        self.changes: dict[str, Changes] = {}
        self.checkpoints: dict[int, CheckpointStatus] = {}

    def make_pipeline(self) -> Pipeline:
        return keyed_pipeline(self.tmp, self.faults)

    def _attempt(self, crash: str | None, action: Callable[[], object]) -> None:
        self.attempt(crash, action, EXPECTED)

    # -- rules ----------------------------------------------------------------------------------------

    @rule(target=writes, epoch=EPOCHS, changes=CHANGES)
    def write(self, epoch: int, changes: Changes) -> PreCommit:
        pre = write_upsert(self.pipeline.catalog, "ns.t", SINK, epoch, changes, str(uuid.uuid4()))
        self.changes[pre.write_id] = changes
        return pre

    @rule(pre=writes, crash=PERSIST_CRASHES)
    def persist(self, pre: PreCommit, crash: str | None) -> None:
        self._attempt(crash, lambda: self.coordinator.persist(pre))

    @rule(epoch=EPOCHS, status=st.sampled_from([CheckpointStatus.COMPLETED, CheckpointStatus.FAILED]))
    def checkpoint(self, epoch: int, status: CheckpointStatus) -> None:
        if epoch not in self.checkpoints:
            self.checkpoints[epoch] = status
            self.pipeline.checkpoint(SINK, epoch, status)

    @rule(epoch=EPOCHS, crash=COMMIT_CRASHES)
    def commit(self, epoch: int, crash: str | None) -> None:
        undecided = [
            e
            for e in range(epoch)
            if (row := self.pipeline.store.get(SINK, e)) is not None and row.status is EpochStatus.PENDING
        ]
        before = self._marked()
        self._attempt(crash, lambda: self.coordinator.commit(SINK, epoch))
        if epoch in self._marked() - before:
            assert not undecided, f"epoch {epoch} committed while earlier epoch(s) {undecided} were undecided"

    def _marked(self) -> set[int]:
        return set(self.pipeline.marker_snapshots("t", SINK))

    @rule(epoch=EPOCHS, crash=ABORT_CRASHES)
    def abort_epoch(self, epoch: int, crash: str | None) -> None:
        self._attempt(crash, lambda: self.coordinator.abort(SINK, epoch, reason="test"))

    @rule()
    def compaction(self) -> None:
        """Another writer rewrites every data file with the same rows (a compaction)."""
        table = self.pipeline.catalog.load_table("ns.t")
        if table.current_snapshot() is not None:
            table.overwrite(table.scan().to_arrow().cast(ARROW))

    @rule(epoch=EPOCHS, crash=PERSIST_CRASHES)
    def rewrite(self, epoch: int, crash: str | None) -> None:
        """A rewrite task: when the epoch's write conflicts, the same changes written again and persisted."""

        def rewrite() -> None:
            self.coordinator.prepare_rewrite(SINK, epoch)
            row = self.pipeline.store.get(SINK, epoch)
            assert row is not None
            if row.status is EpochStatus.COMMITTED:
                return
            self.coordinator.persist(self.write(epoch, self.changes[row.write_id]))

        self._attempt(crash, rewrite)

    @rule()
    def recover(self) -> None:
        self.coordinator.recover(SINK)  # an epoch refused for a conflict or the order stays in the report

    # -- invariants -------------------------------------------------------------------------------------

    @invariant()
    def the_table_is_the_committed_changes_applied_in_commit_order(self) -> None:
        table = self.pipeline.catalog.load_table("ns.t")
        model: dict[int, str] = {}
        seen: set[int] = set()
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if summary.get("exactly-once.sink-id") != SINK:
                continue
            epoch = int(summary["exactly-once.epoch"])
            assert epoch not in seen, f"epoch {epoch} applied twice"
            seen.add(epoch)
            assert self.checkpoints.get(epoch) is CheckpointStatus.COMPLETED, f"epoch {epoch} visible before COMPLETED"
            for key, value in self.changes[summary["exactly-once.write-id"]].items():
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
        rows = table.scan().to_arrow().to_pylist() if table.current_snapshot() is not None else []
        shown = {r["id"]: r["value"] for r in rows}
        assert len(shown) == len(rows), f"a key is visible twice: {sorted(r['id'] for r in rows)}"
        assert shown == model

    def teardown(self) -> None:
        try:
            for epoch in range(3):
                self.checkpoint(epoch, CheckpointStatus.COMPLETED)
            for _ in range(3):  # in epoch order, each pass can unblock the next epoch
                self.coordinator.recover(SINK)
                for epoch in range(3):  # what the group's rewrite tasks do after a conflict
                    self.rewrite(epoch, None)
                    self._attempt(None, lambda e=epoch: self.coordinator.commit(SINK, e))  # type: ignore[misc]
            self.the_table_is_the_committed_changes_applied_in_commit_order()
            for epoch in range(3):
                # A conflict is written again and committed, so no completed epoch is left Pending,
                # nor one given up for a rewrite: nothing waits for a person. An epoch whose checkpoint
                # failed after its write was given up is final as it is: no rewrite follows a failure.
                row = self.pipeline.store.get(SINK, epoch)
                assert row is None or row.status is not EpochStatus.PENDING, (epoch, row.error)
                given_up = row is not None and row.abort_cause is AbortCause.UPSERT_CONFLICT
                assert not given_up or self.checkpoints.get(epoch) is CheckpointStatus.FAILED, (epoch, row.error)
        finally:
            self.dispose()


UpsertLifecycle.TestCase.settings = machine_settings(
    max_examples=int(os.environ.get("EO_STATEFUL_EXAMPLES", "60")), steps=24
)
test_upsert_lifecycle = UpsertLifecycle.TestCase
