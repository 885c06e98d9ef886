"""A run that will never finish is named (issue 55): an unsettled epoch whose DAG run Airflow's
metadata database still has ``running`` with no live task for longer than ``[exactly_once]
stale_run_minutes`` (``operations.stale_runs``).

Real meta stores (SQLite and PostgreSQL) and a real Airflow metadata database (the session's, made
by ``airflow_home``), its runs and task instances made through Airflow's ORM as a killed ``airflow
dags test`` or a lost worker leaves them; the epochs backdated in the meta store as if written
hours ago (the threshold is an hour).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.upserts import ChangeCounts
from airflow_provider_exactly_once.operations import SinkOperations, stale_runs
from airflow_provider_exactly_once.operations.views import RESERVED
from airflow_provider_exactly_once.runtime.run_epochs import reserved_range
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.operations.helpers import (
    SILVER_DAG,
    UPSTREAM,
    Task,
    age_rows,
    airflow_run,
    coordinator,
    incremental,
    persist_range,
    register,
    reserve,
    write,
)
from tests.recovery.helpers import E0, E1, E2, E3, E4, E5
from tests.support.airflow_world import TABLE, World

HOUR = timedelta(hours=1)
E6 = E5 + 3_600_000
HOURS_AGO = datetime.now(UTC) - 3 * HOUR


class Runs:
    """The runs of one test's world, unique to it (Airflow's database is the session's)."""

    def __init__(self, world: World) -> None:
        tag = world.sink_id
        self.killed = f"manual__killed-{tag}"  # the incremental epoch's run: its write died 3 h ago
        self.lost = f"manual__lost-{tag}"  # an append epoch's: its commit's worker was lost
        self.upsert = f"manual__upsert-{tag}"  # an upsert epoch's: its commit's worker was lost
        self.waiting = f"manual__waiting-{tag}"  # an upsert epoch's: lost while its sensor waited
        self.deferred = f"manual__deferred-{tag}"  # alive: its sensor waits on a trigger
        self.beating = f"manual__beating-{tag}"  # alive: its task heartbeats
        self.done = f"manual__done-{tag}"  # finished: Airflow failed it already
        self.fresh = f"manual__fresh-{tag}"  # dead, but its epoch was written a moment ago


def stuck_world(world: World) -> Runs:
    """The world's incremental sink with an epoch reserved by a killed run, and a second sink
    (``appends``) whose Pending epochs' runs are lost, alive or done."""
    runs = Runs(world)
    incremental(world)
    store = world.pipeline.store
    persist_range(world, E1, reserve(world, E1, 100, f"run-{E1}"), f"run-{E1}")
    store.checkpoints.set_checkpoint(world.sink_id, E1, CheckpointStatus.COMPLETED)
    coordinator(world).commit(world.sink_id, E1)
    reserve(world, E2, 200, runs.killed)
    age_rows(store, world.sink_id, E2, 3 * HOUR)
    killed = [
        Task("exactly_once_orders.write", "running", HOURS_AGO),
        Task("exactly_once_orders.persist", None, HOURS_AGO),
    ]
    airflow_run(SILVER_DAG, runs.killed, "running", killed)

    sink_id = appends(world)
    register(world, IcebergSinkConfig(sink_id, (world.table,), iceberg_conn_id=world.iceberg_conn_id))
    appending = world.pipeline.coordinator(sink_id, world.pipeline.iceberg_committer())

    def persist(epoch: int, run_id: str, *, upsert: bool = False, aged: bool = True) -> None:
        pre = world.pipeline.write_iceberg(sink_id, epoch, [TABLE])
        if upsert:
            pre = pre.model_copy(
                update={"tables": [pre.tables[0].model_copy(update={"changes": ChangeCounts(inserted=5)})]}
            )
        appending.persist(pre, run_id=run_id, try_number=1, dag_id=SILVER_DAG)
        if aged:
            age_rows(world.pipeline.store, sink_id, epoch, 3 * HOUR)

    persist(E0, runs.done)
    persist(E1, runs.fresh, aged=False)
    persist(E2, runs.upsert, upsert=True)
    store.checkpoints.set_checkpoint(sink_id, E2, CheckpointStatus.COMPLETED)
    persist(E6, runs.waiting, upsert=True)
    persist(E3, runs.deferred)
    persist(E4, runs.beating)
    persist(E5, runs.lost)
    airflow_run(SILVER_DAG, runs.lost, "running", [Task("commit", "running", datetime.now(UTC) - 2 * HOUR)])
    airflow_run(SILVER_DAG, runs.upsert, "running", [Task("commit", "running", HOURS_AGO)])
    airflow_run(SILVER_DAG, runs.waiting, "running", [Task("wait_for_checkpoint", "running", HOURS_AGO)])
    airflow_run(SILVER_DAG, runs.deferred, "running", [Task("wait_for_checkpoint", "deferred", HOURS_AGO)])
    beating = [Task("write", "success", HOURS_AGO), Task("commit", "running", datetime.now(UTC) - timedelta(minutes=2))]
    airflow_run(SILVER_DAG, runs.beating, "running", beating)
    airflow_run(SILVER_DAG, runs.done, "failed", [Task("commit", "failed", HOURS_AGO)])
    airflow_run(SILVER_DAG, runs.fresh, "running", [Task("commit", "running", HOURS_AGO)])
    return runs


