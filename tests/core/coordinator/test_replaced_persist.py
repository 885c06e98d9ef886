"""A late persist of a write that a revision replaced (issue 31): a zombie try of the old run retries
its persist with its own pre-commit after the newer generation's write took the epoch.

The replaced write's files are queued once, by the revision's commit, to wait for snapshot expiry
(design.md D12). Its late persist must be calm and queue nothing: a second clean-up without
``removed_by`` is refused by the safety check on every pass (the table's history still shows the
write), which failed every later recovery of the sink.
"""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_reprocessing import G1, G2, G3, commit, generation, replacing
from tests.support.pipeline import Pipeline, write_location_exists


def queued(pipeline: Pipeline, sink_id: str) -> list[tuple[str, bool]]:
    """The open clean-ups: write id, and whether it waits for snapshot expiry (a replaced write)."""
    return sorted((t.write_id, t.removed_by is not None) for t in pipeline.store.cleanups(sink_id))


def shown(pipeline: Pipeline, branch: str) -> set[str]:
    return {r["write_id"] for r in pipeline.rows("orders", branch=branch)}


def late_persists_are_calm(
    coordinator: TwoPhaseCommitCoordinator, pipeline: Pipeline, late: PreCommit, holder: str
) -> None:
    """Twice, as a retried zombie persists, and its run's abort task: calm, nothing queued or deleted."""
    before = queued(pipeline, late.sink_id)
    for _ in range(2):
        result = coordinator.persist(late, run_id="zombie", try_number=2)
        assert result.outcome is PersistOutcome.SUPERSEDED and result.write_id == holder
        assert result.warning is None
        assert queued(pipeline, late.sink_id) == before
        assert write_location_exists(late)  # the table's history still lists its files
    aborted = coordinator.abort(late.sink_id, late.epoch, reason="zombie's wait timed out", write=late)
    assert (aborted.outcome, aborted.files_deleted) == (AbortOutcome.ALREADY_COMMITTED, 0)
    assert aborted.record is not None and aborted.record.write_id == holder
    assert queued(pipeline, late.sink_id) == before and write_location_exists(late)


def test_a_late_persist_of_a_replaced_write_changes_nothing_and_recovery_stays_ok(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = replacing(pipeline, sink_id, branch=branch)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], files=2), G1)
    commit(pipeline, coordinator, first)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G2)
    commit(pipeline, coordinator, second)
    assert queued(pipeline, sink_id) == [(first.write_id, True)]

    late_persists_are_calm(coordinator, pipeline, first, second.write_id)

    row = pipeline.store.get(sink_id, 1)
    assert row is not None and (row.status, row.write_id, row.revision) == (EpochStatus.COMMITTED, second.write_id, 1)
    assert row.warning is None
    report = coordinator.recover(sink_id)
    assert report.ok, report.failed
    assert queued(pipeline, sink_id) == [(first.write_id, True)]
    assert shown(pipeline, branch) == {second.write_id}
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.ALREADY_COMMITTED


def test_every_write_a_revision_of_a_revision_replaced_is_calm(pipeline: Pipeline, sink_id: str, branch: str) -> None:
    pipeline.create_table("orders")
    coordinator = replacing(pipeline, sink_id, branch=branch)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G1)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G2)
    third = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G3)
    for pre in (first, second, third):
        commit(pipeline, coordinator, pre)

    for late in (second, first):
        late_persists_are_calm(coordinator, pipeline, late, third.write_id)
    assert coordinator.recover(sink_id).ok
    assert shown(pipeline, branch) == {third.write_id}


@pytest.mark.parametrize("then", ["commit", "abort"])
def test_a_late_persist_of_the_write_a_pending_revision_replaces_queues_nothing(
    pipeline: Pipeline, sink_id: str, branch: str, then: str
) -> None:
    """While the revision waits, the replaced write is still the visible one: queuing it as a late
    write would make its clean-up fail on every pass after the revision commits, and leave it queued
    as the epoch's write again when the revision is given up."""
    pipeline.create_table("orders")
    coordinator = replacing(pipeline, sink_id, branch=branch)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G1)
    commit(pipeline, coordinator, first)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G2)
    assert coordinator.persist(second).outcome is PersistOutcome.REVISED

    late_persists_are_calm(coordinator, pipeline, first, second.write_id)
    assert queued(pipeline, sink_id) == []

    if then == "commit":
        pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
        assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
        assert queued(pipeline, sink_id) == [(first.write_id, True)]
        holder = second.write_id
    else:
        assert coordinator.abort(sink_id, 1, reason="given up").outcome is AbortOutcome.REVISION_ABORTED
        assert queued(pipeline, sink_id) == []
        holder = first.write_id
    report = coordinator.recover(sink_id)
    assert report.ok, report.failed
    assert shown(pipeline, branch) == {holder}
    assert write_location_exists(first)
