"""Asset events, the Epoch extra link and OpenLineage datasets of real epoch runs (``dag.test()``
into a real pyiceberg SQL catalog, Airflow's own metadata DB for the asset events and XComs)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.observability.assets import (
    iceberg_asset,
    iceberg_asset_uri,
    sanitize_uri,
    table_of_asset_uri,
)
from airflow_provider_exactly_once.observability.links import EpochLink
from airflow_provider_exactly_once.observability.urls import epoch_page
from airflow_provider_exactly_once.runtime.assembly import FAULT_HOOK_ENV_VAR
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from demo.fault_plan import FAULT_ENV_VAR, FAULT_HOOK_FACTORY
from tests.support.airflow_world import World, run, ti_states, xcom

DAY = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
G = "eo"
BASE_URL = "http://airflow.example:8080"


def epoch_dag(world: World, *, writes: int = 5, sink: IcebergSinkConfig | None = None, commit_retries: int = 0) -> DAG:
    sink = sink or world.iceberg_sink()
    with DAG(
        f"eo_obs_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        default_args={"retries": 0},
    ) as dag:
        write = PythonOperator(task_id="write", python_callable=world.writer(sink, rows=writes))
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=commit_retries,
            commit_retry_delay=dt.timedelta(0),
        )
    return dag


def asset_events(uri: str) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent).join(AssetModel, AssetModel.id == AssetEvent.asset_id).where(AssetModel.uri == uri)
        ).all()
        return [{"extra": dict(r.extra or {}), "task_id": r.source_task_id, "run_id": r.source_run_id} for r in rows]


def manual_run(dag_run: Any) -> dict[str, Any]:
    """What a commit's events say of a ``dag.test()`` run (a manual run, never cleared, first try)."""
    return {
        "committed_by": "commit task",
        "run_type": "manual",
        "clear_number": 0,
        "triggering_user": getattr(dag_run, "triggering_user_name", None),
        "try_number": 1,
    }


def link_xcom(dag_id: str, run_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.key == EpochLink().xcom_key,
            )
        )


@pytest.fixture
def base_url(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
    return BASE_URL


class LineageCapture:
    """A real Airflow listener: does what the OpenLineage provider's listener does on success, i.e.
    asks the finished task (the executed copy, with its run-time state) for its lineage."""

    def __init__(self) -> None:
        self.lineage: dict[str, Any] = {}

    from airflow.listeners import hookimpl

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        task = task_instance.task
        if hasattr(task, "get_openlineage_facets_on_complete") and task.task_id.startswith(f"{G}."):
            self.lineage[task.task_id] = task.get_openlineage_facets_on_complete(task_instance)


@pytest.fixture
def lineage_capture() -> Iterator[LineageCapture]:
    from airflow.sdk.listener import get_listener_manager

    capture = LineageCapture()
    get_listener_manager().add_listener(capture)
    yield capture
    get_listener_manager().pm.unregister(capture)


def test_a_commit_emits_one_asset_event_per_table_a_replacement_another_a_kept_rerun_none(
    world: World, base_url: str
) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world)
    uri = iceberg_asset_uri(world.iceberg_conn_id, world.table)

    first = run(dag, DAY)

    assert first.state == "success"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.committed is not None
    events = asset_events(uri)
    assert events == [
        {
            "extra": {
                "sink_id": world.sink_id,
                "epoch": epoch,
                "write_id": row.write_id,
                "snapshot_id": row.committed[world.table],
                "revision": 0,
                "run": manual_run(first),
            },
            "task_id": f"{G}.commit",
            "run_id": first.run_id,
        }
    ]
    # The link of the commit task instance opens its epoch's page under Airflow's [api] base_url.
    assert link_xcom(dag.dag_id, first.run_id, f"{G}.commit") == epoch_page(world.sink_id, epoch, BASE_URL)

    second = run(dag, DAY)  # the same interval reprocessed: the new write replaces the epoch

    assert second.state == "success"
    assert xcom(dag.dag_id, second.run_id, f"{G}.commit")["outcome"] == "committed"
    replaced = world.pipeline.store.get(world.sink_id, epoch)
    assert replaced is not None and replaced.revision == 1 and replaced.committed is not None
    events = asset_events(uri)
    assert len(events) == 2  # downstream DAGs see the corrected data
    assert events[1]["run_id"] == second.run_id and events[1]["extra"] == {
        "sink_id": world.sink_id,
        "epoch": epoch,
        "write_id": replaced.write_id,
        "snapshot_id": replaced.committed[world.table],
        "revision": 1,
        "run": manual_run(second),
    }
    assert world.markers() == {epoch: [row.write_id, replaced.write_id]}

    kept = epoch_dag(world, sink=world.iceberg_sink().model_copy(update={"on_reprocess": "keep"}))
    third = run(kept, DAY)  # a sink that keeps its commits: the rerun changes nothing

    assert third.state == "success"
    assert xcom(kept.dag_id, third.run_id, f"{G}.commit")["outcome"] == "already committed"
    assert len(asset_events(uri)) == 2  # downstream DAGs do not run again for nothing new
    assert world.markers() == {epoch: [row.write_id, replaced.write_id]}


