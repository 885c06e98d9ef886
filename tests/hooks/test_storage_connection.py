"""Object-store credentials come from an ``aws`` connection, read at run time; configs carry its id.

The connections are real Airflow connections (``AIRFLOW_CONN_<ID>`` JSON), read through
``BaseHook.get_connection`` / ``aget_connection`` as a task and the triggerer read them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints.config import (
    MarkerFileCheckpoint,
    StreamingCheckpoint,
    checkpoint_config_from_dict,
)
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.hooks.storage import ObjectStorageHook, resolved_storage_options
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, sink_config_from_dict
from tests.hooks.s3_connection import define_connection

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"
ENDPOINT = "http://127.0.0.1:9"


def resolved(conn_id: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a task gets, after checking the triggerer's async path gets the same."""
    hook = ObjectStorageHook(conn_id)
    sync = hook.storage_options(base)
    assert asyncio.run(hook.astorage_options(base)) == sync
    return sync


def test_login_and_password_are_the_key_pair_and_extra_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define_connection(
        monkeypatch,
        {
            "conn_type": "aws",
            "login": "AKIAEXAMPLE",
            "password": SECRET,
            "extra": {
                "endpoint_url": ENDPOINT,
                "region_name": "eu-west-1",
                "aws_session_token": "session",
                "config_kwargs": {"retries": {"max_attempts": 3}},
            },
        },
    )
    assert resolved(conn_id, {"default_block_size": 1024}) == {
        "default_block_size": 1024,
        "key": "AKIAEXAMPLE",
        "secret": SECRET,
        "token": "session",
        "client_kwargs": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 3}},
    }


def test_the_amazon_providers_extra_layout_and_service_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define_connection(
        monkeypatch,
        {
            "conn_type": "aws",
            "extra": {
                "aws_access_key_id": "AKIAEXAMPLE",
                "aws_secret_access_key": SECRET,
                "endpoint_url": "http://elsewhere:1",
                "service_config": {"s3": {"endpoint_url": ENDPOINT}},
                "verify": False,
            },
        },
    )
    options = resolved(conn_id, {"client_kwargs": {"region_name": "us-east-1"}})
    assert options == {
        "key": "AKIAEXAMPLE",
        "secret": SECRET,
        "client_kwargs": {"region_name": "us-east-1", "endpoint_url": ENDPOINT, "verify": False},
    }


def test_a_connection_without_keys_leaves_the_default_credential_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = define_connection(monkeypatch, {"conn_type": "aws", "extra": {"region_name": "eu-west-1"}})
    assert resolved(conn_id) == {"client_kwargs": {"region_name": "eu-west-1"}}


@pytest.mark.parametrize(
    ("conn", "named"),
    [
        ({"conn_type": "exactly_once_meta", "host": "sqlite://"}, "type 'exactly_once_meta'"),
        ({"conn_type": "aws", "login": "AKIAEXAMPLE"}, "without its secret"),
        ({"conn_type": "aws", "extra": {"role_arn": "arn:aws:iam::1:role/r"}}, "role_arn"),
        ({"conn_type": "aws", "extra": {"config_kwargs": "retries=1"}}, "config_kwargs"),
        ({"conn_type": "aws", "extra": {"endpoint_url": "http://other:1"}}, "client_kwargs.endpoint_url"),
    ],
)
def test_connections_that_cannot_be_honoured_are_refused(
    monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any], named: str
) -> None:
    conn_id = define_connection(monkeypatch, conn)
    with pytest.raises(InvalidSinkConfig, match=named):
        ObjectStorageHook(conn_id).storage_options({"client_kwargs": {"endpoint_url": ENDPOINT}})


def test_a_missing_connection_is_a_refusal_naming_it() -> None:
    with pytest.raises(InvalidSinkConfig, match="'eo_s3_nowhere' does not exist"):
        ObjectStorageHook("eo_s3_nowhere").storage_options()
    with pytest.raises(InvalidSinkConfig, match="'eo_s3_nowhere' does not exist"):
        asyncio.run(ObjectStorageHook("eo_s3_nowhere").astorage_options())


