"""An upsert epoch whose commit met a compaction is written again, and then applied once.

Before the commit decision the conflicting write stays Pending and the new write replaces it; after
the decision it is given up as lost (no table shows it) and the new write re-opens the epoch. A
commit that failed for any other reason keeps its write: ``prepare_rewrite`` refuses to discard it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.decisions import REWRITE_REASON
from airflow_provider_exactly_once.core.epochs import AbortCause, CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import RewriteRefused, UpsertConflict
from airflow_provider_exactly_once.core.outcomes import PersistOutcome, RewriteOutcome
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline
from tests.support.upsert_writer import Changes, keyed_pipeline, write_upsert

SINK = "upsert-rewrites"
FIRST = {k: "v0" for k in range(6)}
CHANGES: Changes = {1: "v1", 2: None, 9: "new"}
AFTER = {0: "v0", 1: "v1", 3: "v0", 4: "v0", 5: "v0", 9: "new"}


@pytest.fixture
def faults() -> FaultSwitch:
    return FaultSwitch()


@pytest.fixture
def pipeline(tmp_path: Path, faults: FaultSwitch) -> Iterator[Pipeline]:
    pipeline = keyed_pipeline(tmp_path, faults)
    yield pipeline
    pipeline.dispose()


@pytest.fixture
def coordinator(pipeline: Pipeline) -> TwoPhaseCommitCoordinator:
    coordinator = pipeline.coordinator(SINK, pipeline.iceberg_committer())
    apply(pipeline, coordinator, 0, FIRST)
    return coordinator


def apply(pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, epoch: int, changes: Changes) -> None:
    coordinator.persist(write_upsert(pipeline.catalog, "ns.t", SINK, epoch, changes, str(uuid.uuid4())))
    pipeline.checkpoint(SINK, epoch, CheckpointStatus.COMPLETED)
    coordinator.commit(SINK, epoch)


def compact(pipeline: Pipeline) -> set[str]:
    """Another writer rewrites every data file with the same rows; the files it wrote."""
    table = pipeline.catalog.load_table("ns.t")
    table.overwrite(table.scan().to_arrow())
    return live_files(pipeline)


def live_files(pipeline: Pipeline) -> set[str]:
    return {t.file.file_path for t in pipeline.catalog.load_table("ns.t").scan().plan_files()}


def shown(pipeline: Pipeline) -> dict[int, str]:
    return {r["id"]: r["value"] for r in pipeline.catalog.load_table("ns.t").scan().to_arrow().to_pylist()}


def test_a_conflict_before_the_decision_keeps_the_write_pending_until_the_new_one_replaces_it(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    stale = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    coordinator.persist(stale)
    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    compact(pipeline)
    with pytest.raises(UpsertConflict):
        coordinator.commit(SINK, 1)

    prepared = coordinator.prepare_rewrite(SINK, 1)
    assert prepared.outcome is RewriteOutcome.REWRITE and "rewrote" in prepared.why
    row = pipeline.store.get(SINK, 1)
    assert row is not None and row.status is EpochStatus.PENDING and row.write_id == stale.write_id

    fresh = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    assert coordinator.persist(fresh).outcome is PersistOutcome.REPLACED
    coordinator.commit(SINK, 1)

    assert shown(pipeline) == AFTER
    assert list(pipeline.marker_snapshots("t", SINK)) == [0, 1]
    assert all(len(ids) == 1 for ids in pipeline.marker_snapshots("t", SINK).values())
    assert not Path(stale.tables[0].location.removeprefix("file://")).exists(), "the stale write's files are removed"
    done = coordinator.prepare_rewrite(SINK, 1, run_writes={stale.write_id, fresh.write_id})
    assert done.outcome is RewriteOutcome.ALREADY_COMMITTED
    # committed with a write the run did not make: the run's own was refused, and must not look done
    with pytest.raises(RewriteRefused, match=r"committed with write .* not one of this run's"):
        coordinator.prepare_rewrite(SINK, 1, run_writes={stale.write_id})


def test_a_conflict_after_the_decision_gives_the_write_up_and_the_new_write_reopens_the_epoch(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, faults: FaultSwitch
) -> None:
    stale = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    coordinator.persist(stale)
    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    compacted: set[str] = set()
    faults.then("commit.decided", lambda: compacted.update(compact(pipeline)))
    with pytest.raises(UpsertConflict):
        coordinator.commit(SINK, 1)
    decided = pipeline.store.get(SINK, 1)
    assert decided is not None and decided.commit_decided_at is not None

    prepared = coordinator.prepare_rewrite(SINK, 1)
    assert prepared.outcome is RewriteOutcome.GAVE_UP
    row = pipeline.store.get(SINK, 1)
    assert row is not None and row.status is EpochStatus.ABORTED and row.abort_cause is AbortCause.UPSERT_CONFLICT
    assert (row.error or "").startswith(REWRITE_REASON)
    # a rewrite task that crashed after giving the write up finds its own abort and writes again
    assert coordinator.prepare_rewrite(SINK, 1).outcome is RewriteOutcome.REWRITE

    fresh = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    coordinator.persist(fresh)
    coordinator.commit(SINK, 1)

    assert shown(pipeline) == AFTER
    assert list(pipeline.marker_snapshots("t", SINK)) == [0, 1]
    committed = pipeline.store.get(SINK, 1)
    assert committed is not None and committed.status is EpochStatus.COMMITTED and committed.write_id == fresh.write_id
    assert {r.path for r in fresh.tables[0].rewritten} <= compacted, "the new write rewrote the compacted file"


def test_a_commit_that_failed_for_another_reason_keeps_its_write(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    pre = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    coordinator.persist(pre)
    pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)

    with pytest.raises(RewriteRefused, match=r"can still be committed.*eo-sink commit upsert-rewrites 1"):
        coordinator.prepare_rewrite(SINK, 1)

    coordinator.commit(SINK, 1)
    assert shown(pipeline) == AFTER


def test_an_epoch_aborted_for_its_checkpoint_is_not_written_again(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator
) -> None:
    coordinator.persist(write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4())))
    pipeline.checkpoint(SINK, 1, CheckpointStatus.FAILED)
    coordinator.abort(SINK, 1, reason="checkpoint FAILED")

    with pytest.raises(RewriteRefused, match=r"is Aborted \(checkpoint FAILED\), not for an upsert conflict"):
        coordinator.prepare_rewrite(SINK, 1)
    assert shown(pipeline) == FIRST


@pytest.mark.parametrize("failed_first", [True, False], ids=["checkpoint-failed-first", "conflict-first"])
def test_a_write_that_conflicts_at_persist_for_a_failed_checkpoint_is_aborted_for_good(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, failed_first: bool
) -> None:
    """Persist gives a conflicting write up for a rewrite; with the checkpoint FAILED no rewrite ever
    follows, so when the failure is known the record says that, not that the epoch is written again.
    Failed only afterwards, the rewrite task is refused and the epoch stays Aborted as it is."""
    stale = write_upsert(pipeline.catalog, "ns.t", SINK, 1, CHANGES, str(uuid.uuid4()))
    compact(pipeline)
    if failed_first:
        pipeline.checkpoint(SINK, 1, CheckpointStatus.FAILED)
    with pytest.raises(UpsertConflict):
        coordinator.persist(stale)
    if not failed_first:
        pipeline.checkpoint(SINK, 1, CheckpointStatus.FAILED)

    row = pipeline.store.get(SINK, 1)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert (row.error or "").startswith("checkpoint FAILED" if failed_first else REWRITE_REASON), row.error
    assert row.abort_cause is (AbortCause.CHECKPOINT_FAILED if failed_first else AbortCause.UPSERT_CONFLICT)
    refusal = r"not for an upsert conflict" if failed_first else r"checkpoint FAILED; the epoch is aborted, not written"
    with pytest.raises(RewriteRefused, match=refusal):
        coordinator.prepare_rewrite(SINK, 1)
    assert shown(pipeline) == FIRST
