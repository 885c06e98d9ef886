"""A sink's committer assembled from its connections (``runtime.assembly``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import MissingDataFiles, SinkUnavailable
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.runtime.assembly import coordinator_for, sink_committer
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from demo.servers import free_port
from tests.support.pipeline import Pipeline, local_path

CLIENT_SECRET = "rest-client-secret-for-this-test"
S3_SECRET = "s3-secret-for-this-test"


def test_a_rest_catalog_that_does_not_answer_is_retryable_and_names_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A REST catalog is called while it is loaded: down, that must read "try again" (as every other
    unreachable catalog call does), with the connection's secrets masked in the message."""
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    conn = {
        "conn_type": "iceberg",
        "host": uri,
        "login": "client-id",
        "password": CLIENT_SECRET,
        "extra": {"type": "rest", "oauth2-server-uri": f"{uri}/v1/oauth/tokens", "s3.secret-access-key": S3_SECRET},
    }
    monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_DOWN", json.dumps(conn))
    sink = IcebergSinkConfig("down-sink", ("ns.events",), iceberg_conn_id="iceberg_down")

    with pytest.raises(
        SinkUnavailable, match=r"catalog of connection 'iceberg_down' \(http://127\.0\.0\.1:\d+\) could not be loaded"
    ) as caught:
        sink_committer(sink)

    assert caught.value.retryable
    assert CLIENT_SECRET not in str(caught.value) and S3_SECRET not in str(caught.value)


def test_an_instant_is_written_with_seconds_and_their_fraction_only_when_it_has_them() -> None:
    """A manual run's epoch starts at its trigger instant: ``...:36Z``, not ``...:36.000000Z``."""
    from datetime import UTC, datetime

    from airflow_provider_exactly_once.runtime.run_epochs import instant_text

    assert instant_text(datetime(2026, 12, 30, 12, 57, tzinfo=UTC)) == "2026-12-30T12:57Z"
    assert instant_text(datetime(2026, 12, 30, 12, 57, 36, tzinfo=UTC)) == "2026-12-30T12:57:36Z"
    assert instant_text(datetime(2026, 12, 30, 12, 57, 36, 250, tzinfo=UTC)) == "2026-12-30T12:57:36.000250Z"


def test_the_coordinator_takes_how_long_a_commit_checks_only_the_manifests_from_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[exactly_once] full_file_check_after_seconds`` (issue 59): 0 has even a fresh epoch's commit
    list every data file, so a data file deleted alone refuses it; unset, the commit task of the same
    epoch checks only the manifest persist wrote, and commits. An absurd value is refused by name."""
    (tmp_path / "warehouse").mkdir()
    pipeline = Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=tmp_path / "warehouse",
        catalog_name="c",
        namespace="ns",
    )
    pipeline.create_table("t")
    sink = IcebergSinkConfig(f"s-{uuid.uuid4().hex[:6]}", ("ns.t",))

    def coordinator() -> TwoPhaseCommitCoordinator:
        return coordinator_for(
            sink, MetaStoreCheckpoint(), store=pipeline.store, committer=pipeline.iceberg_committer()
        )

    pre = pipeline.write_iceberg(sink.sink_id, 1, ["t"], rows=4, files=2)
    coordinator().persist(pre)
    pipeline.checkpoint(sink.sink_id, 1, CheckpointStatus.COMPLETED)
    Path(local_path(pre.tables[0].data_files[0].path)).unlink()

    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__FULL_FILE_CHECK_AFTER_SECONDS", "0")
    with pytest.raises(MissingDataFiles):
        coordinator().commit(sink.sink_id, 1)
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__FULL_FILE_CHECK_AFTER_SECONDS", "-1")
    with pytest.raises(ValueError, match=r"^\[exactly_once\] full_file_check_after_seconds .* is refused"):
        coordinator()
    monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__FULL_FILE_CHECK_AFTER_SECONDS")
    assert coordinator().commit(sink.sink_id, 1).outcome is CommitOutcome.COMMITTED
