"""``SinkOperations.delivery``: how a registered sink's epochs reach its tables, its real catalog opened
through its Airflow connection as its committer opens it (a SQL catalog on SQLite, SeaweedFS's REST
catalog, a catalog that is down), and how long the answer is kept."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.delivery import Delivery, EpochDelivery
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.operations.service import Deliveries, delivery_of
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.sinks.iceberg.table_transactions import SETTING
from airflow_provider_exactly_once.store import SqlSinkStateStore
from demo.servers import SeaweedFS
from tests.operations.helpers import dead_catalog, register
from tests.support.airflow_world import World

ROUTE = "POST /v1/{prefix}/transactions/commit"


def _fan_out(world: World, conn_id: str, suffix: str = "fan") -> IcebergSinkConfig:
    sink = IcebergSinkConfig(
        f"{world.sink_id}-{suffix}", (world.table, f"{world.pipeline.namespace}.clicks"), iceberg_conn_id=conn_id
    )
    register(world, sink)
    return sink


def test_a_fan_out_on_a_sql_catalog_is_one_transaction_naming_the_catalog(world: World) -> None:
    world.pipeline.create_table("clicks")
    sink = _fan_out(world, world.iceberg_conn_id)
    delivery = SinkOperations(world.pipeline.store).delivery(sink.sink_id)
    assert (delivery.how, delivery.tables, delivery.atomic) == (Delivery.ONE_TRANSACTION, 2, True)
    assert delivery.why == (
        f"SQL catalog {world.iceberg_conn_id!r} moves every table's pointer in one database transaction, "
        "so a reader sees an epoch in all of them or in none"
    )
    assert json.loads(json.dumps(delivery.model_dump(mode="json")))["how"] == "one catalog transaction"


def test_one_table_and_a_file_sink_open_no_catalog(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single table needs no catalog to be answered for: on a catalog that is down, still one table."""
    ops = SinkOperations(world.pipeline.store)
    assert ops.delivery(world.sink_id).how is Delivery.ONE_TABLE  # the world's sink: one table
    conn_id, _ = dead_catalog(monkeypatch)
    single = IcebergSinkConfig(f"{world.sink_id}-single", (world.table,), iceberg_conn_id=conn_id)
    register(world, single)
    assert ops.delivery(single.sink_id) == ops.delivery(world.sink_id)
    files = FileSinkConfig(f"{world.sink_id}-files", str(world.tmp / "files"))
    register(world, files)
    delivery = ops.delivery(files.sink_id)
    assert (delivery.how, delivery.tables) == (Delivery.FILE_BY_FILE, 1)
    assert "one root" in delivery.why and "one at a time" in delivery.why


def test_a_catalog_that_cannot_be_opened_is_unknown_with_the_reason_masked(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id, port = dead_catalog(monkeypatch)
    ops = SinkOperations(world.pipeline.store)
    down = ops.delivery(_fan_out(world, conn_id, "down").sink_id)
    assert (down.how, down.tables) == (Delivery.UNKNOWN, 2)
    assert down.why.startswith("SinkUnavailable: ") and conn_id in down.why
    assert f"eo:***@127.0.0.1:{port}/catalog" in down.why and "Planted-pw" not in json.dumps(
        down.model_dump(mode="json")
    )

    missing = ops.delivery(_fan_out(world, "no_such_connection", "nowhere").sink_id)
    assert missing.how is Delivery.UNKNOWN and missing.why.startswith("InvalidSinkConfig: ")
    unregistered = ops.delivery(f"{world.sink_id}-never")
    assert (unregistered.how, unregistered.tables) == (Delivery.UNKNOWN, None)
    assert unregistered.why.startswith("SinkNotFound: ")


def test_an_answer_is_kept_per_sink_until_it_expires_or_the_sink_changes(world: World) -> None:
    world.pipeline.create_table("clicks")
    sink = _fan_out(world, world.iceberg_conn_id)
    asked: list[str] = []
    now = [100.0]

    def find(found: SinkConfig) -> EpochDelivery:
        asked.append(found.sink_id)
        return delivery_of(found)

    deliveries = Deliveries(60.0, find=find, clock=lambda: now[0])
    first = deliveries.of(sink)
    now[0] += 59.0
    assert deliveries.of(sink) is first and len(asked) == 1
    now[0] += 1.0
    assert deliveries.of(sink) == first and len(asked) == 2  # expired: the catalog is opened again
    narrowed = IcebergSinkConfig(sink.sink_id, (world.table,), iceberg_conn_id=world.iceberg_conn_id)
    assert deliveries.of(narrowed).how is Delivery.ONE_TABLE and len(asked) == 3  # registered anew


@pytest.mark.parametrize(("setting", "how"), [("true", Delivery.ONE_REQUEST), (None, Delivery.TABLE_BY_TABLE)])
def test_a_rest_catalog_commits_in_one_transaction_only_when_asked(
    seaweed: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, how: Delivery
) -> None:
    """SeaweedFS serves the route without listing it in its /v1/config (design.md, D18)."""
    conn_id = f"iceberg_rest_{uuid.uuid4().hex[:8]}"
    extra = {**seaweed.catalog_properties(), **({SETTING: setting} if setting else {})}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "iceberg", "extra": extra}))
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        sink = IcebergSinkConfig("fan-out", ("db.facts", "db.dims"), iceberg_conn_id=conn_id)
        store.registry.register_sink(
            sink.sink_id, sink.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
        )
        delivery = SinkOperations(store).delivery(sink.sink_id)
    finally:
        store.dispose()
    assert (delivery.how, delivery.tables) == (how, 2)
    if setting:
        assert delivery.why == (
            f"the connection of REST catalog {conn_id!r} asks for {ROUTE} ({SETTING}: true); "
            "a catalog that refuses it is committed table by table, and one that moves the tables one after "
            "the other inside it (SeaweedFS, design.md D18) is atomic for a refusal but not for readers"
        )
    else:
        assert f"REST catalog {conn_id!r} does not list {ROUTE} in its /v1/config" in delivery.why
    secret = seaweed.catalog_properties()["credential"].split(":", 1)[1]
    assert secret not in json.dumps(delivery.model_dump(mode="json"))


def test_a_one_table_or_file_sinks_answer_imports_no_catalog_library() -> None:
    """``eo-sink show`` of a one-table or file sink answers without pyiceberg's import (0.4 s of a
    CLI that should answer within one): only a fan-out's answer opens its catalog."""
    import subprocess
    import sys

    code = """
import sys
from airflow_provider_exactly_once.operations.service import delivery_of
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig
print(delivery_of(IcebergSinkConfig(sink_id="s", tables=("ns.t",))).how.value)
print(delivery_of(FileSinkConfig(sink_id="f", root="/tmp/f")).how.value)
print(sorted({m.split(".")[0] for m in sys.modules} & {"pyiceberg", "pyarrow", "fsspec"}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["one table", "file by file", "[]"]
