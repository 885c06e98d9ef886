"""Write, audit, publish (design.md D23) through the coordinator, on real stores and catalogs: an audited
write is committed to its audit branch, judged, and published to the sink's branch exactly once, or
never; ``main`` is read by DuckDB, the independent reader, at every step."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_exactly_once.core.epochs import (
    AuditCheck,
    AuditVerdict,
    CheckpointStatus,
    EpochEvent,
    EpochStatus,
)
from airflow_provider_exactly_once.core.errors import AbortRefused, AuditNotPassed, CheckpointNotReady
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.markers import AUDIT_BRANCH_KEY, audit_branch_name
from tests.support.faults import SimulatedCrash
from tests.support.independent_reader import read_branch
from tests.support.pipeline import Pipeline, expected_rows, write_location_exists

COMPLETED = CheckpointStatus.COMPLETED
PASS = [AuditCheck(name="row_count", passed=True)]
FAIL = [AuditCheck(name="row_count", passed=True), AuditCheck(name="no_nulls", passed=False, message="3 null ids")]


def _audited(pipeline: Pipeline, sink_id: str, *tables: str) -> Any:
    for name in tables:
        pipeline.create_table(name)
    return pipeline.coordinator(sink_id, pipeline.iceberg_committer(), audited=[sink_id])


def _main(pipeline: Pipeline, name: str) -> list[tuple[Any, ...]]:
    """What ``main``'s readers see, read by DuckDB (none while the table has no snapshot)."""
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    if table.metadata.current_snapshot_id is None:
        return []
    return sorted(read_branch(table, "main", "id, epoch, write_id"))


def _refs(pipeline: Pipeline, name: str) -> set[str]:
    return set(pipeline.catalog.load_table(f"{pipeline.namespace}.{name}").metadata.refs)


def _audit_snapshots(pipeline: Pipeline, name: str) -> list[int]:
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    return [
        s.snapshot_id for s in table.snapshots() if s.summary and AUDIT_BRANCH_KEY in s.summary.additional_properties
    ]


def _ready(pipeline: Pipeline, coordinator: Any, pre: PreCommit) -> None:
    coordinator.persist(pre, run_id="scheduled__1", try_number=1)
    pipeline.checkpoint(pre.sink_id, pre.epoch, COMPLETED)


