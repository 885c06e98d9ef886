"""The epoch group builds the tasks a DAG file used to state one by one: the table, the settled
gate and the Spark write, from the sink, the checkpoint and the settings given once; and every task
takes its meta store from ``[exactly_once] meta_conn_id`` when the DAG names none."""

from __future__ import annotations

import datetime as dt
import uuid
import warnings
from typing import Any

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once import (
    FileSinkConfig,
    FilesInput,
    IcebergSinkConfig,
    MarkerFileCheckpoint,
    SparkWrite,
    TableSelect,
    TableSpec,
    exactly_once_epoch,
)
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.runtime.assembly import meta_conn_id_or_configured
from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor
from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger
from tests.support.airflow_world import World, run, ti_states

from .test_epoch_dags import DAY, G, committed_once

CONFIG_ENV = "AIRFLOW__EXACTLY_ONCE__META_CONN_ID"
EVENTS = {"event_id": "string", "user_id": "long", "at": "timestamptz", "amount": "decimal(12, 2)"}
CHECKPOINT = MarkerFileCheckpoint("/landing/{start:%Y/%m/%d/%H}")


def dag_with(build: Any) -> DAG:
    with DAG(f"eo_{uuid.uuid4().hex[:10]}", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)) as dag:
        build()
    return dag


def spark_group(sink: Any, **group: Any) -> DAG:
    write = SparkWrite(FilesInput(format="json", path="/landing/{start:%Y/%m/%d/%H}"), conn_id="spark_x", retries=4)
    return dag_with(lambda: exactly_once_epoch(write, sink=sink, checkpoint=CHECKPOINT, group_id=G, **group))


