"""Commits on SeaweedFS (REST catalog and S3) when the network or the servers fail, for real.

A TCP proxy (``tests.support.proxy``) sits between pyiceberg and the server: it loses the response
of the commit request after the catalog applied it, or refuses connections to S3; the catalog
process itself is killed and restarted. Each time the committer must say "retry" (``retryable``),
delete nothing, and the next attempt must finish the epoch with exactly one marked snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CommitOutcomeUnknown,
    ExactlyOnceError,
    SinkUnavailable,
)
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.transaction import FAULT_BEFORE_CATALOG_UPDATE
from demo.servers import SECRET_KEY, SeaweedFS
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.object_store import S3Pipeline, s3_pipeline, seaweed_lake
from tests.support.proxy import Proxy

COMPLETED, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.FAILED


def is_commit(method: str, path: str, body: bytes) -> bool:
    """pyiceberg's ``commit_table``: ``POST /v1/{prefix}/namespaces/{ns}/tables/{table}`` adding a snapshot."""
    return method == "POST" and "/tables/" in path and b'"add-snapshot"' in body


def proxy_to(url: str, *, http: bool) -> Proxy:
    parsed = urlparse(url)
    assert parsed.hostname is not None and parsed.port is not None
    return Proxy(parsed.hostname, parsed.port, http=http).start()


@pytest.fixture
def catalog_proxy(seaweed: SeaweedFS) -> Iterator[Proxy]:
    proxy = proxy_to(seaweed.catalog_uri, http=True)
    yield proxy
    proxy.stop()


@pytest.fixture
def s3_proxy(seaweed: SeaweedFS) -> Iterator[Proxy]:
    proxy = proxy_to(seaweed.s3_endpoint, http=False)
    yield proxy
    proxy.stop()


def committed_rows(pipeline: S3Pipeline, name: str) -> list[tuple[int, int, str]]:
    return read_rows(pipeline.catalog.load_table(f"{pipeline.namespace}.{name}"), "id, epoch, write_id")


def assert_committed_once(pipeline: S3Pipeline, sink_id: str, writes: list[PreCommit]) -> None:
    assert pipeline.marker_snapshots("orders", sink_id) == {p.epoch: [p.write_id] for p in writes}
    assert committed_rows(pipeline, "orders") == pipeline.expected_rows(writes, f"{pipeline.namespace}.orders")


@pytest.mark.parametrize(
    "lost",
    [
        pytest.param(None, id="connection-closed"),
        pytest.param(b"HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", id="504"),
    ],
)
def test_a_lost_commit_response_is_an_unknown_outcome_and_the_retry_finds_the_marker(
    seaweed: SeaweedFS, catalog_proxy: Proxy, tmp_path: Path, sink_id: str, unique: str, lost: bytes | None
) -> None:
    pipeline = s3_pipeline(seaweed_lake(seaweed, f"eo_{unique}", uri=catalog_proxy.url), tmp_path)
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=6, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, COMPLETED)

    catalog_proxy.drop_response(is_commit, answer=lost)
    with pytest.raises(CommitOutcomeUnknown) as caught:
        coordinator.commit(sink_id, 1)
    assert caught.value.retryable and SECRET_KEY not in str(caught.value)
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in catalog_proxy.dropped()] == [("POST", "orders")]
    # The catalog applied it; the client could not know, so nothing was deleted and the row waits.
    assert pipeline.marker_snapshots("orders", sink_id) == {1: [pre.write_id]}
    assert pipeline.write_exists(pre)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None
    assert "CommitOutcomeUnknown" in (row.error or "")
    with pytest.raises(AbortRefused):
        coordinator.abort(sink_id, 1, reason="a wait that gave up")

    result = coordinator.commit(sink_id, 1)  # the retry: finds its marker, commits nothing
    assert result.outcome is CommitOutcome.COMMITTED
    assert sum(1 for r in catalog_proxy.requests if is_commit(r.method, r.path, b'"add-snapshot"')) >= 1
    assert len(pipeline.catalog.load_table(f"{pipeline.namespace}.orders").metadata.snapshots) == 1
    assert_committed_once(pipeline, sink_id, [pre])
    pipeline.dispose()