def test_an_audited_write_is_published_once_after_its_audit_passed(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    name = f"{pipeline.namespace}.orders"
    pre = pipeline.write_iceberg(sink_id, 1000, ["orders"], rows=6, files=2)
    coordinator.persist(pre, run_id="scheduled__1", try_number=1)
    with pytest.raises(CheckpointNotReady):
        coordinator.commit_audit(sink_id, 1000)
    pipeline.checkpoint(sink_id, 1000, COMPLETED)
    with pytest.raises(AuditNotPassed, match="not committed to its audit branch"):
        coordinator.commit(sink_id, 1000)

    row = coordinator.commit_audit(sink_id, 1000)
    branch = audit_branch_name(sink_id, 1000)
    assert row.stage == "Auditing" and row.audit is not None and row.audit.branch == branch
    assert _main(pipeline, "orders") == []  # main's readers see nothing of the audited write
    table = pipeline.catalog.load_table(name)
    assert sorted(read_branch(table, branch, "id, epoch, write_id")) == expected_rows([pre], name)
    assert coordinator.commit_audit(sink_id, 1000).audit == row.audit  # idempotent: nothing committed again
    assert len(_audit_snapshots(pipeline, "orders")) == 1
    with pytest.raises(AuditNotPassed, match="has not concluded"):
        coordinator.commit(sink_id, 1000)

    judged = coordinator.judge_audit(sink_id, 1000, PASS, write_id=pre.write_id)
    assert judged.stage == "Audited" and judged.audit is not None and judged.audit.verdict is AuditVerdict.PASSED
    result = coordinator.commit(sink_id, 1000)
    assert result.outcome is CommitOutcome.COMMITTED
    assert _main(pipeline, "orders") == expected_rows([pre], name)
    assert pipeline.marker_snapshots("orders", sink_id) == {1000: [pre.write_id]}  # the audit snapshot is expired
    assert branch not in _refs(pipeline, "orders") and _audit_snapshots(pipeline, "orders") == []
    assert coordinator.commit(sink_id, 1000).outcome is CommitOutcome.ALREADY_COMMITTED
    events = [e.event for e in pipeline.store.history.events(sink_id, 1000)]
    assert events == [
        EpochEvent.PERSISTED,
        EpochEvent.AUDIT_COMMITTED,
        EpochEvent.AUDIT_PASSED,
        EpochEvent.COMMIT_DECIDED,
        EpochEvent.COMMITTED,
    ]


def test_a_failed_audit_leaves_main_untouched_until_a_reprocess_passes(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    name = f"{pipeline.namespace}.orders"
    bad = pipeline.write_iceberg(sink_id, 2000, ["orders"], rows=4)
    _ready(pipeline, coordinator, bad)
    coordinator.commit_audit(sink_id, 2000)
    failed = coordinator.judge_audit(sink_id, 2000, FAIL, write_id=bad.write_id)
    assert failed.stage == "Audit failed" and failed.status is EpochStatus.PENDING
    with pytest.raises(AuditNotPassed, match="no_nulls: 3 null ids"):
        coordinator.commit(sink_id, 2000)
    report = coordinator.recover(sink_id)  # recovery leaves it: neither published nor aborted
    assert report.waiting == [2000] and report.committed == [] and report.aborted == []
    assert _main(pipeline, "orders") == []
    history = pipeline.store.history.events(sink_id, 2000)
    assert [e.reason for e in history if e.event is EpochEvent.AUDIT_FAILED] == ["no_nulls: 3 null ids"]
    assert write_location_exists(bad)  # kept for inspection on its audit branch

    # The reprocess: a new write replaces the failed one, whose audit branch and files go.
    good = pipeline.write_iceberg(sink_id, 2000, ["orders"], rows=5)
    coordinator.persist(good, run_id="scheduled__1", try_number=2)
    assert not write_location_exists(bad) and _audit_snapshots(pipeline, "orders") == []
    row = coordinator.commit_audit(sink_id, 2000)
    assert row.audit is not None and row.audit.write_id == good.write_id and row.audit.verdict is None
    table = pipeline.catalog.load_table(name)
    assert sorted(read_branch(table, audit_branch_name(sink_id, 2000), "id, epoch, write_id")) == expected_rows(
        [good], name
    )
    coordinator.judge_audit(sink_id, 2000, PASS, write_id=good.write_id)
    coordinator.commit(sink_id, 2000)
    assert _main(pipeline, "orders") == expected_rows([good], name)
    assert pipeline.marker_snapshots("orders", sink_id) == {2000: [good.write_id]}


def test_a_cleared_audit_judges_the_same_snapshot_again(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    pre = pipeline.write_iceberg(sink_id, 3000, ["orders"], rows=3)
    _ready(pipeline, coordinator, pre)
    first = coordinator.commit_audit(sink_id, 3000)
    coordinator.judge_audit(sink_id, 3000, FAIL, write_id=pre.write_id)
    again = coordinator.judge_audit(sink_id, 3000, PASS, write_id=pre.write_id)
    assert again.audit is not None and first.audit is not None
    assert again.audit.snapshots == first.audit.snapshots and again.stage == "Audited"
    assert coordinator.commit(sink_id, 3000).outcome is CommitOutcome.COMMITTED


def test_reject_drops_a_failed_audit_and_its_files(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    pre = pipeline.write_iceberg(sink_id, 4000, ["orders"], rows=3)
    _ready(pipeline, coordinator, pre)
    coordinator.commit_audit(sink_id, 4000)
    with pytest.raises(AbortRefused, match="only a write whose audit failed"):
        coordinator.reject(sink_id, 4000, reason="bad day")
    coordinator.judge_audit(sink_id, 4000, FAIL, write_id=pre.write_id)
    result = coordinator.reject(sink_id, 4000, reason="bad day")
    assert result.outcome is AbortOutcome.ABORTED and result.files_deleted > 0
    row = pipeline.store.get(sink_id, 4000)
    assert row is not None and row.status is EpochStatus.ABORTED and row.error == "rejected: bad day"
    assert audit_branch_name(sink_id, 4000) not in _refs(pipeline, "orders")
    assert _audit_snapshots(pipeline, "orders") == [] and not write_location_exists(pre)
    assert _main(pipeline, "orders") == []


def test_a_fan_out_epoch_is_audited_and_published_in_every_table(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "a", "b")
    bad = pipeline.write_iceberg(sink_id, 5000, ["a", "b"], rows=3)
    _ready(pipeline, coordinator, bad)
    row = coordinator.commit_audit(sink_id, 5000)
    assert row.audit is not None and set(row.audit.snapshots) == {f"{pipeline.namespace}.a", f"{pipeline.namespace}.b"}
    coordinator.judge_audit(sink_id, 5000, FAIL, write_id=bad.write_id)
    assert _main(pipeline, "a") == [] and _main(pipeline, "b") == []
    good = pipeline.write_iceberg(sink_id, 5000, ["a", "b"], rows=4)
    coordinator.persist(good, run_id="scheduled__1", try_number=2)
    coordinator.commit_audit(sink_id, 5000)
    coordinator.judge_audit(sink_id, 5000, PASS, write_id=good.write_id)
    coordinator.commit(sink_id, 5000)
    for name in ("a", "b"):
        assert _main(pipeline, name) == expected_rows([good], f"{pipeline.namespace}.{name}")
        assert _audit_snapshots(pipeline, name) == []


@pytest.mark.parametrize("crash", ["audit.committed", "audit.ran", "commit.decided", "commit.visible", "commit.marked"])
def test_a_crash_at_every_step_publishes_exactly_once(
    pipeline: Pipeline, sink_id: str, faults: Any, crash: str
) -> None:
    """A kill at each new point (the audit committed, the audit judged, the publish decided, visible,
    marked), then what a retried task and recovery do: the write is on ``main`` once."""
    coordinator = _audited(pipeline, sink_id, "orders")
    name = f"{pipeline.namespace}.orders"
    pre = pipeline.write_iceberg(sink_id, 6000, ["orders"], rows=3)
    _ready(pipeline, coordinator, pre)
    faults.crash_at(crash)
    try:
        coordinator.commit_audit(sink_id, 6000)
        coordinator.commit(sink_id, 6000, audit_checks=PASS)  # the publish task: verdict with the decision
    except SimulatedCrash:
        pass
    finally:
        faults.disarm()
    assert _main(pipeline, "orders") in ([], expected_rows([pre], name))
    coordinator.recover(sink_id)  # recovery first: it publishes only what the crash left decided
    coordinator.commit_audit(sink_id, 6000)  # then the retried tasks
    coordinator.commit(sink_id, 6000, audit_checks=PASS)
    row = pipeline.store.get(sink_id, 6000)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert _main(pipeline, "orders") == expected_rows([pre], name)
    assert pipeline.marker_snapshots("orders", sink_id) == {6000: [pre.write_id]}
    assert _audit_snapshots(pipeline, "orders") == [] and audit_branch_name(sink_id, 6000) not in _refs(
        pipeline, "orders"
    )


def test_recovery_publishes_an_audited_epoch_and_names_one_never_audited(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    audited = pipeline.write_iceberg(sink_id, 7000, ["orders"], rows=2)
    never = pipeline.write_iceberg(sink_id, 7001, ["orders"], rows=2)
    for pre in (audited, never):
        _ready(pipeline, coordinator, pre)
    coordinator.commit_audit(sink_id, 7000)
    coordinator.judge_audit(sink_id, 7000, PASS, write_id=audited.write_id)
    report = coordinator.recover(sink_id)
    assert report.committed == [7000] and report.waiting == [7001]
    row = pipeline.store.get(sink_id, 7001)
    assert row is not None and row.stage == "Pending" and row.status is EpochStatus.PENDING


def test_a_publish_whose_checks_failed_records_them_and_is_refused(pipeline: Pipeline, sink_id: str) -> None:
    coordinator = _audited(pipeline, sink_id, "orders")
    pre = pipeline.write_iceberg(sink_id, 8000, ["orders"], rows=2)
    _ready(pipeline, coordinator, pre)
    coordinator.commit_audit(sink_id, 8000)
    with pytest.raises(AuditNotPassed, match="no_nulls: 3 null ids"):
        coordinator.commit(sink_id, 8000, audit_checks=FAIL)
    row = pipeline.store.get(sink_id, 8000)
    assert row is not None and row.stage == "Audit failed" and row.commit_decided_at is None
    assert _main(pipeline, "orders") == []


def test_a_reprocessed_published_epoch_is_audited_as_a_revision(pipeline: Pipeline, sink_id: str) -> None:
    """A newer generation of a published epoch (a revision, design.md D11) is audited as what it
    would leave: the audit branch shows the new write in place of the old, and so does ``main`` once
    it is published; until then ``main`` keeps the old write."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(
        sink_id, pipeline.iceberg_committer(), audited=[sink_id], on_reprocess={sink_id: "replace"}
    )
    name = f"{pipeline.namespace}.orders"
    first = pipeline.write_iceberg(sink_id, 9000, ["orders"], rows=3)
    first = first.model_copy(update={"generation": "2024-06-01T00:00:00.000000Z/0000000000"})
    _ready(pipeline, coordinator, first)
    coordinator.commit_audit(sink_id, 9000)
    coordinator.commit(sink_id, 9000, audit_checks=PASS)
    second = pipeline.write_iceberg(sink_id, 9000, ["orders"], rows=4)
    second = second.model_copy(update={"generation": "2024-06-02T00:00:00.000000Z/0000000001"})
    coordinator.persist(second, run_id="scheduled__1", try_number=2)
    row = coordinator.commit_audit(sink_id, 9000)
    assert row.audit is not None and row.audit.write_id == second.write_id
    table = pipeline.catalog.load_table(name)
    on_branch = sorted(read_branch(table, audit_branch_name(sink_id, 9000), "id, epoch, write_id"))
    assert on_branch == expected_rows([second], name)
    assert _main(pipeline, "orders") == expected_rows([first], name)
    coordinator.commit(sink_id, 9000, audit_checks=PASS)
    assert _main(pipeline, "orders") == expected_rows([second], name)
    assert _audit_snapshots(pipeline, "orders") == []
