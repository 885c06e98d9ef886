"""Reprocessing an upsert epoch (design.md D14): a newer generation's changes, planned against the
table as it was before the epoch's committed write, replace that write's changes with everything
committed since kept; refused when a later commit changed what the revision would have to undo.

Epoch 0 inserts keys 0..5; epoch 1 (E) updates 1, deletes 2 and inserts 20; epoch 2 (F) inserts 30.
The revision E' of epoch 1 changes only 3 and 21, so E's update, delete and insert are undone. The
table is judged by DuckDB's iceberg extension after every step, and crashed at every step of the
revision, then recovered: the table equals the model, one marked snapshot per commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.decisions import revision_basis
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import ReprocessRefused, UpsertConflict
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_reprocessing import STEPS  # every step of a revision's persist and commit
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import Pipeline
from tests.support.upsert_writer import Changes, keyed_pipeline, write_upsert

SINK = "upsert-revisions"
TABLE = "ns.t"
G0 = "2024-06-01T01:00:00.000000Z/0000000000"
G1 = "2024-06-02T09:30:00.000000Z/0000000001"
G2 = "2024-06-03T10:00:00.000000Z/0000000002"
G3 = "2024-06-04T11:00:00.000000Z/0000000003"
P = {k: "v0" for k in range(6)}
#: The table after epochs 0, 1 (E) and 2 (F).
BEFORE = {0: "v0", 1: "e", 3: "v0", 4: "v0", 5: "v0", 20: "e", 30: "f"}
#: After the revision E' = {3: "r", 21: "r"} of epoch 1: P with E' applied, then F.
AFTER = {0: "v0", 1: "v0", 2: "v0", 3: "r", 4: "v0", 5: "v0", 21: "r", 30: "f"}


class Epochs:
    """One upsert sink with ``on_reprocess="replace"`` over the keyed table of ``upsert_writer``."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.coordinator = self.replacing()

    def replacing(self) -> TwoPhaseCommitCoordinator:
        return self.pipeline.coordinator(SINK, self.pipeline.iceberg_committer(), on_reprocess={SINK: "replace"})

    def write(self, epoch: int, changes: Changes, generation: str, *, revise: bool = False) -> PreCommit:
        """A write of the epoch; ``revise``: planned as its write task plans a revision."""
        basis = None
        if revise:
            found = revision_basis(self.pipeline.store.get(SINK, epoch), generation, "replace")
            assert found is not None
            basis = found[TABLE]
        pre = write_upsert(self.pipeline.catalog, TABLE, SINK, epoch, changes, str(uuid.uuid4()), revision=basis)
        return pre.model_copy(update={"generation": generation})

    def commit(self, pre: PreCommit) -> None:
        self.coordinator.persist(pre)
        self.pipeline.checkpoint(SINK, pre.epoch, CheckpointStatus.COMPLETED)
        assert self.coordinator.commit(SINK, pre.epoch).outcome is CommitOutcome.COMMITTED

    def three_epochs(self, later: Changes) -> tuple[PreCommit, PreCommit]:
        """Epoch 0 (keys 0..5), E (epoch 1) and the later epoch 2 with ``later``'s changes."""
        self.commit(self.write(0, P, G0))
        first = self.write(1, {1: "e", 2: None, 20: "e"}, G0)
        assert first.tables[0].rewritten, "E rewrites epoch 0's file"
        self.commit(first)
        after = self.write(2, later, G0)
        self.commit(after)
        return first, after

    def shown(self) -> dict[int, str]:
        """The table as DuckDB reads it; a key shown twice fails here."""
        rows = read_rows(self.pipeline.catalog.load_table(TABLE), "id, value")
        shown = {key: value for key, value in rows}
        assert len(shown) == len(rows), f"a key is visible twice: {rows}"
        return shown

    def markers(self) -> dict[int, list[str]]:
        return self.pipeline.marker_snapshots("t", SINK)


@pytest.fixture
def epochs(tmp_path: Path, faults: FaultSwitch) -> Iterator[Epochs]:
    pipeline = keyed_pipeline(tmp_path, faults)
    yield Epochs(pipeline)
    pipeline.dispose()