def test_a_commit_retried_after_its_first_try_died_past_the_commit_still_emits_the_events(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try makes the write visible and marks the epoch Committed, then dies before the task
    succeeds (when Airflow records events); the retry finds the epoch committed with this run's write."""
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, commit_retries=1)
    uri = iceberg_asset_uri(world.iceberg_conn_id, world.table)
    monkeypatch.setenv(FAULT_HOOK_ENV_VAR, FAULT_HOOK_FACTORY)
    monkeypatch.setenv(FAULT_ENV_VAR, "commit.marked:crash")

    dr = run(dag, DAY)

    assert dr.state == "success"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.commit"] == ("success", 2)
    assert xcom(dag.dag_id, dr.run_id, f"{G}.commit")["outcome"] == "already committed"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.committed is not None
    events = asset_events(uri)
    assert [(e["run_id"], e["extra"]["write_id"], e["extra"]["snapshot_id"]) for e in events] == [
        (dr.run_id, row.write_id, row.committed[world.table])
    ]


def test_an_aborted_epoch_emits_no_event_and_its_abort_task_links_to_the_epoch(world: World, base_url: str) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.FAILED)
    dag = epoch_dag(world)

    dr = run(dag, DAY)

    assert dr.state == "failed"
    assert ti_states(dag.dag_id, dr.run_id)[f"{G}.abort"][0] == "success"
    assert asset_events(iceberg_asset_uri(world.iceberg_conn_id, world.table)) == []
    assert link_xcom(dag.dag_id, dr.run_id, f"{G}.abort") == epoch_page(world.sink_id, epoch, BASE_URL)


def test_the_downstream_dag_is_scheduled_on_the_same_asset_the_commit_emits(world: World) -> None:
    """The helper DAG authors schedule on names the asset the commit's events name."""
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    asset = iceberg_asset(world.iceberg_conn_id, world.table)
    with DAG(f"eo_downstream_{uuid.uuid4().hex[:8]}", schedule=[asset], start_date=DAY) as downstream:
        PythonOperator(task_id="read", python_callable=lambda: None)
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    from tests.support.airflow_world import register

    register(downstream)
    with create_session() as session:  # new DAGs start paused; a paused DAG is not queued
        session.execute(update(DagModel).where(DagModel.dag_id == downstream.dag_id).values(is_paused=False))
    run(epoch_dag(world), DAY)

    with create_session() as session:
        queued = session.scalars(
            select(AssetDagRunQueue.target_dag_id)
            .join(AssetModel, AssetModel.id == AssetDagRunQueue.asset_id)
            .where(AssetModel.uri == asset.uri)
        ).all()
    assert queued == [downstream.dag_id]


