"""Sink and checkpoint configs: validated once at construction, round-tripped through their registered form."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from airflow_provider_exactly_once.checkpoints.config import (
    MarkerFileCheckpoint,
    MetaStoreCheckpoint,
    StreamingCheckpoint,
    checkpoint_config_from_dict,
)
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, find_control
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, sink_config_from_dict
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.store import SqlSinkStateStore


def test_sink_configs_round_trip_through_json() -> None:
    iceberg = IcebergSinkConfig("orders", ("db.orders", "db.items"), clock_skew=timedelta(seconds=90))
    files = FileSinkConfig("exports", "/data/exports", storage_options={"auto_mkdir": True})
    for config in (iceberg, files):
        assert sink_config_from_dict(json.loads(json.dumps(config.model_dump(mode="json")))) == config
    assert IcebergSinkConfig("one", "db.t").tables == ("db.t",)  # a single table name is accepted


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: IcebergSinkConfig("a/b", ("db.t",)), "unsafe in a path"),
        (lambda: IcebergSinkConfig("s", ()), "at least one table"),
        (lambda: IcebergSinkConfig("s", ("nodot",)), "'nodot' is not 'namespace.table'"),
        (lambda: IcebergSinkConfig("s", ("db.t", "db.t")), "listed twice"),
        (lambda: IcebergSinkConfig("s", ("db.t",), max_commit_attempts=0), "max_commit_attempts"),
        (lambda: IcebergSinkConfig("s", ("db.t",), clock_skew=timedelta(seconds=-1)), "negative"),
        (lambda: FileSinkConfig("s", " "), "root is empty"),
        (lambda: sink_config_from_dict({"kind": "kafka"}), "unknown kind 'kafka'"),
        (lambda: sink_config_from_dict({"kind": "files", "sink_id": "s", "root": "/x", "oops": 1}), "oops"),
        (lambda: MarkerFileCheckpoint("/land/{sink}/_x"), "unknown field"),
        (lambda: MetaStoreCheckpoint("{epoch}"), "unknown field"),
        (lambda: checkpoint_config_from_dict({"kind": "nope"}), "unknown kind 'nope'"),
    ],
)
def test_bad_configs_are_refused_at_construction(build: object, named: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=named):
        build()  # type: ignore[operator]


def test_configs_build_working_committers_and_sources(tmp_path: Path) -> None:
    catalog = SqlCatalog("cfg", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    assert isinstance(IcebergSinkConfig("s", ("db.t",)).committer(catalog), IcebergSinkCommitter)
    assert isinstance(FileSinkConfig("s", str(tmp_path / "out")).committer(), FileSinkCommitter)

    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    source = MetaStoreCheckpoint().source(store.checkpoints)
    assert source.status("s", 1) is CheckpointStatus.PENDING
    store.checkpoints.set_checkpoint("s", 1, CheckpointStatus.COMPLETED)
    assert source.status("s", 1) is CheckpointStatus.COMPLETED

    markers = MarkerFileCheckpoint(f"{tmp_path}/landing/{{sink_id}}/{{epoch}}")
    assert checkpoint_config_from_dict(markers.model_dump(mode="json")) == markers
    (tmp_path / "landing" / "s" / "7").mkdir(parents=True)
    (tmp_path / "landing" / "s" / "7" / "_SUCCESS").touch()
    assert markers.source().status("s", 7) is CheckpointStatus.COMPLETED
    streaming = StreamingCheckpoint(str(tmp_path / "chk"))
    assert checkpoint_config_from_dict(streaming.model_dump(mode="json")) == streaming
    assert streaming.source().status("s", 0) is CheckpointStatus.PENDING
    store.dispose()
    catalog.engine.dispose()


SECRET = "pl4nted-S3cret"


@pytest.mark.parametrize(
    "build",
    [
        lambda: FileSinkConfig("s", f"s3://AKIAEXAMPLE:{SECRET}@bucket/exports"),
        lambda: FileSinkConfig("s", f"s3://AKIAEXAMPLE:ab/{SECRET}@bucket/exports"),  # a secret with a '/'
        lambda: FileSinkConfig("s", f"https://{SECRET}@files.example.com/out"),  # a token as the user
        lambda: sink_config_from_dict({"kind": "files", "sink_id": "s", "root": f"sftp://u:{SECRET}@h/out"}),
        lambda: MarkerFileCheckpoint(f"s3://u:{SECRET}@lake/landing/{{sink_id}}/{{epoch}}"),
        lambda: StreamingCheckpoint(f"hdfs://u:{SECRET}@nn:8020/_checkpoints/{{sink_id}}"),
        lambda: checkpoint_config_from_dict(
            {"kind": "streaming", "checkpoint_location": f"gs://u:{SECRET}@b/c", "extra": 1}
        ),
        # Secrets in the query string: a SAS signature, a token.
        lambda: FileSinkConfig("s", f"abfs://data/exports?sv=2024&sig={SECRET}"),
        lambda: MarkerFileCheckpoint(f"https://lake.example/landing/{{sink_id}}/{{epoch}}?token={SECRET}"),
    ],
)
def test_credentials_in_a_location_are_refused_and_never_repeated(build: object) -> None:
    with pytest.raises(InvalidSinkConfig) as raised:
        build()  # type: ignore[operator]
    message = str(raised.value)
    assert SECRET not in message, message
    assert "***" in message
    if "extra" not in message:
        assert "storage_options" in message, message


def test_plain_locations_with_an_at_sign_or_a_port_are_accepted(tmp_path: Path) -> None:
    """Only userinfo is refused: an '@' inside the path, or a host with a port, is a location."""
    assert FileSinkConfig("s", "s3://bucket/team@example.com/out").root.endswith("/out")
    assert FileSinkConfig("s", str(tmp_path / "a@b")).root.endswith("a@b")
    MarkerFileCheckpoint(f"{tmp_path}/landing@x/{{sink_id}}/{{epoch}}")


@pytest.mark.parametrize(
    ("build", "named"),
    [
        # A table name, a branch or a root with terminal escapes would act on every terminal listing the sink.
        (lambda: IcebergSinkConfig("s", ("db.t\x1b]0;owned\x07",)), r"sink 's': table 'db.t\x1b]0;owned\x07' holds"),
        (lambda: IcebergSinkConfig("s", ("db.a", "db.\x9b2J")), "the control character U+009B"),
        (lambda: IcebergSinkConfig("s", ("db.t",), branch="main\r"), r"branch 'main\r' holds the control character"),
        (
            lambda: FileSinkConfig("s", "/data/out\x1b[2J"),
            r"root '/data/out\x1b[2J' holds the control character U+001B",
        ),
        # A root with '..' names one directory in the registry and another on the filesystem.
        (lambda: FileSinkConfig("s", "/data/exports/../../etc"), "root '/data/exports/../../etc' has a '..' segment"),
        (lambda: FileSinkConfig("s", "s3://bucket/exports/.."), "has a '..' segment; give the directory's own path"),
        (lambda: sink_config_from_dict({"kind": "files", "sink_id": "s", "root": "file:///d/../x"}), "'..' segment"),
    ],
)
def test_hostile_names_and_roots_are_refused_where_the_config_is_built(build: object, named: str) -> None:
    with pytest.raises(InvalidSinkConfig) as raised:
        build()  # type: ignore[operator]
    message = str(raised.value)
    assert named in message and find_control(message) is None, message


def test_dots_inside_a_segment_of_a_root_are_a_name() -> None:
    assert FileSinkConfig("s", "/data/v1..v2/out").root == "/data/v1..v2/out"
