"""Pipelines on a running cluster: land their input, create their table and DAG, watch their runs,
run the recovery DAG and check the result (``checker.check``).

Nothing here imports Airflow (see ``cluster``): DAG runs are read from Airflow's metadata database
and driven through the CLI; the Iceberg table is read with pyiceberg directly.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once.demo.world import land_hour, mark_hour
from fault_harness.checker import CheckResult, check, epoch_of
from fault_harness.cluster import FINAL_ORPHAN_GRACE_S, ICEBERG_CONN_ID, RECOVERY_DAG_ID, Cluster

NAMESPACE = "faults"
START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
TERMINAL = {"success", "failed"}
EVENT_SCHEMA = Schema(
    NestedField(1, "event_id", StringType()),
    NestedField(2, "user_id", LongType()),
    NestedField(3, "event_type", StringType()),
    NestedField(4, "event_time", TimestamptzType()),
    NestedField(5, "amount", DoubleType()),
)


@dataclass
class Pipeline:
    """One scenario's pipeline: its own DAG, sink, table and landing directory."""

    name: str
    epochs: int
    landing: Path
    writer: str = "light"
    sensor: str = "poke"
    rows: int = 12
    failed_hours: frozenset[int] = frozenset()
    late_hours: frozenset[int] = frozenset()
    max_active_runs: int = 3
    hours: list[dt.datetime] = field(default_factory=list)

    @property
    def dag_id(self) -> str:
        return f"eo_faults_{self.name}"

    @property
    def sink_id(self) -> str:
        return f"faults-{self.name.replace('_', '-')}"

    @property
    def table(self) -> str:
        return f"{NAMESPACE}.{self.name}"

    def epoch(self, n: int) -> int:
        return epoch_of(self.hours[n])


class Harness:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: When the last ``collect_orphans`` started: the orphan check's clock.
        self.orphans_collected_at: float | None = None
        props = cluster.catalog_properties
        self.catalog = SqlCatalog(ICEBERG_CONN_ID, uri=props["uri"], warehouse=props["warehouse"])
        self.catalog.create_namespace_if_not_exists(NAMESPACE)

    # -- setting up ----------------------------------------------------------------------------------

    def add(self, pipeline: Pipeline, *, start_dag: bool = True) -> Pipeline:
        """Land the input (markers for every hour not in ``late_hours``), create the table and the DAG."""
        pipeline.landing.mkdir(parents=True, exist_ok=True)
        pipeline.hours = [START + dt.timedelta(hours=n) for n in range(pipeline.epochs)]
        for n, hour in enumerate(pipeline.hours):
            land_hour(pipeline.landing, hour, pipeline.rows, files=2, seed=n)
            if n not in pipeline.late_hours:
                mark_hour(pipeline.landing, hour, completed=n not in pipeline.failed_hours)
        self.catalog.create_table_if_not_exists(pipeline.table, EVENT_SCHEMA)
        if start_dag:
            self.start_dag(pipeline)
        return pipeline

    def start_dag(self, pipeline: Pipeline, *, wait: bool = True) -> None:
        params = {
            "dag_id": pipeline.dag_id,
            "sink_id": pipeline.sink_id,
            "table": pipeline.table,
            "landing": str(pipeline.landing),
            "start": START.isoformat(),
            "epochs": pipeline.epochs,
            "writer": pipeline.writer,
            "sensor": pipeline.sensor,
            "conn_id": ICEBERG_CONN_ID,
            "max_active_runs": pipeline.max_active_runs,
        }
        pipelines = self.cluster.root / "pipelines"
        tmp = pipelines / f".{pipeline.dag_id}.tmp"
        tmp.write_text(json.dumps(params), encoding="utf-8")
        tmp.replace(pipelines / f"{pipeline.dag_id}.json")
        if wait:
            self.cluster.wait_for_dag(pipeline.dag_id)

    def settle_late(self, pipeline: Pipeline) -> None:
        """The upstream finishes the late hours: ``_SUCCESS``, or ``_FAILED`` for the failed ones."""
        for n in sorted(pipeline.late_hours):
            mark_hour(pipeline.landing, pipeline.hours[n], completed=n not in pipeline.failed_hours)

    # -- watching --------------------------------------------------------------------------------------

    def runs(self, pipeline: Pipeline) -> dict[str, str]:
        return {str(r.run_id): str(r.state) for r in self.cluster.dag_runs(pipeline.dag_id)}

    def finished(self, pipeline: Pipeline) -> bool:
        rows = self.cluster.dag_runs(pipeline.dag_id)
        starts = {r.data_interval_start for r in rows}
        return len(starts) >= pipeline.epochs and all(str(r.state) in TERMINAL for r in rows)

    def wait_until(self, what: str, predicate: Any, timeout: float, poll: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(poll)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s (cluster logs in {self.cluster.root / 'logs'})")

    def wait_finished(self, pipeline: Pipeline, timeout: float = 600) -> dict[str, str]:
        self.wait_until(f"every run of {pipeline.dag_id} finished", lambda: self.finished(pipeline), timeout)
        return self.runs(pipeline)

    def running_task(self, pipeline: Pipeline, task_id: str, states: tuple[str, ...] = ("running",)) -> Any:
        for ti in self.cluster.task_instances(pipeline.dag_id, task_id):
            if str(ti.state) in states:
                return ti
        return None

    # -- recovery and the verdict ------------------------------------------------------------------------

    def run_recovery(self, timeout: float = 300) -> str:
        """Trigger the recovery DAG and wait for its run; returns the run's final state."""
        run_id = f"faults__{time.time_ns()}"
        self.cluster.airflow("dags", "trigger", RECOVERY_DAG_ID, "--run-id", run_id)

        def state() -> str:
            rows = self.cluster.query(
                "select state from dag_run where dag_id = :d and run_id = :r", d=RECOVERY_DAG_ID, r=run_id
            )
            return str(rows[0].state) if rows else "none"

        self.wait_until(f"recovery run {run_id}", lambda: state() in TERMINAL, timeout)
        return state()

    def load_table(self, pipeline: Pipeline) -> Table:
        return self.catalog.load_table(pipeline.table)

    def collect_orphans(self) -> dict[str, Any]:
        """What an operator runs once every run has ended: ``eo-sink gc --grace`` over every sink,
        with the short final grace that ``check`` judges by.

        Safe with a short grace only then: no finished write is still waiting for its persist.
        """
        self.orphans_collected_at = time.time()
        return dict(json.loads(self.cluster.eo_sink("gc", "--grace", f"{FINAL_ORPHAN_GRACE_S}s", "--json")))

    def check(self, pipeline: Pipeline) -> CheckResult:
        # An unreferenced file older than the final grace when the last collection started is one it
        # should have removed (a file a lingering Spark driver wrote later is not).
        return check(
            self.load_table(pipeline),
            pipeline.landing,
            pipeline.sink_id,
            orphan_grace_s=FINAL_ORPHAN_GRACE_S,
            now=self.orphans_collected_at,
        )

    def dispose(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
