"""An upsert sink's task group: it says at parse time that its epochs must run one at a time, and in
real DAG runs (``dag.test()``) it writes an epoch again when its commit met another writer's change."""

from __future__ import annotations

import datetime as dt
import uuid
import warnings
from typing import Any

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.epochs import (
    AbortCause,
    CheckpointStatus,
    EpochStatus,
    epoch_from_interval_start,
    new_write_id,
)
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.runtime.assembly import run_epoch
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from tests.support.airflow_world import World, clear_and_resume, run, ti_states, xcom
from tests.support.upsert_writer import KEYED, Changes, write_upsert

UPSERT = IcebergSinkConfig("cdc", ("ns.accounts",), upsert=UpsertSpec(key=("id",)))
APPEND = IcebergSinkConfig("events", ("ns.events",))


def build(sink: IcebergSinkConfig, **dag_kwargs: object) -> None:
    with DAG(f"d_{sink.sink_id}", schedule=None, start_date=dt.datetime(2024, 1, 1), **dag_kwargs):  # type: ignore[arg-type]
        write = PythonOperator(task_id="write", python_callable=lambda: None)
        exactly_once_epoch(write, sink=sink, checkpoint=MarkerFileCheckpoint(path_template="/x/{epoch}"))


def test_an_upsert_dag_running_several_epochs_at_once_is_warned_about() -> None:
    with pytest.warns(UserWarning, match=r"sink 'cdc' is an upsert sink.*runs up to 3 epochs.*max_active_runs=1"):
        build(UPSERT, max_active_runs=3)