def test_a_revision_replaces_the_epochs_changes_and_keeps_the_later_epochs(epochs: Epochs) -> None:
    first, later = epochs.three_epochs({30: "f"})
    assert epochs.shown() == BEFORE
    revision = epochs.write(1, {3: "r", 21: "r"}, G1, revise=True)
    (write,) = revision.tables
    assert write.revises is not None and write.revises.write_id == first.write_id
    assert write.changes is not None and (write.changes.inserted, write.changes.updated) == (1, 1)  # against P

    persisted = epochs.coordinator.persist(revision)
    assert persisted.outcome is PersistOutcome.REVISED
    assert epochs.shown() == BEFORE  # nothing visible before the commit
    committed = epochs.coordinator.commit(SINK, 1)

    assert committed.outcome is CommitOutcome.COMMITTED and committed.record.revision == 1
    assert epochs.shown() == AFTER  # E's update of 1, delete of 2 and insert of 20 undone; F kept
    assert epochs.markers() == {
        0: [epochs.markers()[0][0]],
        1: [first.write_id, revision.write_id],
        2: [later.write_id],
    }
    table = epochs.pipeline.catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    assert snapshot.summary.additional_properties["exactly-once.revision"] == "1"
    history = epochs.pipeline.store.revisions.revisions(SINK, 1)
    assert [(r.write_id, r.status) for r in history] == [(first.write_id, "Replaced"), (revision.write_id, "Committed")]


def test_a_revision_of_a_revision_and_one_without_changes_are_planned_at_the_same_table(epochs: Epochs) -> None:
    epochs.three_epochs({30: "f"})
    epochs.commit(epochs.write(1, {3: "r", 21: "r"}, G1, revise=True))
    second = epochs.write(1, {1: "s"}, G2, revise=True)
    assert second.tables[0].read_snapshot_id == epochs.pipeline.store.get(SINK, 1).pre_commit.tables[0].read_snapshot_id  # type: ignore[union-attr]
    epochs.commit(second)
    assert epochs.shown() == {**P, 1: "s", 30: "f"}
    epochs.commit(epochs.write(1, {}, G3, revise=True))  # the epoch had no changes after all
    assert epochs.shown() == {**P, 30: "f"}
    assert len(epochs.markers()[1]) == 4 and all(len(epochs.markers()[e]) == 1 for e in (0, 2))


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_of_a_revision_then_recovery_replaces_the_changes_once(
    epochs: Epochs, faults: FaultSwitch, step: str
) -> None:
    first, later = epochs.three_epochs({30: "f"})
    revision = epochs.write(1, {3: "r", 21: "r"}, G1, revise=True)
    faults.crash_at(step)
    with pytest.raises(SimulatedCrash, match=step):
        epochs.coordinator.persist(revision)
        epochs.coordinator.commit(SINK, 1)
    faults.disarm()
    assert epochs.shown() in (BEFORE, AFTER)  # never a mix of the two

    report = epochs.replacing().recover(SINK)

    assert report.ok, report.failed
    row = epochs.pipeline.store.get(SINK, 1)
    assert row is not None and (row.status, row.write_id, row.revision) == (EpochStatus.COMMITTED, revision.write_id, 1)
    assert epochs.shown() == AFTER
    markers = epochs.markers()
    assert markers[1] == [first.write_id, revision.write_id] and markers[2] == [later.write_id]
    assert len(markers[0]) == 1


@pytest.mark.parametrize(
    ("later", "refusal"),
    [
        # F updated key 4, which E's output file holds (carried from epoch 0): F rewrote that file.
        ({4: "f"}, r"1 file\(s\) it must remove are no longer in the table.*epoch 2 of sink 'upsert-revisions'"),
        # F inserted key 2, which E deleted: undoing the delete would show key 2 twice.
        ({2: "f"}, r"1 data file\(s\) committed since may hold keys.*added by epoch 2 of sink 'upsert-revisions'"),
    ],
    ids=["later-epoch-rewrote-its-output", "later-epoch-inserted-a-key-it-deleted"],
)
def test_a_revision_that_later_epochs_made_ill_defined_is_refused_before_anything_is_committed(
    epochs: Epochs, later: Changes, refusal: str
) -> None:
    first, _ = epochs.three_epochs(later)
    before = epochs.shown()
    head = epochs.pipeline.catalog.load_table(TABLE).metadata.current_snapshot_id
    revision = epochs.write(1, {3: "r"}, G1, revise=True)

    with pytest.raises(UpsertConflict, match=refusal) as refused:
        epochs.coordinator.persist(revision)

    message = str(refused.value)
    assert f"sink '{SINK}' epoch 1 write {revision.write_id}: revision of write {first.write_id}" in message
    assert "Reprocessing an upsert epoch" in message
    row = epochs.pipeline.store.get(SINK, 1)
    assert row is not None and (row.status, row.write_id) == (EpochStatus.COMMITTED, first.write_id)
    assert epochs.pipeline.catalog.load_table(TABLE).metadata.current_snapshot_id == head
    assert epochs.shown() == before


