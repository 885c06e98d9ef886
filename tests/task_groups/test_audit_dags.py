"""Write, audit, publish in real DAG runs (``dag.test()``, design.md D23): a day whose check fails
leaves ``main`` untouched, as a reader sampling it during the run sees, and a reprocess that fixes
it publishes the epoch exactly once."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from typing import Any

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, task

from airflow_provider_exactly_once.core.epochs import (
    CheckpointStatus,
    EpochEvent,
    EpochStatus,
    epoch_from_interval_start,
)
from airflow_provider_exactly_once.sinks.config import EngineName, SqlCheck
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from tests.support.airflow_world import World, clear_and_resume, run, ti_states, xcom

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
G = "eo"


def audited_dag(world: World, audit: Any, *, rows: int = 5) -> DAG:
    with DAG(
        f"eo_audit_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        write = PythonOperator(task_id="write", python_callable=world.writer(world.iceberg_sink(), rows=rows))
        exactly_once_epoch(
            write,
            sink=world.iceberg_sink(),
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=1,
            commit_retry_delay=dt.timedelta(0),
            audit=audit,
        )
    return dag


class MainSampler:
    """Reads ``main`` over and over while a run goes on: every write id it ever saw there."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> MainSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self._read()

    def _read(self) -> None:
        self.seen |= {write_id for _, _, write_id in self.world.rows()}


def test_a_failed_check_keeps_main_untouched_and_a_reprocess_publishes_once(world: World) -> None:
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    day: dict[str, Any] = {"bad": True, "audited": []}

    def audit(committed: Any) -> Any:
        @task(task_id="rows_are_good")
        def rows_are_good(audit: dict[str, Any]) -> None:
            table = world.pipeline.catalog.load_table(world.table)
            snapshot = int(audit["snapshots"][world.table])
            rows = table.scan(snapshot_id=snapshot).to_arrow()
            day["audited"].append((audit["write_id"], rows.num_rows))
            if day["bad"]:
                raise ValueError(f"{rows.num_rows} rows, and the day is bad")

        return rows_are_good(committed)

    dag = audited_dag(world, audit)
    with MainSampler(world) as sampler:
        dr = run(dag, DAY)
    assert dr.state == "failed"
    states = ti_states(dag.dag_id, dr.run_id)
    assert states[f"{G}.audit_commit"][0] == "success" and states[f"{G}.rows_are_good"][0] == "failed"
    assert states[f"{G}.publish"][0] == "upstream_failed" and states[f"{G}.abort"][0] == "skipped"
    bad = world.writes[-1].write_id
    assert sampler.seen == set() and world.rows() == []  # main's readers never saw the bad day
    assert day["audited"] == [(bad, 5)]  # the audit read exactly the epoch's audit snapshot
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.stage == "Audit failed" and row.status is EpochStatus.PENDING
    failed = [
        e for e in world.pipeline.store.history.events(world.sink_id, epoch) if e.event is EpochEvent.AUDIT_FAILED
    ]
    assert len(failed) == 1 and failed[0].reason is not None and "rows_are_good" in failed[0].reason
    assert "the day is bad" in failed[0].reason

    day["bad"] = False  # fixed upstream; the run is reprocessed
    with MainSampler(world) as sampler:
        dr = clear_and_resume(dag, dr.run_id, list(dag.task_dict))
    assert dr.state == "success"
    good = world.writes[-1].write_id
    assert good != bad and sampler.seen <= {good}
    assert {write_id for _, _, write_id in world.rows()} == {good} and len(world.rows()) == 5
    assert world.markers() == {epoch: [good]}
    assert xcom(dag.dag_id, dr.run_id, f"{G}.publish")["outcome"] == "committed"
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.write_id == good