# -- the configs -------------------------------------------------------------------------------------


CONFIGS: list[Callable[..., Any]] = [
    lambda tmp, **kw: FileSinkConfig("exports", f"{tmp}/out", **kw),
    lambda tmp, **kw: MarkerFileCheckpoint(f"{tmp}/landing/{{sink_id}}/{{epoch}}", **kw),
    lambda tmp, **kw: StreamingCheckpoint(f"{tmp}/_checkpoints/{{sink_id}}", **kw),
]


@pytest.mark.parametrize("build", CONFIGS)
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"key": "AKIAEXAMPLE", "secret": SECRET}, "key, secret"),
        ({"client_kwargs": {"aws_secret_access_key": SECRET}}, "client_kwargs.aws_secret_access_key"),
        ({"token": SECRET}, "token"),
        ({"Password": SECRET}, "Password"),
    ],
)
def test_secrets_in_storage_options_are_refused_without_repeating_them(
    tmp_path: Path, build: Callable[..., Any], options: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidSinkConfig) as raised:
        build(tmp_path, storage_options=options)
    message = str(raised.value)
    assert SECRET not in message
    assert named in message and "storage_options" in message and "storage_conn_id" in message, message


@pytest.mark.parametrize("build", CONFIGS)
def test_configs_carry_the_connection_id_and_never_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: Callable[..., Any]
) -> None:
    conn_id = define_connection(
        monkeypatch, {"conn_type": "aws", "login": "AKIAEXAMPLE", "password": SECRET, "extra": {"region_name": "r"}}
    )
    config = build(tmp_path, storage_conn_id=conn_id, storage_options={"default_block_size": 1024})
    data = config.model_dump(mode="json")
    assert data["storage_conn_id"] == conn_id and SECRET not in json.dumps(data)
    rebuilt = (sink_config_from_dict if data["kind"] == "files" else checkpoint_config_from_dict)(
        json.loads(json.dumps(data))
    )
    assert rebuilt == config
    # Resolved only when asked, where the files are touched.
    assert resolved_storage_options(config) == {
        "default_block_size": 1024,
        "key": "AKIAEXAMPLE",
        "secret": SECRET,
        "client_kwargs": {"region_name": "r"},
    }
    # A config without a connection keeps its registered form unchanged (no new key).
    assert "storage_conn_id" not in build(tmp_path).model_dump(mode="json")


@pytest.mark.parametrize("build", CONFIGS)
def test_parsing_a_dag_never_reads_the_connection(tmp_path: Path, build: Callable[..., Any]) -> None:
    """The config is built when the DAG file is parsed, where the connection may not be readable;
    the runtime reads it when the committer or source is built, and a missing one is refused then."""
    config = build(tmp_path, storage_conn_id="eo_s3_not_defined_anywhere")
    with pytest.raises(InvalidSinkConfig, match="'eo_s3_not_defined_anywhere' does not exist"):
        resolved_storage_options(config)


@pytest.mark.parametrize("build", CONFIGS)
def test_a_config_naming_a_connection_is_not_opened_without_it(tmp_path: Path, build: Callable[..., Any]) -> None:
    """Below the runtime nothing reads a connection: a committer or source asked for without the
    resolved options refuses, rather than opening the store with no credentials."""
    config = build(tmp_path, storage_conn_id="eo_s3")
    with pytest.raises(InvalidSinkConfig, match="storage_conn_id 'eo_s3' is resolved in the task"):
        config.committer() if isinstance(config, FileSinkConfig) else config.source()


@pytest.mark.parametrize("bad", ["", "  ", 7])
def test_an_empty_connection_id_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidSinkConfig, match="storage_conn_id"):
        FileSinkConfig("exports", f"{tmp_path}/out", storage_conn_id=bad)  # type: ignore[arg-type]
