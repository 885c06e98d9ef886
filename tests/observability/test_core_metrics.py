"""The coordinator's and the Iceberg committer's metrics, through ``core.coordinator`` with no Airflow:
a recording ``Metrics`` (an implementation of the port, not a double of anything), real SQLite
stores, real pyiceberg SQL catalogs and Parquet files."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_exactly_once.core.coordinator import NO_METRICS, SafeMetrics, report_pending, safe
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import CheckpointNotReady
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline, local_path


class Recording:
    """Keeps every measurement, as (kind, name, value, tags)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float, dict[str, str]]] = []

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        self.events.append(("incr", name, count, dict(tags)))

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        self.events.append(("gauge", name, value, dict(tags)))

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        self.events.append(("timing", name, duration.total_seconds(), dict(tags)))

    def total(self, name: str, **tags: str) -> float:
        return sum(v for _, n, v, t in self.events if n == name and tags.items() <= t.items())

    def named(self, name: str) -> list[tuple[str, str, float, dict[str, str]]]:
        return [e for e in self.events if e[1] == name]


@pytest.fixture
def faults() -> FaultSwitch:
    return FaultSwitch()


@pytest.fixture
def pipeline(tmp_path: Path, faults: FaultSwitch) -> Iterator[Pipeline]:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    p = Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=warehouse,
        catalog_name=f"cat_{uuid.uuid4().hex[:8]}",
        namespace=f"ns_{uuid.uuid4().hex[:8]}",
        fault=faults,
    )
    yield p
    p.dispose()


def test_a_commit_reports_its_duration_files_rows_and_outcome_once(pipeline: Pipeline) -> None:
    pipeline.create_table("orders")
    metrics = Recording()
    committer = pipeline.iceberg_committer(metrics=metrics)
    coordinator = pipeline.coordinator("sink-a", committer, metrics=metrics)
    pre = pipeline.write_iceberg("sink-a", 7, ["orders"], rows=9, files=3)
    coordinator.persist(pre)

    with pytest.raises(CheckpointNotReady):
        coordinator.commit("sink-a", 7)
    assert metrics.named("commit.errors") == [
        ("incr", "commit.errors", 1, {"sink_id": "sink-a", "error": "CheckpointNotReady"})
    ]

    pipeline.checkpoint("sink-a", 7, CheckpointStatus.COMPLETED)
    coordinator.commit("sink-a", 7)
    coordinator.commit("sink-a", 7)  # a rerun: already committed, counts no files or rows again

    tags = {"sink_id": "sink-a"}
    assert metrics.total("commit.files", **tags) == 3
    assert metrics.total("commit.rows", **tags) == 9 == pre.record_count
    assert metrics.total("commit.bytes", **tags) == sum(d.file_size_in_bytes for d in pre.tables[0].data_files)
    assert metrics.total("commits", outcome="committed", **tags) == 1
    assert metrics.total("commits", outcome="already_committed", **tags) == 1
    (duration,) = metrics.named("commit.duration")
    assert duration[0] == "timing" and duration[2] > 0 and duration[3] == tags
    assert metrics.named("commit.retries") == []  # nobody else wrote to the table


def test_an_empty_epoch_counts_as_a_commit_of_nothing(pipeline: Pipeline) -> None:
    pipeline.create_table("orders")
    metrics = Recording()
    coordinator = pipeline.coordinator("sink-e", pipeline.iceberg_committer(), metrics=metrics)
    coordinator.persist(pipeline.write_iceberg("sink-e", 1, ["orders"], rows=0))
    pipeline.checkpoint("sink-e", 1, CheckpointStatus.COMPLETED)
    coordinator.commit("sink-e", 1)
    assert metrics.total("commits", outcome="committed") == 1
    assert metrics.total("commit.files") == 0 and metrics.total("commit.rows") == 0


def test_a_real_commit_conflict_is_reported_as_a_retry(pipeline: Pipeline, faults: FaultSwitch) -> None:
    table = pipeline.create_table("orders")
    metrics = Recording()
    coordinator = pipeline.coordinator("sink-r", pipeline.iceberg_committer(metrics=metrics), metrics=metrics)
    pre = pipeline.write_iceberg("sink-r", 8, ["orders"], rows=4)
    other = pipeline.write_iceberg("other-writer", 99, ["orders"], rows=2)
    coordinator.persist(pre)
    pipeline.checkpoint("sink-r", 8, CheckpointStatus.COMPLETED)

    def other_writer_appends() -> None:
        rows = pq.read_table(local_path(other.tables[0].data_files[0].path))
        pipeline.catalog.load_table(table.name()).append(rows)

    faults.then("iceberg.before_catalog_update", other_writer_appends)
    coordinator.commit("sink-r", 8)

    assert metrics.named("commit.retries") == [
        ("incr", "commit.retries", 1, {"sink_id": "sink-r", "table": pre.tables[0].table})
    ]
    assert metrics.total("commit.rows") == 4  # the other writer's rows are not ours
    assert len(pipeline.rows("orders")) == 6