@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_built_in_sql_checks_name_what_failed(world: World, engine: EngineName) -> None:
    """Under either engine (Spark: a local session the task starts and stops), the same verdicts."""
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    positive = SqlCheck(name="ids_positive", sql="select id from epoch_rows where id < 0", engine=engine)
    checks = [
        positive,
        SqlCheck(
            name="five_rows",
            sql="select count(*) as n from epoch_rows having count(*) <> 5",
            message="not 5 rows",
            engine=engine,
        ),
        SqlCheck(name="first_id", sql=f"select * from epoch_rows where id = {epoch * 1_000_000}", engine=engine),
    ]
    dag = audited_dag(world, checks, rows=4)
    dr = run(dag, DAY)
    assert dr.state == "failed" and world.rows() == []
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.audit is not None and row.stage == "Audit failed"
    assert "five_rows: not 5 rows: 1 row(s), e.g. (n=4)" in row.audit.failing()
    # each value by its column (a select * is otherwise a tuple of unnamed values), strings quoted
    shown = f"(id={epoch * 1_000_000}, epoch={epoch}, write_id='{world.writes[-1].write_id}')"
    assert f"first_id: first_id failed: 1 row(s), e.g. {shown}" in row.audit.failing()
    assert "ids_positive" not in row.audit.failing()
    # the task's error, kept on the epoch, says what to do next
    assert row.error is not None and f"eo-sink reject {world.sink_id} {epoch}" in row.error, row.error
    # each check kept by its own name, the passed one too, and no entry of the task beside them
    assert [(c.name, c.passed) for c in row.audit.checks] == [
        ("ids_positive", True),
        ("five_rows", False),
        ("first_id", False),
    ]

    passing = audited_dag(world, [positive])
    world.pipeline.store.checkpoints.set_checkpoint(world.sink_id, epoch, CheckpointStatus.COMPLETED)
    dr = run(passing, DAY)
    assert dr.state == "success", ti_states(passing.dag_id, dr.run_id)
    assert len(world.rows()) == 5
    assert xcom(passing.dag_id, dr.run_id, f"{G}.audit_checks") == [
        {"name": "ids_positive", "passed": True, "message": ""}
    ]


def test_a_fan_out_epoch_is_held_from_both_tables_until_its_reprocess_passes(world: World) -> None:
    """The same for a fan-out epoch across two tables: neither table's ``main`` shows the bad day,
    and the reprocess publishes the good one to both."""
    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.runtime.assembly import run_epoch
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    world.pipeline.create_table("other")
    names = [world.table, f"{world.pipeline.namespace}.other"]
    sink = IcebergSinkConfig(world.sink_id, tuple(names), iceberg_conn_id=world.iceberg_conn_id)
    epoch = epoch_from_interval_start(DAY)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    day = {"rows": 3}
    written: list[PreCommit] = []

    def write(**context: Any) -> Any:
        pre = world.pipeline.write_iceberg(
            world.sink_id, run_epoch(context, world.sink_id, world.meta_conn_id), ["events", "other"], day["rows"]
        )
        written.append(pre)
        return pre.model_dump(mode="json")

    with DAG(
        f"eo_audit_{uuid.uuid4().hex[:10]}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        exactly_once_epoch(
            PythonOperator(task_id="write", python_callable=write),
            sink=sink,
            checkpoint=world.checkpoint(),
            meta_conn_id=world.meta_conn_id,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.2, "timeout": 30},
            commit_retries=1,
            commit_retry_delay=dt.timedelta(0),
            audit=[SqlCheck(name="four_rows", sql="select count(*) from events having count(*) <> 4")],
        )

    def main_write_ids() -> set[str]:
        return {r["write_id"] for name in ("events", "other") for r in world.pipeline.rows(name)}

    class Sampler(MainSampler):
        def _read(self) -> None:
            self.seen |= main_write_ids()

    with Sampler(world) as sampler:
        dr = run(dag, DAY)
    assert dr.state == "failed" and sampler.seen == set()
    row = world.pipeline.store.get(world.sink_id, epoch)
    assert row is not None and row.stage == "Audit failed" and row.audit is not None
    assert set(row.audit.snapshots) == set(names) and "four_rows" in row.audit.failing()

    day["rows"] = 4
    with Sampler(world) as sampler:
        dr = clear_and_resume(dag, dr.run_id, list(dag.task_dict))
    assert dr.state == "success"
    good = written[-1].write_id
    assert sampler.seen <= {good} and main_write_ids() == {good}
    for name in ("events", "other"):
        assert len(world.pipeline.rows(name)) == 4
        assert world.pipeline.marker_snapshots(name, world.sink_id) == {epoch: [good]}