def test_the_group_creates_the_table_waits_until_settled_and_reads_the_configured_meta_store(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No meta_conn_id anywhere in the DAG: every task, the write's epoch aside, finds the world's store
    through the config; the table is created before the write, which runs after the settled gate."""
    monkeypatch.setenv(CONFIG_ENV, world.meta_conn_id)
    world.pipeline.catalog.drop_table(world.table)
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    with DAG(
        f"eo_{uuid.uuid4().hex[:10]}", schedule="@daily", start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    ) as dag:
        write = PythonOperator(task_id="write", python_callable=world.writer(world.iceberg_sink()))
        exactly_once_epoch(
            write,
            sink=world.iceberg_sink(),
            checkpoint=world.checkpoint(),
            table=TableSpec({"id": "long not null", "epoch": "long", "write_id": "string"}),
            wait_until_settled=True,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=1,
            commit_retry_delay=dt.timedelta(0),
        )
    assert dag.task_dict["write"].upstream_task_ids == {f"{G}.create_table", f"{G}.settled"}
    assert all(t.meta_conn_id is None for t in dag.tasks if hasattr(t, "meta_conn_id"))

    dr = run(dag, DAY)

    states = ti_states(dag.dag_id, dr.run_id)
    assert dr.state == "success", states
    assert states[f"{G}.create_table"][0] == states[f"{G}.settled"][0] == "success"
    committed_once(world, epoch)
    assert world.pipeline.catalog.load_table(world.table).schema().find_field("id").required


def test_an_unset_meta_conn_id_resolves_to_the_config_when_asked_and_the_trigger_carries_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert meta_conn_id_or_configured(None) == "exactly_once_default"
    assert meta_conn_id_or_configured("mine") == "mine"
    sensor = CheckpointSensor(task_id="wait", sink_id="s", checkpoint=CHECKPOINT)
    monkeypatch.setenv(CONFIG_ENV, "meta_of_this_deployment")  # after the parse: read when the task runs
    assert sensor.meta_conn_id is None
    assert meta_conn_id_or_configured(None) == "meta_of_this_deployment"
    trigger = CheckpointTrigger(
        sink_id="s", epoch=1, checkpoint=CHECKPOINT.model_dump(mode="json"), meta_conn_id=sensor.meta_conn_id
    )
    _, kwargs = trigger.serialize()
    assert kwargs["meta_conn_id"] == "meta_of_this_deployment"
    assert CheckpointTrigger(**kwargs).meta_conn_id == "meta_of_this_deployment"


def test_a_spark_write_is_built_inside_the_group_reading_the_tables_schema() -> None:
    sink = IcebergSinkConfig("events", ("ns.events",), iceberg_conn_id="ice")
    dag = spark_group(sink, table=TableSpec(EVENTS, ["day(at)"]), wait_until_settled=True)
    write = dag.task_dict[f"{G}.write"]
    assert type(write).__name__ == "SparkPreCommitOperator"
    assert (write.conn_id, write.retries, write.sink, write.meta_conn_id) == ("spark_x", 4, sink, None)
    assert write.input_spec["schema_ddl"] == "event_id STRING, user_id BIGINT, at TIMESTAMP, amount DECIMAL(12, 2)"
    assert write.upstream_task_ids == {f"{G}.create_table", f"{G}.settled"}
    assert dag.task_dict[f"{G}.persist"].upstream_task_ids == {f"{G}.write"}


def test_an_input_that_names_its_schema_or_a_table_without_declaration_keeps_what_it_said() -> None:
    sink = IcebergSinkConfig("events", ("ns.events",), iceberg_conn_id="ice")
    given = SparkWrite(FilesInput(format="csv", path="/x", schema_ddl="a STRING"))
    dag = dag_with(lambda: exactly_once_epoch(given, sink=sink, checkpoint=CHECKPOINT, table=TableSpec(EVENTS)))
    assert dag.task_dict["exactly_once_events.write"].input_spec["schema_ddl"] == "a STRING"
    assert spark_group(sink).task_dict[f"{G}.write"].input_spec["schema_ddl"] is None  # inferred, as before


def test_a_fan_out_reads_with_the_schema_of_the_tables_that_take_the_input_as_it_is() -> None:
    purchases = {"event_id": "string", "amount": "decimal(12, 2)"}
    sink = IcebergSinkConfig(
        "fan",
        ("ns.by_day", "ns.by_user", "ns.purchases"),
        iceberg_conn_id="ice",
        select={"ns.purchases": TableSelect(where="amount > 0")},
    )
    tables = {"ns.by_day": TableSpec(EVENTS), "ns.by_user": TableSpec(EVENTS), "ns.purchases": TableSpec(purchases)}
    dag = spark_group(sink, table=tables)
    assert dag.task_dict[f"{G}.write"].input_spec["schema_ddl"].startswith("event_id STRING, user_id BIGINT")
    assert {t for t in dag.task_dict if "create" in t} == {
        f"{G}.create_by_day",
        f"{G}.create_by_user",
        f"{G}.create_purchases",
    }
    differing = {**tables, "ns.by_user": TableSpec({**EVENTS, "extra": "string"})}
    with pytest.raises(
        InvalidSinkConfig, match=r"^write: the tables \['ns.by_day', 'ns.by_user'\] .* give the input its schema_ddl"
    ):
        spark_group(sink, table=differing)


@pytest.mark.parametrize(
    ("sink", "table", "refusal"),
    [
        (FileSinkConfig("f", "/tmp/files"), TableSpec(EVENTS), r"^table: sink 'f' is not an Iceberg sink"),
        (
            IcebergSinkConfig("two", ("ns.a", "ns.b"), iceberg_conn_id="ice"),
            TableSpec(EVENTS),
            r"^table: sink 'two' has several tables; give table=\{name: TableSpec",
        ),
        (
            IcebergSinkConfig("one", ("ns.a",), iceberg_conn_id="ice"),
            {"ns.b": TableSpec(EVENTS)},
            r"^table 'ns.b' is not a table of sink 'one'",
        ),
        (
            IcebergSinkConfig("one", ("ns.a",), iceberg_conn_id="ice"),
            TableSpec({"id": "lonk"}),
            r"^table 'ns.a': column 'id': unknown type 'lonk'",
        ),
        (
            IcebergSinkConfig("one", ("ns.a",), iceberg_conn_id="ice"),
            TableSpec({"id": "uuid"}),
            r"^table 'ns.a': column 'id': the Spark write cannot write an Iceberg uuid column",
        ),
    ],
)
def test_a_wrong_group_is_refused_at_parse_naming_the_argument(sink: Any, table: Any, refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=refusal):
        spark_group(sink, table=table)


def test_a_spark_write_takes_neither_the_sink_nor_the_meta_store() -> None:
    with pytest.raises(InvalidSinkConfig, match=r"^SparkWrite: meta_conn_id is exactly_once_epoch's"):
        SparkWrite(FilesInput(format="json", path="/x"), meta_conn_id="m")


def test_the_old_call_form_builds_the_same_group_without_a_warning() -> None:
    sink = IcebergSinkConfig("events", ("ns.events",), iceberg_conn_id="ice")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dag = dag_with(
            lambda: exactly_once_epoch(
                PythonOperator(task_id="transform", python_callable=dict),
                sink=sink,
                checkpoint=CHECKPOINT,
                meta_conn_id="m",
            )
        )
    group = "exactly_once_events"
    assert sorted(dag.task_dict) == sorted(
        ["transform", *(f"{group}.{t}" for t in ("persist", "wait_for_checkpoint", "commit", "abort"))]
    )
    assert dag.task_dict[f"{group}.commit"].meta_conn_id == "m"