def test_aborts_report_their_outcome_and_deleted_files(pipeline: Pipeline) -> None:
    pipeline.create_table("orders")
    metrics = Recording()
    coordinator = pipeline.coordinator("sink-x", pipeline.iceberg_committer(), metrics=metrics)
    pre = pipeline.write_iceberg("sink-x", 3, ["orders"], rows=6, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint("sink-x", 3, CheckpointStatus.FAILED)

    result = coordinator.abort("sink-x", 3, reason="test")
    coordinator.abort("sink-x", 3, reason="test again")

    assert result.files_deleted == 3  # two data files and the manifest persist wrote
    assert metrics.total("aborts", outcome="aborted", sink_id="sink-x") == 1
    assert metrics.total("aborts", outcome="already_aborted", sink_id="sink-x") == 1
    assert metrics.total("abort.files_deleted", sink_id="sink-x") == 3


def test_pending_gauges_count_pending_epochs_and_age_the_oldest_on_the_database_clock(pipeline: Pipeline) -> None:
    pipeline.create_table("orders")
    metrics = Recording()
    coordinator = pipeline.coordinator("sink-p", pipeline.iceberg_committer())
    assert report_pending(pipeline.store, "sink-p", metrics) == (0, 0.0)

    for epoch in (1, 2, 3):
        coordinator.persist(pipeline.write_iceberg("sink-p", epoch, ["orders"], rows=1))
    pipeline.checkpoint("sink-p", 2, CheckpointStatus.COMPLETED)
    coordinator.commit("sink-p", 2)
    oldest = pipeline.store.get("sink-p", 1)
    assert oldest is not None

    count, age = report_pending(pipeline.store, "sink-p", metrics)

    assert count == 2
    upper = (pipeline.store.now() - oldest.created_at).total_seconds()
    assert 0 <= age <= upper
    assert metrics.events[-2:] == [
        ("gauge", "pending_epochs", 2.0, {"sink_id": "sink-p"}),
        ("gauge", "oldest_pending_age_seconds", age, {"sink_id": "sink-p"}),
    ]


def test_a_failing_metrics_backend_never_fails_a_commit(pipeline: Pipeline) -> None:
    class Broken(Recording):
        def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
            raise OSError("statsd host unreachable")

    pipeline.create_table("orders")
    coordinator = pipeline.coordinator("sink-b", pipeline.iceberg_committer(), metrics=Broken())
    coordinator.persist(pipeline.write_iceberg("sink-b", 1, ["orders"], rows=2))
    pipeline.checkpoint("sink-b", 1, CheckpointStatus.COMPLETED)
    assert coordinator.commit("sink-b", 1).outcome.value == "committed"
    assert len(pipeline.rows("orders")) == 2


def test_safe_wraps_once_and_leaves_the_no_op_alone() -> None:
    recording = Recording()
    wrapped = safe(recording)
    assert isinstance(wrapped, SafeMetrics) and safe(wrapped) is wrapped
    assert safe(NO_METRICS) is NO_METRICS


def test_audits_are_counted_and_timed_by_verdict(pipeline: Pipeline) -> None:
    """An audited sink's verdicts (design.md D23): ``audits`` by verdict, ``audit.duration`` from the
    audit commit to the verdict."""
    from airflow_provider_exactly_once.core.coordinator import AUDIT_DURATION, AUDITS
    from airflow_provider_exactly_once.core.epochs import AuditCheck

    metrics = Recording()
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator("audited", pipeline.iceberg_committer(), audited=["audited"], metrics=metrics)
    pre = pipeline.write_iceberg("audited", 1, ["orders"], rows=2)
    coordinator.persist(pre)
    pipeline.checkpoint("audited", 1, CheckpointStatus.COMPLETED)
    coordinator.commit_audit("audited", 1)
    coordinator.judge_audit("audited", 1, [AuditCheck(name="c", passed=False, message="no")], write_id=pre.write_id)
    coordinator.judge_audit("audited", 1, [AuditCheck(name="c", passed=True)], write_id=pre.write_id)
    assert metrics.total(AUDITS, verdict="failed") == 1 and metrics.total(AUDITS, verdict="passed") == 1
    timings = metrics.named(AUDIT_DURATION)
    assert [t[3]["verdict"] for t in timings] == ["failed", "passed"] and all(t[2] >= 0 for t in timings)
