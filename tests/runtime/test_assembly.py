"""A sink's committer assembled from its connections (``runtime.assembly``)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_exactly_once.core.errors import SinkUnavailable
from airflow_provider_exactly_once.runtime.assembly import sink_committer
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from demo.servers import free_port

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