def test_a_catalog_down_during_commits_fails_retryably_and_the_epoch_commits_after(
    seaweed: SeaweedFS, tmp_path: Path, sink_id: str, unique: str
) -> None:
    """Its own ``weed mini`` (the session's ``seaweed`` only brings the fixture's skip-or-fail rule):
    it is stopped, killed and started again on the same ports and -dir, which keeps the catalog's
    tables (checked here: every earlier commit is still there after)."""
    server = SeaweedFS(tmp_path / "weed").start()
    faults = FaultSwitch()
    try:
        pipeline = s3_pipeline(seaweed_lake(server, f"eo_{unique}"), tmp_path, fault=faults)
        pipeline.create_table("orders")
        coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
        first = pipeline.write_iceberg(sink_id, 1, ["orders"])
        coordinator.persist(first)
        pipeline.checkpoint(sink_id, 1, COMPLETED)

        server.stop()  # down before the commit: the table cannot even be loaded
        with pytest.raises(SinkUnavailable) as caught:
            coordinator.commit(sink_id, 1)
        assert caught.value.retryable and SECRET_KEY not in str(caught.value)
        server.start()
        assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED

        second = pipeline.write_iceberg(sink_id, 2, ["orders"])
        coordinator.persist(second)
        pipeline.checkpoint(sink_id, 2, COMPLETED)
        faults.then(FAULT_BEFORE_CATALOG_UPDATE, server.kill)  # dies with the manifests written
        with pytest.raises(CommitOutcomeUnknown):
            coordinator.commit(sink_id, 2)
        server.start()
        assert pipeline.write_exists(second)
        assert coordinator.commit(sink_id, 2).outcome is CommitOutcome.COMMITTED
        assert_committed_once(pipeline, sink_id, [first, second])
        pipeline.dispose()
    finally:
        server.stop()


def test_s3_refusing_during_existence_checks_and_deletes_is_retryable_and_loses_nothing(
    seaweed: SeaweedFS, s3_proxy: Proxy, tmp_path: Path, sink_id: str, unique: str
) -> None:
    """The catalog's FileIO reaches S3 through the proxy; the writer (Spark's part) reaches it directly."""
    pipeline = s3_pipeline(seaweed_lake(seaweed, f"eo_{unique}", **{"s3.endpoint": s3_proxy.url}), tmp_path)
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    kept = pipeline.write_iceberg(sink_id, 1, ["orders"], files=2)
    coordinator.persist(kept)
    pipeline.checkpoint(sink_id, 1, COMPLETED)

    s3_proxy.refuse()
    with pytest.raises(SinkUnavailable) as caught:
        coordinator.commit(sink_id, 1)
    assert caught.value.retryable and SECRET_KEY not in str(caught.value)
    assert pipeline.marker_snapshots("orders", sink_id) == {}
    s3_proxy.resume()
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED

    dropped = pipeline.write_iceberg(sink_id, 2, ["orders"], files=2)
    coordinator.persist(dropped)
    pipeline.checkpoint(sink_id, 2, FAILED)
    s3_proxy.refuse()
    with pytest.raises(ExactlyOnceError) as failed_abort:
        coordinator.abort(sink_id, 2, reason="checkpoint failed")
    assert isinstance(failed_abort.value, SinkUnavailable), repr(failed_abort.value)
    row = pipeline.store.get(sink_id, 2)
    assert row is not None and row.status is EpochStatus.ABORTED  # decided, its clean-up queued
    assert pipeline.write_exists(dropped) and pipeline.write_exists(kept)
    s3_proxy.resume()
    again = coordinator.abort(sink_id, 2, reason="checkpoint failed")
    assert again.outcome is AbortOutcome.ALREADY_ABORTED and again.files_deleted == 3  # and persist's manifest
    assert not pipeline.write_exists(dropped) and pipeline.write_exists(kept)
    assert_committed_once(pipeline, sink_id, [kept])
    pipeline.dispose()
