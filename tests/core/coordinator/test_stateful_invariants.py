"""Hypothesis interleaves persist, commit, abort, recover, checkpoint outcomes and crashes, reprocessing
(a newer generation's write revising a committed epoch) and late persists of the writes revisions
replaced, and checks invariants 1 to 7 of design.md against what the real table and the real store show.

Rows carry their write id, so every visible row can be traced to the write that produced it.
SQLite backs the store and the catalog here for speed; the PostgreSQL paths are covered by the
other suites with the same code.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import hypothesis.strategies as st
from hypothesis.stateful import Bundle, invariant, precondition, rule

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, generation_of
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    RevisionInProgress,
)
from airflow_provider_exactly_once.core.outcomes import PersistOutcome
from airflow_provider_exactly_once.core.ports import EMPTY
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.support.pipeline import as_tuples, expected_rows, write_location_exists
from tests.support.stateful import PipelineMachine, machine_settings

SINK = "stateful"
EPOCHS = st.integers(min_value=0, max_value=2)
COMMIT_CRASHES = st.none() | st.sampled_from(
    [
        "commit.decided",
        "iceberg.before_catalog_update",
        "iceberg.after_catalog_update",
        "commit.visible",
        "commit.marked",
    ]
)
ABORT_CRASHES = st.none() | st.sampled_from(["abort.marked", "cleanup.deleted", "abort.cleaned"])
PERSIST_CRASHES = st.none() | st.sampled_from(["persist.inserted", "persist.replaced", "cleanup.deleted"])
#: Recovery commits the Pending appends together (``core/coordinator.py``); a crash at each of its steps.
RECOVER_CRASHES = st.none() | st.sampled_from(
    [
        "batch.decided",
        "iceberg.before_catalog_update",
        "iceberg.after_catalog_update",
        "batch.visible",
        "batch.marked",
        "abort.marked",
    ]
)
EXPECTED_REFUSALS = (
    CheckpointNotReady,
    CheckpointFailed,
    EpochNotFound,
    EpochAborted,
    AbortRefused,
    RevisionInProgress,  # a newer generation meets a decided commit: its persist is retried
)


class EpochLifecycle(PipelineMachine):
    writes = Bundle("writes")
    sink = SINK

    def __init__(self) -> None:
        super().__init__()
        self.all_writes: dict[str, PreCommit] = {}
        self.handed: set[str] = set()  # writes given to the coordinator (persisted or aborted)
        self.checkpoints: dict[int, CheckpointStatus] = {}
        #: Writes that were visible in a table since dropped: their files stay with its history.
        self.in_dropped_tables: set[str] = set()
        self.spec_changed = False
        self.recreated = False
        self.reprocessed = 0  # newer generations written so far
        self.retried: list[PreCommit] = []  # persists refused while a commit was under way
        # Writes without a generation never replace anything; each reprocess is a newer generation.
        self.coordinator = self.pipeline.coordinator(
            SINK, self.pipeline.iceberg_committer(), on_reprocess={SINK: "replace"}
        )

    def _attempt(self, crash: str | None, action: Callable[[], object]) -> None:
        self.attempt(crash, action, EXPECTED_REFUSALS)

    # -- rules ----------------------------------------------------------------------------------------

    @rule(target=writes, epoch=EPOCHS, rows=st.sampled_from([0, 2, 3]))
    def write(self, epoch: int, rows: int) -> PreCommit:
        pre = self.pipeline.write_iceberg(SINK, epoch, ["t"], rows=rows, write_id=str(uuid.uuid4()))
        self.all_writes[pre.write_id] = pre
        return pre

    @rule(pre=writes, crash=PERSIST_CRASHES)
    def persist(self, pre: PreCommit, crash: str | None) -> None:
        self.handed.add(pre.write_id)

        def persist() -> None:
            try:
                self.coordinator.persist(pre)
            except RevisionInProgress:
                self.retried.append(pre)  # its persist task retries once the commit under way finished
                raise

        self._attempt(crash, persist)

    @precondition(lambda self: not self.recreated)
    @rule(target=writes, data=st.data(), rows=st.sampled_from([0, 2]), crash=PERSIST_CRASHES)
    def reprocess(self, data: st.DataObject, rows: int, crash: str | None) -> PreCommit:
        """A cleared run writes an epoch again (a committed one, when there is one) and commits it: a
        committed epoch gets a revision replacing its write."""
        rows_now = [self.pipeline.store.get(SINK, epoch) for epoch in range(3)]
        committed = [r.epoch for r in rows_now if r is not None and r.status is EpochStatus.COMMITTED]
        epoch = data.draw(st.sampled_from(committed or [0, 1, 2]), label="epoch")
        self.reprocessed += 1
        started = datetime(2024, 6, 1, tzinfo=UTC) + timedelta(hours=self.reprocessed)
        pre = self.write(epoch, rows).model_copy(update={"generation": generation_of(started, self.reprocessed)})
        self.all_writes[pre.write_id] = pre
        self.persist(pre, crash)
        self._attempt(None, lambda: self.coordinator.commit(SINK, epoch))  # the run's commit task
        return pre

    @rule()
    def late_persist_of_a_replaced_write(self) -> None:
        """A zombie try of a run a revision superseded persists its own write again: nothing changes."""
        for epoch in range(3):
            row = self.pipeline.store.get(SINK, epoch)
            replaced = self.replaced(epoch) | ({row.replaces.write_id} if row and row.replaces else set())
            queued = sorted(t.id for t in self.pipeline.store.cleanups(SINK))
            for write_id in sorted(replaced):
                result = self.coordinator.persist(self.all_writes[write_id])
                assert result.outcome is PersistOutcome.SUPERSEDED, (write_id, result.outcome)
                assert sorted(t.id for t in self.pipeline.store.cleanups(SINK)) == queued, "replaced write queued again"
                assert self.pipeline.store.get(SINK, epoch) == row, "a late persist of a replaced write changed the row"

    def replaced(self, epoch: int) -> set[str]:
        """The writes of the epoch a revision's commit replaced, as the store records them."""
        writes = [w for w in self.all_writes.values() if w.epoch == epoch]
        return {w.write_id for w in writes if self.pipeline.store.revisions.was_replaced(SINK, epoch, w.write_id)}

    @rule(epoch=EPOCHS, status=st.sampled_from([CheckpointStatus.COMPLETED, CheckpointStatus.FAILED]))
    def checkpoint(self, epoch: int, status: CheckpointStatus) -> None:
        if epoch not in self.checkpoints:  # final once set, as checkpoint sources promise
            self.checkpoints[epoch] = status
            self.pipeline.checkpoint(SINK, epoch, status)

    @rule(epoch=EPOCHS, crash=COMMIT_CRASHES)
    def commit(self, epoch: int, crash: str | None) -> None:
        self._attempt(crash, lambda: self.coordinator.commit(SINK, epoch))

    @rule(epoch=EPOCHS, crash=ABORT_CRASHES)
    def abort_epoch(self, epoch: int, crash: str | None) -> None:
        self._attempt(crash, lambda: self.coordinator.abort(SINK, epoch, reason="test"))

    @rule(pre=writes, crash=ABORT_CRASHES)
    def abort_write(self, pre: PreCommit, crash: str | None) -> None:
        self.handed.add(pre.write_id)
        self._attempt(crash, lambda: self.coordinator.abort(SINK, pre.epoch, reason="test", write=pre))

    # A write names its spec by id, and a re-created table numbers its specs afresh: a write of the
    # old table's second spec cannot be committed to the new one (refused before the decision, and
    # docs/operations.md says what to do). One example explores one of the two table changes.

    @precondition(lambda self: not self.recreated)
    @rule()
    def change_partition_spec(self) -> None:
        """Partition by ``epoch`` from now on: Pending writes keep the spec they were written for."""
        table = self.pipeline.catalog.load_table(self.table)
        if not table.spec().fields:
            self.spec_changed = True
            with table.update_spec() as update:
                update.add_identity("epoch")

    # A revision whose replaced files left with a dropped table is refused until an operator gives
    # it up (docs/operations.md), so one example either reprocesses or re-creates the table.
    @precondition(lambda self: not self.spec_changed and not self.reprocessed)
    @rule()
    def recreate_table(self) -> None:
        """Drop the table and create it again under the same name: its epochs are not in the new one."""
        self.recreated = True
        self.in_dropped_tables.update(w for ids in self.pipeline.marker_snapshots("t", SINK).values() for w in ids)
        self.pipeline.catalog.drop_table(self.table)
        self.pipeline.create_table("t")

    @rule(crash=RECOVER_CRASHES)
    def recover(self, crash: str | None = None) -> None:
        if crash is not None:
            self._attempt(crash, lambda: self.coordinator.recover(SINK))
            return
        report = self.coordinator.recover(SINK)
        assert report.ok, report.failed

    # -- invariants -------------------------------------------------------------------------------------

    @invariant()
    def visible_data_is_exactly_once_and_checkpointed(self) -> None:
        markers = self.pipeline.marker_snapshots("t", SINK)
        for epoch, write_ids in markers.items():
            # one marked snapshot per write, and only a write a revision replaced (or is replacing:
            # its commit may have crashed before the row was marked) is shown before another one
            row = self.pipeline.store.get(SINK, epoch)
            superseded = self.replaced(epoch) | ({row.replaces.write_id} if row and row.replaces else set())
            assert len(write_ids) == len(set(write_ids)), f"invariant 1: epoch {epoch} shows {write_ids}"
            assert set(write_ids[:-1]) <= superseded, f"invariant 1: epoch {epoch} shows {write_ids}"
            assert self.checkpoints.get(epoch) is CheckpointStatus.COMPLETED, f"invariant 2: epoch {epoch}"
        rows_by_write: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        for row in as_tuples(self.pipeline.rows("t")):  # reading every file proves none was deleted (inv. 4)
            rows_by_write[row[2]].append(row)
        for write_id, rows in rows_by_write.items():
            pre = self.all_writes[write_id]
            assert markers.get(pre.epoch, [])[-1:] == [write_id], f"rows of write {write_id} visible without its marker"
            assert rows == expected_rows([pre], self.table), f"write {write_id} is visible partially or twice"
        table_uuid = str(self.pipeline.catalog.load_table(self.table).metadata.table_uuid)
        for epoch in range(3):
            row = self.pipeline.store.get(SINK, epoch)
            if row is None or row.status is not EpochStatus.COMMITTED or (row.committed or {}).get(self.table) == EMPTY:
                continue  # committed nothing to the table: no marker of its own
            if row.table_uuids is not None and row.table_uuids.get(self.table) != table_uuid:
                continue  # committed into a table since dropped; the next write of the epoch re-opens it
            assert markers.get(epoch, [])[-1:] == [row.write_id], (
                f"Committed row of epoch {epoch} disagrees with the table"
            )

    def teardown(self) -> None:
        try:
            for epoch in range(3):
                self.checkpoint(epoch, CheckpointStatus.COMPLETED)
            self.recover()
            for pre in self.retried:
                self._attempt(None, lambda p=pre: self.coordinator.persist(p))  # type: ignore[misc]
            self.recover()
            self.late_persist_of_a_replaced_write()
            self.recover()  # nothing a late persist did may fail a recovery
            self.visible_data_is_exactly_once_and_checkpointed()
            live, replaced = set(), set()
            for epoch in range(3):
                replaced |= self.replaced(epoch)  # its files wait for the table's snapshot expiry
                row = self.pipeline.store.get(SINK, epoch)
                if row is None:
                    continue
                if self.checkpoints[epoch] is CheckpointStatus.COMPLETED and row.status is not EpochStatus.ABORTED:
                    assert row.status is EpochStatus.COMMITTED, f"invariant 3: epoch {epoch} left {row.status}"
                if row.status is EpochStatus.COMMITTED:
                    live.add(row.write_id)
            for write_id in self.handed - live - replaced - self.in_dropped_tables:
                assert not write_location_exists(self.all_writes[write_id]), (
                    f"write {write_id}'s files were left behind"
                )
            waiting = self.pipeline.store.cleanups(SINK)
            # a write that added no file is in no snapshot, so its clean-up waits for no expiry
            expiring = {w for w in replaced if any(t.data_files for t in self.all_writes[w].tables)}
            assert {t.write_id for t in waiting if t.removed_by is not None} == expiring
            assert [t for t in waiting if t.removed_by is None] == [], "a clean-up that can never succeed"
        finally:
            self.dispose()


EpochLifecycle.TestCase.settings = machine_settings(max_examples=30, steps=18)
test_epoch_lifecycle = EpochLifecycle.TestCase