def appends(world: World) -> str:
    """The world's second sink, whose epochs append."""
    return f"{world.sink_id}-appends"


def test_a_killed_run_and_a_lost_worker_are_named_and_live_runs_are_not(world: World, airflow_home: Path) -> None:
    runs = stuck_world(world)
    ops = SinkOperations(world.pipeline.store)
    check = stale_runs.check(ops, HOUR)
    assert check.not_checked is None
    found = {(s.sink_id, s.epoch): s for s in check.stale if s.sink_id in (world.sink_id, appends(world))}
    assert sorted(found) == sorted(
        [(world.sink_id, E2), (appends(world), E2), (appends(world), E5), (appends(world), E6)]
    )

    killed = found[(world.sink_id, E2)]
    assert (killed.status, killed.dag_id, killed.run_id, killed.run_state) == (
        RESERVED,
        SILVER_DAG,
        runs.killed,
        "running",
    )
    assert killed.last_activity is not None and killed.idle_seconds > 2.9 * 3600
    assert (
        killed.holds_back is not None
        and "its range (bronze.orders: after snapshot 100 to snapshot 200)" in killed.holds_back
    )
    assert killed.then == f"eo-sink abort {world.sink_id} {E2} --reason 'run {runs.killed} will never finish'"
    said = killed.model_dump(mode="json", context={"base_url": "http://airflow:8080"})
    assert said["fail_run"] == {
        "ui": "Mark as failed",
        "method": "PATCH",
        "url": f"http://airflow:8080/api/v2/dags/{SILVER_DAG}/dagRuns/{runs.killed.replace(':', '%3A')}",
        "body": {"state": "failed"},
    }
    assert said["then"] == killed.then and "Mark as failed" in said["advice"]

    lost = found[(appends(world), E5)]
    assert (lost.status, lost.run_id, lost.holds_back, lost.then) == ("Pending", runs.lost, None, None)
    upsert = found[(appends(world), E2)]
    assert upsert.holds_back == "upsert epochs commit in epoch order and the sink's later epochs wait for it"
    # its write is persisted and its checkpoint completed: committed, not aborted (nor forced)
    assert upsert.then == f"eo-sink commit {appends(world)} {E2}"
    waiting = found[(appends(world), E6)]  # its checkpoint not completed: aborted
    assert waiting.then == f"eo-sink abort {appends(world)} {E6} --reason 'run {runs.waiting} will never finish'"

    # one sink only, and only the DAGs a user may read
    assert [(s.sink_id, s.epoch) for s in stale_runs.check(ops, HOUR, sink_id=world.sink_id).stale] == [
        (world.sink_id, E2)
    ]
    assert stale_runs.check(ops, HOUR, sink_id=world.sink_id, dag_ids={"another_dag"}).stale == ()
    # a longer threshold: three hours of silence is not yet too long
    assert stale_runs.check(ops, 4 * HOUR, sink_id=appends(world)).stale == ()


def test_a_reserved_epoch_whose_dag_nothing_names_is_found_by_its_run(world: World, airflow_home: Path) -> None:
    """The first epoch of an incremental sink, its run killed while it wrote: no row, no failure,
    no epoch before it names the DAG; Airflow's one running run of that id does."""
    sink_id, run_id = world.sink_id, f"manual__first-{world.sink_id}"
    reserved_range(world.pipeline.store, sink_id, E3, UPSTREAM, lambda: 100, run_id=run_id)
    age_rows(world.pipeline.store, sink_id, E3, 2 * HOUR)
    airflow_run("bronze_to_silver", run_id, "running", [Task("write", "running", HOURS_AGO)])
    ops = SinkOperations(world.pipeline.store)
    assert ops.epoch(sink_id, E3).dag_id is None
    [stale] = stale_runs.check(ops, HOUR, sink_id=sink_id).stale
    assert (stale.epoch, stale.dag_id, stale.run_id, stale.status) == (E3, "bronze_to_silver", run_id, RESERVED)


def test_no_candidate_asks_airflow_nothing(world: World) -> None:
    """Epochs younger than the threshold are no candidates: Airflow is not asked at all."""
    coordinator(world).persist(write(world, E4), run_id="manual__young", try_number=1, dag_id=SILVER_DAG)
    check = stale_runs.check(SinkOperations(world.pipeline.store), HOUR, sink_id=world.sink_id)
    assert (check.stale, check.not_checked) == ((), None)


@pytest.mark.parametrize(("value", "minutes"), [(None, 60.0), ("", 60.0), ("90", 90.0), (" 0.5 ", 0.5)])
def test_the_threshold_option(value: str | None, minutes: float) -> None:
    assert stale_runs.threshold_of(value) == timedelta(minutes=minutes)


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_a_threshold_that_is_no_duration_is_refused_by_name(value: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=rf"\[exactly_once\] stale_run_minutes = '{value}': give a number"):
        stale_runs.threshold_of(value)