def test_commit_and_write_report_lineage_with_schema_and_statistics(
    world: World, lineage_capture: LineageCapture
) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, writes=7)

    run(dag, DAY)

    lineage = lineage_capture.lineage[f"{G}.commit"]
    assert lineage.inputs == []
    (output,) = lineage.outputs
    table = world.pipeline.catalog.load_table(world.table)
    location = table.location().removeprefix("file://")
    assert (output.namespace, output.name) == ("file", location)
    (symlink,) = output.facets["symlinks"].identifiers
    assert (symlink.namespace, symlink.name, symlink.type) == (
        f"iceberg://{world.iceberg_conn_id}",
        world.table,
        "TABLE",
    )
    # The write listed no columns (it kept the table's schema), so the facet is the table's schema.
    fields = [(f.name, f.type) for f in output.facets["schema"].fields]
    assert fields == [("id", "long"), ("epoch", "long"), ("write_id", "string")]
    stats = output.outputFacets["outputStatistics"]
    (write,) = world.writes
    assert stats.rowCount == 7 == write.record_count
    assert stats.fileCount == len(write.tables[0].data_files)
    assert stats.size == sum(d.file_size_in_bytes for d in write.tables[0].data_files) > 0
    facet = lineage.run_facets["exactlyOnce"]
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None
    assert (facet.sinkId, facet.epoch, facet.writeId, facet.revision) == (world.sink_id, epoch, row.write_id, 0)
    assert facet.run["committed_by"] == "commit task" and facet.run["run_type"] == "manual"


def test_the_provider_registers_the_iceberg_scheme_and_the_link() -> None:
    from urllib.parse import urlsplit

    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    runtime = ProvidersManagerTaskRuntime()
    assert runtime.asset_uri_handlers["iceberg"] is sanitize_uri
    assert runtime.asset_factories["iceberg"](catalog="lake", table="db.events") == iceberg_asset("lake", "db.events")
    assert "airflow_provider_exactly_once.observability.links.EpochLink" in ProvidersManager().extra_links_class_names
    assert iceberg_asset("lake", "db.events").uri == "iceberg://lake/db/events"
    assert table_of_asset_uri(iceberg_asset("lake", "a.b.events").uri) == ("lake", "a.b.events")
    with pytest.raises(InvalidSinkConfig, match="namespace required"):
        iceberg_asset("lake", "events")
    with pytest.raises(InvalidSinkConfig, match="catalog must be"):
        iceberg_asset("", "db.events")
    for bad in ("iceberg:///db/events", "iceberg://lake/events", "iceberg://lake/db//events"):
        with pytest.raises(ValueError, match="iceberg asset URI"):
            sanitize_uri(urlsplit(bad))


def sql_target(world: World) -> dict[str, Any]:
    """The job spec's target for the world's table: its SQL catalog, as the operator derives it."""
    return {
        "kind": "iceberg",
        "catalog_name": world.iceberg_conn_id,
        "catalog_properties": {
            "type": "sql",
            "uri": world.pipeline.catalog_url,
            "warehouse": f"file://{world.pipeline.warehouse}",
        },
        "table": world.table,
    }