def test_a_revision_refused_at_commit_is_given_up_and_the_epoch_keeps_its_write(epochs: Epochs) -> None:
    first, _ = epochs.three_epochs({30: "f"})
    epochs.coordinator.persist(epochs.write(1, {3: "r"}, G1, revise=True))
    table = epochs.pipeline.catalog.load_table(TABLE)
    table.overwrite(table.scan().to_arrow())  # another engine compacts the table meanwhile
    with pytest.raises(UpsertConflict, match=r"no longer in the table.*not a sink's commit"):
        epochs.coordinator.commit(SINK, 1)

    aborted = epochs.coordinator.abort(SINK, 1, reason="revision refused")

    assert aborted.outcome is AbortOutcome.REVISION_ABORTED
    row = epochs.pipeline.store.get(SINK, 1)
    assert row is not None and (row.status, row.write_id) == (EpochStatus.COMMITTED, first.write_id)
    assert epochs.shown() == BEFORE


def test_a_revision_its_run_gives_up_is_aborted_and_the_epoch_keeps_its_write(epochs: Epochs) -> None:
    first, _ = epochs.three_epochs({30: "f"})
    revision = epochs.write(1, {3: "r"}, G1, revise=True)
    epochs.coordinator.persist(revision)

    # the run's wait for the checkpoint gave up (its abort task); the checkpoint of E stays COMPLETED
    aborted = epochs.coordinator.abort(SINK, 1, reason="wait_for_checkpoint timed out", write=revision)

    assert aborted.outcome is AbortOutcome.REVISION_ABORTED and aborted.files_deleted == 1
    row = epochs.pipeline.store.get(SINK, 1)
    assert row is not None and (row.status, row.write_id) == (EpochStatus.COMMITTED, first.write_id)
    assert epochs.shown() == BEFORE
    assert epochs.replacing().recover(SINK).ok and epochs.shown() == BEFORE


@pytest.mark.parametrize("when", ["persist", "commit"])
def test_a_later_delete_of_an_absent_key_refuses_the_revision(epochs: Epochs, faults: FaultSwitch, when: str) -> None:
    """F deletes key 21, which the table never held: nothing in the table shows it, yet E' inserting
    21 would have to stay deleted after F. The meta store's counts tell, so the revision is refused."""
    _, later = epochs.three_epochs({30: "f"} if when == "commit" else {30: "f", 21: None})
    revision = epochs.write(1, {3: "r", 21: "r"}, G1, revise=True)
    if when == "commit":
        # A later epoch whose commit was decided before the revision's persist commits after it.
        epochs.coordinator.persist(epochs.write(3, {21: None}, G0))
        epochs.pipeline.checkpoint(SINK, 3, CheckpointStatus.COMPLETED)
        faults.crash_at("commit.decided")
        with pytest.raises(SimulatedCrash):
            epochs.coordinator.commit(SINK, 3)
        faults.disarm()
        assert epochs.coordinator.persist(revision).outcome is PersistOutcome.REVISED
        assert epochs.coordinator.commit(SINK, 3).outcome is CommitOutcome.COMMITTED
        before = epochs.shown()
        with pytest.raises(ReprocessRefused, match=r"later epoch\(s\) 3 deleted keys the table did not hold"):
            epochs.coordinator.commit(SINK, 1)
        row = epochs.pipeline.store.get(SINK, 1)
        assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
        assert epochs.coordinator.abort(SINK, 1, reason="revision refused").outcome is AbortOutcome.REVISION_ABORTED
    else:
        assert later.tables[0].changes is not None and later.tables[0].changes.deletes_of_absent_keys == 1
        before = epochs.shown()
        with pytest.raises(ReprocessRefused, match=r"later epoch\(s\) 2 deleted keys the table did not hold"):
            epochs.coordinator.persist(revision)
        assert not Path(revision.tables[0].location.removeprefix("file://")).exists(), "the refused write is removed"
        refused = epochs.pipeline.store.get(SINK, 1)  # the row keeps the refusal, for its page and the picture
        assert refused is not None and "refused: " in (refused.warning or "") and "deleted keys" in refused.warning
    assert epochs.shown() == before
    row = epochs.pipeline.store.get(SINK, 1)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.revision == 0