@pytest.mark.parametrize(("sink", "runs"), [(UPSERT, 1), (APPEND, 3)])
def test_one_epoch_at_a_time_or_an_append_sink_is_not(sink: IcebergSinkConfig, runs: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build(sink, max_active_runs=runs)


# -- the rewrite after an upsert conflict, in real DAG runs ------------------------------------------

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
G = "eo"


def keyed_dag(
    world: World,
    changes_by_epoch: dict[int, Changes],
    *,
    compact_after_write: set[int],
    rewrites: int,
    compact_before_commit: bool = False,
) -> DAG:
    """write -> epoch group of an upsert sink on a keyed table; the write of an epoch in
    ``compact_after_write`` is followed, once, by another writer's compaction: at once (persist
    meets it), or with ``compact_before_commit`` between the wait and the commit (the commit does)."""
    table = f"{world.pipeline.namespace}.accounts"
    world.pipeline.catalog.create_table(table, schema=KEYED)
    sink = IcebergSinkConfig(
        world.sink_id, (table,), iceberg_conn_id=world.iceberg_conn_id, upsert=UpsertSpec(key=("id",))
    )

    def write(**context: Any) -> Any:
        epoch = run_epoch(context, world.sink_id, world.meta_conn_id)
        pre = write_upsert(world.pipeline.catalog, table, world.sink_id, epoch, changes_by_epoch[epoch], new_write_id())
        world.writes.append(pre)
        if not compact_before_commit:
            compact(epoch)
        return pre.model_dump(mode="json")

    def compact(epoch: int) -> None:
        if epoch in compact_after_write:
            compact_after_write.discard(epoch)
            loaded = world.pipeline.catalog.load_table(table)
            loaded.overwrite(loaded.scan().to_arrow())  # another engine's compaction, after the write read

    with DAG(
        f"eo_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
    ) as dag:
        exactly_once_epoch(
            PythonOperator(task_id="write", python_callable=write),
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            commit_retries=1,
            commit_retry_delay=dt.timedelta(0),
            rewrites=rewrites,
        )
        if compact_before_commit:
            compactor = PythonOperator(
                task_id="compaction",
                python_callable=lambda **context: compact(run_epoch(context, world.sink_id, world.meta_conn_id)),
            )
            dag.task_dict[f"{G}.wait_for_checkpoint"] >> compactor >> dag.task_dict[f"{G}.commit"]
    return dag


def shown(world: World) -> dict[int, str]:
    table = world.pipeline.catalog.load_table(f"{world.pipeline.namespace}.accounts")
    return {r["id"]: r["value"] for r in table.scan().to_arrow().to_pylist()}


@pytest.mark.parametrize("met_by", ["persist", "commit"])
def test_a_write_that_meets_a_compaction_is_written_again_and_the_run_succeeds(world: World, met_by: str) -> None:
    first, second = epoch_from_interval_start(DAY - dt.timedelta(days=1)), epoch_from_interval_start(DAY)
    for epoch in (first, second):
        world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = keyed_dag(
        world,
        {first: {k: "v0" for k in range(6)}, second: {1: "v1", 2: None, 9: "new"}},
        compact_after_write={second},
        rewrites=2,
        compact_before_commit=met_by == "commit",
    )
    assert run(dag, DAY - dt.timedelta(days=1)).state == "success"

    dr = run(dag, DAY)

    assert dr.state == "success"
    states = {task: state for task, (state, _) in ti_states(dag.dag_id, dr.run_id).items()}
    assert states[f"{G}.{met_by}"] == "failed", "the conflict shows where it was met"
    assert states[f"{G}.commit"] == ("upstream_failed" if met_by == "persist" else "failed")
    assert [states[f"{G}.{t}"] for t in ("rewrite_1", "persist_1", "wait_1", "commit_1")] == ["success"] * 4
    assert [states[f"{G}.{t}"] for t in ("rewrite_2", "persist_2", "wait_2", "commit_2")] == ["skipped"] * 4
    assert shown(world) == {0: "v0", 1: "v1", 3: "v0", 4: "v0", 5: "v0", 9: "new"}
    row = world.pipeline.store.get(world.sink_id, second)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == world.writes[-1].write_id
    assert xcom(dag.dag_id, dr.run_id, f"{G}.commit_1")["outcome"] == "committed"
    assert [len(ids) for ids in world.pipeline.marker_snapshots("accounts", world.sink_id).values()] == [1, 1]


def test_without_rewrites_the_conflict_fails_the_run_and_clearing_it_writes_again(world: World) -> None:
    first, second = epoch_from_interval_start(DAY - dt.timedelta(days=1)), epoch_from_interval_start(DAY)
    for epoch in (first, second):
        world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = keyed_dag(
        world, {first: {k: "v0" for k in range(3)}, second: {1: None}}, compact_after_write={second}, rewrites=0
    )
    assert run(dag, DAY - dt.timedelta(days=1)).state == "success"

    dr = run(dag, DAY)

    assert dr.state == "failed"
    assert not any(task.startswith(f"{G}.rewrite") for task in dag.task_dict)
    row = world.pipeline.store.get(world.sink_id, second)
    assert row is not None and row.status is EpochStatus.ABORTED and row.abort_cause is AbortCause.UPSERT_CONFLICT
    assert shown(world) == {0: "v0", 1: "v0", 2: "v0"}

    tasks = ["write", *(f"{G}.{t}" for t in ("persist", "wait_for_checkpoint", "commit", "abort"))]
    assert clear_and_resume(dag, dr.run_id, tasks).state == "success"
    assert shown(world) == {0: "v0", 2: "v0"}


def test_a_write_that_forbids_nesting_is_refused_at_parse_time_unless_rewrites_are_off() -> None:
    with DAG("d_nested", schedule=None, start_date=dt.datetime(2024, 1, 1), max_active_runs=1):
        write = PythonOperator(task_id="write", python_callable=lambda: None, allow_nested_operators=False)
        with pytest.raises(InvalidSinkConfig, match=r"allow_nested_operators=False.*rewrites=0"):
            exactly_once_epoch(write, sink=UPSERT, checkpoint=MarkerFileCheckpoint(path_template="/x/{epoch}"))
        exactly_once_epoch(
            write, sink=UPSERT, checkpoint=MarkerFileCheckpoint(path_template="/x/{epoch}"), rewrites=0, group_id="g0"
        )


def test_an_incremental_dag_running_several_epochs_at_once_is_warned_about() -> None:
    from airflow_provider_exactly_once.checkpoints.config import SnapshotRangeCheckpoint
    from airflow_provider_exactly_once.spark.author_specs import IcebergTableInput
    from airflow_provider_exactly_once.task_groups import SparkWrite

    def incremental(runs: int) -> None:
        with DAG(f"d_inc_{runs}", schedule=None, start_date=dt.datetime(2024, 1, 1), max_active_runs=runs):
            exactly_once_epoch(
                SparkWrite(IcebergTableInput(table="bronze.events")),
                sink=APPEND,
                checkpoint=SnapshotRangeCheckpoint(),
            )

    with pytest.warns(UserWarning, match=r"reads an upstream table incrementally.*up to 2 epochs.*max_active_runs=1"):
        incremental(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        incremental(1)