def test_the_spark_write_reports_its_input_files_and_the_columns_it_wrote(world: World, tmp_path: Any) -> None:
    """The Spark operator's lineage from its own specs and a real write (real Parquet files described
    as the Spark writer describes them); spark-submit itself is exercised by tests/spark."""
    from airflow_provider_exactly_once.core.precommit import WrittenColumn
    from airflow_provider_exactly_once.observability.lineage import write_lineage
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator

    landing = tmp_path / "landing"
    target = sql_target(world)
    operator = SparkPreCommitOperator(
        task_id="write", sink=world.iceberg_sink(), input={"kind": "files", "format": "parquet", "path": str(landing)}
    )
    pre = world.pipeline.write_iceberg(world.sink_id, 5, ["events"], rows=11, files=2)
    columns = [WrittenColumn(name="id", type="long", required=True), WrittenColumn(name="epoch", type="long")]
    pre = pre.model_copy(update={"tables": [pre.tables[0].model_copy(update={"schema_written": columns})]})

    lineage = write_lineage(operator.input_spec, target, pre)  # the target the task derives from the sink

    (source,) = lineage.inputs
    assert (source.namespace, source.name) == ("file", str(landing))
    (output,) = lineage.outputs
    assert output.namespace == "file"
    assert output.name == world.pipeline.catalog.load_table(world.table).location().removeprefix("file://")
    assert [(f.name, f.type) for f in output.facets["schema"].fields] == [("id", "long"), ("epoch", "long")]
    stats = output.outputFacets["outputStatistics"]
    assert (stats.rowCount, stats.fileCount) == (11, 2)
    assert stats.size == sum(d.file_size_in_bytes for d in pre.tables[0].data_files)
    # Before execute ran (or when it failed) there is no write: the input alone.
    assert operator.get_openlineage_facets_on_complete(None).outputs == []


def test_an_incremental_write_names_its_upstream_table_as_its_input(world: World) -> None:
    """The upstream is read by the writer's own tasks, not by a Spark table scan OpenLineage's Spark
    integration would see: the write's lineage names it, physically, with the catalog's name."""
    from airflow_provider_exactly_once.observability.lineage import write_lineage

    upstream = world.pipeline.create_table("bronze")
    target = sql_target(world)
    name = f"{world.pipeline.namespace}.bronze"
    (source,) = write_lineage({"kind": "iceberg_table", "table": name}, target, None).inputs
    assert (source.namespace, source.name) == ("file", upstream.location().removeprefix("file://"))
    (symlink,) = source.facets["symlinks"].identifiers
    assert (symlink.name, symlink.type) == (name, "TABLE") and world.iceberg_conn_id in symlink.namespace


def test_lineage_falls_back_to_the_catalog_name_when_the_table_cannot_be_loaded(world: World) -> None:
    from airflow_provider_exactly_once.observability.lineage import output_datasets

    pre = world.pipeline.write_iceberg(world.sink_id, 6, ["events"], rows=3)

    def unreachable(table: str) -> Any:
        raise ConnectionError("catalog down")

    (output,) = output_datasets("lake", pre, unreachable)

    assert (output.namespace, output.name) == ("iceberg://lake", world.table)
    assert "schema" not in output.facets  # neither the write nor the table said which columns
    assert output.outputFacets["outputStatistics"].rowCount == 3


def test_an_epoch_committed_by_the_recovery_dag_emits_its_event_once(world: World, unique: str) -> None:
    from airflow_provider_exactly_once.recovery.dag import recovery_dag
    from tests.recovery.helpers import E1, GRACE, leave_crash

    left = leave_crash(world, world.iceberg_sink())  # E1: Pending, its checkpoint COMPLETED
    dag = recovery_dag(f"eo_recovery_{unique}", schedule=None, meta_conn_id=world.meta_conn_id, orphan_grace=GRACE)
    uri = iceberg_asset_uri(world.iceberg_conn_id, world.table)

    first = run(dag, None)
    second = run(dag, None)  # nothing left to recover: no event

    assert str(first.state) == "success" and str(second.state) == "success"
    row = world.pipeline.store.get(world.sink_id, E1)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.committed is not None
    assert row.write_id == left.pending_completed.write_id
    assert [e["extra"] for e in asset_events(uri)] == [
        {
            "sink_id": world.sink_id,
            "epoch": E1,
            "write_id": row.write_id,
            "snapshot_id": row.committed[world.table],
            "revision": 0,
            # the recovery's own run is not the epoch's: it says who committed, nothing more
            "run": {
                "committed_by": "recovery",
                "run_type": None,
                "clear_number": 0,
                "triggering_user": None,
                "try_number": None,
            },
        }
    ]
