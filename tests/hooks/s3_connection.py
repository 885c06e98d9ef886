"""An ``aws`` Airflow connection to the session's SeaweedFS, defined as tasks see connections: an
``AIRFLOW_CONN_<ID>`` JSON environment variable. Shared by the suites that put files, markers and
streaming checkpoints on S3; each test also takes its own prefix of the ``plain`` bucket."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import s3fs

from demo.servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

#: One retry at most and a short connect timeout, so an outage test is answered in seconds
#: (botocore's default would retry a refused connection for about ten).
FAST_FAILURE = {"retries": {"max_attempts": 2, "mode": "standard"}, "connect_timeout": 2, "read_timeout": 10}


def aws_connection(seaweed: SeaweedFS, *, layout: str = "login") -> dict[str, object]:
    """The connection as users write it: key id and secret in login/password, or the Amazon
    provider's extra layout (``aws_access_key_id`` ..., endpoint under ``service_config.s3``)."""
    if layout == "login":
        return {
            "conn_type": "aws",
            "login": ACCESS_KEY,
            "password": SECRET_KEY,
            "extra": {"endpoint_url": seaweed.s3_endpoint, "region_name": REGION, "config_kwargs": FAST_FAILURE},
        }
    return {
        "conn_type": "aws",
        "extra": {
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
            "region_name": REGION,
            "service_config": {"s3": {"endpoint_url": seaweed.s3_endpoint}},
            "config_kwargs": FAST_FAILURE,
        },
    }


def define_connection(monkeypatch: pytest.MonkeyPatch, conn: dict[str, object]) -> str:
    conn_id = f"eo_s3_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


@dataclass(frozen=True)
class S3Place:
    """A connection id and a prefix of its own on the ``plain`` bucket, and a client for checking."""

    conn_id: str
    prefix: str
    fs: s3fs.S3FileSystem

    def url(self, *parts: str) -> str:
        return "/".join([f"s3://{self.prefix}", *parts])

    def touch(self, *parts: str) -> None:
        self.fs.pipe_file("/".join([self.prefix, *parts]), b"")


@pytest.fixture
def s3_place(seaweed: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Place]:
    conn_id = define_connection(monkeypatch, aws_connection(seaweed))
    prefix = f"{seaweed.bucket}/{uuid.uuid4().hex}"
    fs = s3fs.S3FileSystem(**seaweed.s3fs_options(), skip_instance_cache=True)
    yield S3Place(conn_id, prefix, fs)
    if seaweed.running:
        fs.invalidate_cache()
        if fs.exists(prefix):
            fs.rm(prefix, recursive=True)


class SeaweedDown:
    """SeaweedFS stopped for the ``with`` block, started again after (same ports, same data)."""

    def __init__(self, seaweed: SeaweedFS) -> None:
        self.seaweed = seaweed

    def __enter__(self) -> None:
        self.seaweed.stop()

    def __exit__(self, *exc: object) -> None:
        self.seaweed.start()
