"""The package as Airflow sees it (provider registry, connection type) and the pieces without a DAG:
the meta-store hook's resolution, the trigger's serialization, the error mapping."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from pathlib import Path

import pytest

import airflow_provider_exactly_once as eo
from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint, MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import CheckpointFailed, InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.get_provider_info import get_provider_info
from airflow_provider_exactly_once.hooks import ExactlyOnceMetaStoreHook, embedded_meta_store_url
from airflow_provider_exactly_once.operators._common import airflow_errors
from airflow_provider_exactly_once.runtime.run_epochs import epoch_for_context
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger
from airflow_provider_exactly_once.version_compat import AIRFLOW_V_3_2_PLUS, AirflowFailException

PACKAGE = "airflow-provider-exactly-once"


def test_providers_manager_sees_the_package_and_its_connection_type(airflow_home: Path) -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert PACKAGE in manager.providers
    # One version everywhere: the wheel's metadata, get_provider_info and the package's __version__.
    assert manager.providers[PACKAGE].version == importlib.metadata.version(PACKAGE) == eo.__version__
    assert get_provider_info()["versions"][0] == eo.__version__
    hook = manager.hooks["exactly_once_meta"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_provider_exactly_once.hooks.meta_store.ExactlyOnceMetaStoreHook"
    assert hook.connection_id_attribute_name == "meta_conn_id"
    if AIRFLOW_V_3_2_PLUS:
        # 3.2 builds the connection form from get_provider_info's declarative ui-field-behaviour; 3.1
        # asks the hook class, and only where Flask AppBuilder is installed (docs/compatibility.md).
        assert manager.field_behaviours["exactly_once_meta"]["relabeling"]["host"] == "SQLAlchemy URL"
    modules = {m for trigger in manager.trigger for m in [trigger.trigger_class_name]}
    assert any("airflow_provider_exactly_once.triggers.checkpoint" in m for m in modules)


def test_provider_info_is_valid_for_airflows_provider_schema() -> None:
    """What Airflow's providers list and connection form read: validated as Airflow validates it."""
    import jsonschema
    from airflow.providers_manager import _create_provider_info_schema_validator

    info = get_provider_info()
    _create_provider_info_schema_validator().validate({k: v for k, v in info.items() if k != "versions"})
    assert info["package-name"] == PACKAGE
    assert info["connection-types"][0]["connection-type"] == "exactly_once_meta"
    with pytest.raises(jsonschema.ValidationError):  # the check can fail
        _create_provider_info_schema_validator().validate({"name": "x"})


def test_hook_uses_the_connections_url_and_masked_password(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_META_T1",
        json.dumps({"conn_type": "exactly_once_meta", "host": url, "extra": {"busy_timeout_s": 5}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_META_PG",
        json.dumps({"conn_type": "exactly_once_meta", "host": "postgresql+psycopg2://u@db:5432/x", "password": "s3"}),
    )
    assert ExactlyOnceMetaStoreHook("eo_meta_t1").get_url() == (url, {"busy_timeout_s": 5.0})
    assert ExactlyOnceMetaStoreHook("eo_meta_pg").get_url()[0] == "postgresql+psycopg2://u:s3@db:5432/x"
    store = ExactlyOnceMetaStoreHook("eo_meta_t1").get_store()
    try:
        store.checkpoints.set_checkpoint("c", 1, CheckpointStatus.COMPLETED)
    finally:
        store.dispose()
    assert SqlSinkStateStore(url).checkpoints.get_checkpoint("c", 1) is CheckpointStatus.COMPLETED
    ok, message = ExactlyOnceMetaStoreHook("eo_meta_t1").test_connection()
    assert ok, message


def test_default_connection_falls_back_to_the_embedded_store(airflow_home: Path) -> None:
    hook = ExactlyOnceMetaStoreHook()
    assert hook.get_url() == (f"sqlite:///{airflow_home / 'exactly_once' / 'meta.db'}", {})
    assert embedded_meta_store_url() == hook.get_url()[0]
    assert asyncio.run(hook.aget_url()) == hook.get_url()
    store = hook.get_store()
    store.dispose()
    assert (airflow_home / "exactly_once" / "meta.db").exists()
    # Any other id must exist: silently writing elsewhere would split the state of a sink.
    with pytest.raises(InvalidSinkConfig, match="does not exist"):
        ExactlyOnceMetaStoreHook("no_such_meta").get_url()


def test_epoch_for_context_interval_or_run_allocation(tmp_path: Path) -> None:
    import datetime as dt

    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        assert epoch_for_context({"data_interval_start": start, "run_id": "r"}, "s", store.epochs) == 1704067200000
        first = epoch_for_context({"data_interval_start": None, "run_id": "manual_1"}, "s", store.epochs)
        assert epoch_for_context({"run_id": "manual_1"}, "s", store.epochs) == first  # every task of the run agrees
        assert epoch_for_context({"run_id": "manual_2"}, "s", store.epochs) != first
    finally:
        store.dispose()


def test_trigger_serializes_to_plain_json_and_round_trips(tmp_path: Path) -> None:
    if AIRFLOW_V_3_2_PLUS:
        from airflow.sdk.serde import deserialize, serialize
    else:  # 3.1: the same functions in Airflow core
        from airflow.serialization.serde import deserialize, serialize

    trigger = CheckpointTrigger(
        sink_id="s1",
        epoch=1704067200000,
        checkpoint=MarkerFileCheckpoint(path_template=f"{tmp_path}/{{epoch}}", storage_options={"a": 1}).model_dump(
            mode="json"
        ),
        meta_conn_id="eo_meta",
        poll_interval=2.5,
        timeout_at=1_900_000_000.0,
    )
    classpath, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON values only
    # What the task runner and the triggerer do with it: serde in, import by path, build, serialize.
    rebuilt_kwargs = deserialize(json.loads(json.dumps(serialize(kwargs))))
    from airflow.sdk.module_loading import import_string

    rebuilt = import_string(classpath)(**rebuilt_kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_trigger_fires_final_status_and_timeout(tmp_path: Path) -> None:
    checkpoint = MarkerFileCheckpoint(path_template=f"{tmp_path}/{{epoch}}").model_dump(mode="json")

    async def first_event(trigger: CheckpointTrigger) -> dict[str, object]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    import time

    pending = CheckpointTrigger(
        sink_id="s", epoch=7, checkpoint=checkpoint, poll_interval=0.05, timeout_at=time.time() + 0.3
    )
    assert asyncio.run(first_event(pending))["status"] == "TIMEOUT"
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "_FAILED").touch()
    failed = CheckpointTrigger(sink_id="s", epoch=7, checkpoint=checkpoint, poll_interval=0.05)
    assert asyncio.run(first_event(failed)) == {"status": "FAILED", "sink_id": "s", "epoch": 7}
    # A meta-store checkpoint with an unknown connection is a refusal: ERROR, not an endless wait.
    broken = CheckpointTrigger(
        sink_id="s", epoch=7, checkpoint=MetaStoreCheckpoint().model_dump(mode="json"), meta_conn_id="nope"
    )
    event = asyncio.run(first_event(broken))
    assert event["status"] == "ERROR" and event["retryable"] is False


def test_refusals_fail_without_retry_and_transient_faults_are_retried() -> None:
    with pytest.raises(AirflowFailException, match="CheckpointFailed"), airflow_errors():
        raise CheckpointFailed("checkpoint FAILED")
    with pytest.raises(MetaStoreUnavailable), airflow_errors():
        raise MetaStoreUnavailable("database gone")
