"""Pipelines on a running cluster: land their input (and land it anew, for reprocessing), create
their table and DAG, watch their runs, re-run them (CLI, backfill, REST API), run the recovery DAG
and check the result (``checker.check``).

Nothing here imports Airflow (see ``cluster``): DAG runs are read from Airflow's metadata database
and driven through the CLI or the api-server's public REST API; the Iceberg table is read with
pyiceberg directly.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once.store import SqlSinkStateStore
from demo.world import hour_dir, land_hour, mark_hour
from fault_harness.checker import CheckResult, check, check_fan_out
from fault_harness.cluster import FINAL_ORPHAN_GRACE_S, ICEBERG_CONN_ID, RECOVERY_DAG_ID, Cluster
from fault_harness.history_check import check_causes, check_history_rows
from fault_harness.incremental_checker import Produced, check_incremental
from fault_harness.landed import epoch_of
from fault_harness.table_reads import FanOutReads
from fault_harness.upsert_changes import hour_changes, land_changes
from fault_harness.upsert_checker import check_upsert

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
#: The upsert pipeline's table: the same columns, keyed by ``event_id`` (required, the identifier field).
KEYED_EVENT_SCHEMA = Schema(
    NestedField(1, "event_id", StringType(), required=True),
    *EVENT_SCHEMA.fields[1:],
    identifier_field_ids=[1],
)


@dataclass
class Pipeline:
    """One scenario's pipeline: its own DAG, sink, table and landing directory."""

    name: str
    epochs: int
    landing: Path
    writer: str = "light"
    #: ``Scenario.write_pause_s``.
    write_pause_s: float = 0.0
    sensor: str = "poke"
    rows: int = 12
    failed_hours: frozenset[int] = frozenset()
    late_hours: frozenset[int] = frozenset()
    max_active_runs: int = 3
    #: The Iceberg connection its DAG writes through (another than the cluster's main one: a proxy).
    conn_id: str = ICEBERG_CONN_ID
    #: ``append``, ``upsert``: hours of changes by key into a keyed table (``upsert_pipeline``), or
    #: ``incremental``: the rows appended to the table ``upstream`` (``incremental_pipeline``).
    mode: str = "append"
    #: ``Scenario.tables``: more than one, a fan-out (``table_names``).
    tables: int = 1
    #: ``Scenario.audited`` and ``Scenario.bad_hours``: write, audit, publish, and the hours whose audit fails.
    audited: bool = False
    bad_hours: frozenset[int] = frozenset()
    hours: list[dt.datetime] = field(default_factory=list)
    #: Per epoch index: how often a committed epoch was reprocessed for sure (each adds one marked
    #: snapshot, a revision) and how often it may have been (a backfill racing the scheduled runs).
    reprocessed: Counter[int] = field(default_factory=Counter)
    maybe_reprocessed: Counter[int] = field(default_factory=Counter)
    #: Epoch indexes seen committed (a run of theirs succeeded): a later re-run of them is a revision.
    committed: set[int] = field(default_factory=set)
    #: An incremental pipeline's producer's record (``incremental.produce_upstream``), once it has stopped.
    produced: Produced | None = None

    @property
    def history(self) -> Path:
        """Where the hours' earlier inputs are kept when an hour is landed anew (``checker``)."""
        return self.landing.parent.parent / "landing-history" / self.landing.name

    def commits(self) -> dict[int, tuple[int, int]]:
        """Per epoch (ms): the least and most marked snapshots its table may hold (``checker.check``)."""
        return {
            self.epoch(n): (1 + self.reprocessed[n], 1 + self.reprocessed[n] + self.maybe_reprocessed[n])
            for n in range(len(self.hours))
        }

    @property
    def dag_id(self) -> str:
        return f"eo_faults_{self.name}"

    @property
    def sink_id(self) -> str:
        return f"faults-{self.name.replace('_', '-')}"

    @property
    def table(self) -> str:
        return f"{NAMESPACE}.{self.name}"

    @property
    def table_names(self) -> list[str]:
        """Every table of the sink: ``table`` first, then a fan-out's others."""
        return [self.table, *(f"{self.table}_{n}" for n in range(2, self.tables + 1))]

    @property
    def upstream(self) -> str:
        """An incremental pipeline's upstream table, beside its sink's (same catalog)."""
        return f"{NAMESPACE}.{self.name}_upstream"

    def epoch(self, n: int) -> int:
        return epoch_of(self.hours[n])


class Harness:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: When the last ``collect_orphans`` started: the orphan check's clock.
        self.orphans_collected_at: float | None = None
        # The connection's own properties, as IcebergHook loads them: a SQL catalog, or the REST one.
        self.catalog = load_catalog(ICEBERG_CONN_ID, **cluster.catalog_properties)
        self.catalog.create_namespace_if_not_exists(NAMESPACE)
        #: The fault plan's rules; ``arm`` adds to them while runs go (the file is rewritten whole).
        self.plan: list[dict[str, Any]] = []
        self._plan_lock = threading.Lock()
        self._api_token: str | None = None

    # -- the fault plan --------------------------------------------------------------------------------

    def arm(self, rules: Iterable[Mapping[str, Any]]) -> None:
        """Add rules to the fault plan every task try reads (``demo/fault_plan.py``), atomically."""
        with self._plan_lock:
            self.plan.extend(dict(r) for r in rules)
            self.cluster.write_plan(self.plan)

    # -- setting up ----------------------------------------------------------------------------------

    def add(self, pipeline: Pipeline, *, start_dag: bool = True) -> Pipeline:
        """Land the input (markers for every hour not in ``late_hours``), create the table and the DAG."""
        pipeline.landing.mkdir(parents=True, exist_ok=True)
        pipeline.hours = [START + dt.timedelta(hours=n) for n in range(pipeline.epochs)]
        for n, hour in enumerate(pipeline.hours):
            if pipeline.mode == "incremental":
                continue  # its input is the upstream table, appended to while it runs
            if pipeline.mode == "upsert":
                land_changes(pipeline.landing, hour, hour_changes(pipeline.name, n, hour))
            else:
                land_hour(pipeline.landing, hour, pipeline.rows, files=2, seed=n)
            if n not in pipeline.late_hours:
                mark_hour(pipeline.landing, hour, completed=n not in pipeline.failed_hours)
        schema = KEYED_EVENT_SCHEMA if pipeline.mode == "upsert" else EVENT_SCHEMA
        for name in pipeline.table_names:
            self.catalog.create_table_if_not_exists(name, schema)
        if pipeline.mode == "incremental":
            # Merging manifests on append, as Java's default append does: the producer's hundreds of
            # snapshots then list a bounded number of manifests.
            self.catalog.create_table_if_not_exists(
                pipeline.upstream, EVENT_SCHEMA, properties={"commit.manifest-merge.enabled": "true"}
            )
        if start_dag:
            self.start_dag(pipeline)
        return pipeline

    def start_dag(self, pipeline: Pipeline, *, wait: bool = True) -> None:
        """Write the pipeline's DAG parameters where the cluster's DAG file finds them; a pipeline
        writing through Spark Connect first starts the stack's server (``stacks``)."""
        if pipeline.writer == "connect":
            self.cluster.start("spark-connect")
        params = {
            "dag_id": pipeline.dag_id,
            "sink_id": pipeline.sink_id,
            "tables": pipeline.table_names,
            "landing": str(pipeline.landing),
            "start": START.isoformat(),
            "epochs": pipeline.epochs,
            "writer": pipeline.writer,
            "write_pause_s": pipeline.write_pause_s,
            "sensor": pipeline.sensor,
            "conn_id": pipeline.conn_id,
            "max_active_runs": pipeline.max_active_runs,
            "mode": pipeline.mode,
            "upstream": pipeline.upstream,
            "audited": pipeline.audited,
            "bad_epochs": [pipeline.epoch(n) for n in sorted(pipeline.bad_hours)],
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

    def reland(
        self, pipeline: Pipeline, n: int, *, change: bool = True, complete: bool = False, fail: bool = False
    ) -> str:
        """The upstream lands hour ``n`` anew (``reland_hour``); what changed, in words."""
        return reland_hour(
            pipeline.landing,
            pipeline.history,
            pipeline.hours[n],
            key=f"{pipeline.name}-{n}",
            change=change,
            complete=complete,
            fail=fail,
        )

    # -- re-running runs ---------------------------------------------------------------------------------

    def run_of(self, pipeline: Pipeline, n: int) -> Any:
        """The DAG run (row) of hour ``n``."""
        hour = pipeline.hours[n]
        for row in self.cluster.dag_runs(pipeline.dag_id):
            if row.data_interval_start is not None and row.data_interval_start.astimezone(dt.UTC) == hour:
                return row
        raise LookupError(f"{pipeline.dag_id}: no run for {hour.isoformat()}")

    def try_numbers(self, pipeline: Pipeline, n: int) -> dict[str, int]:
        """Per task of hour ``n``'s run: its try number now (a re-run's next try is one more)."""
        run_id = str(self.run_of(pipeline, n).run_id)
        return {
            str(ti.task_id): int(ti.try_number or 0)
            for ti in self.cluster.task_instances(pipeline.dag_id)
            if str(ti.run_id) == run_id
        }

    def clear_cli(self, pipeline: Pipeline, hours: Iterable[int] | None = None) -> str:
        """``airflow tasks clear -y DAG [-s HOUR -e HOUR]``: every run, or the runs of ``hours``."""
        if hours is None:
            return self.cluster.airflow("tasks", "clear", "-y", pipeline.dag_id)
        out = []
        for n in sorted(hours):
            at = pipeline.hours[n].isoformat()
            out.append(self.cluster.airflow("tasks", "clear", "-y", "-s", at, "-e", at, pipeline.dag_id))
        return "".join(out)

    def backfill(self, pipeline: Pipeline, first: int, last: int, *, reprocess: str) -> str:
        """``airflow backfill create`` over hours ``first``..``last`` (logical dates, inclusive)."""
        return self.cluster.airflow(
            "backfill",
            "create",
            "--dag-id",
            pipeline.dag_id,
            "--from-date",
            pipeline.hours[first].isoformat(),
            "--to-date",
            pipeline.hours[last].isoformat(),
            "--reprocess-behavior",
            reprocess,
        )

    def api(self, method: str, path: str, body: Mapping[str, Any] | None = None, *, auth: bool = True) -> Any:
        """A call to the api-server; JSON in, JSON out. Authenticated as the simple auth manager's
        ``admin`` with its generated password, through ``POST /auth/token``, as a user script would."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.api_token()}"
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.cluster.api_port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers=headers,
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:1000]
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {detail}") from None

    def api_token(self) -> str:
        if self._api_token is None:
            passwords = Path(self.cluster.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
            password = json.loads(passwords.read_text(encoding="utf-8"))["admin"]
            answer = self.api("POST", "/auth/token", {"username": "admin", "password": password}, auth=False)
            self._api_token = str(answer["access_token"])
        return self._api_token

    def clear_api(self, pipeline: Pipeline, n: int) -> dict[str, Any]:
        """Clear hour ``n``'s run through the public REST API (``POST /api/v2/dags/{dag_id}/clearTaskInstances``):
        every task, the run reset to queued. Returns the task instances cleared."""
        run_id = str(self.run_of(pipeline, n).run_id)
        answer = self.api(
            "POST",
            f"/api/v2/dags/{urllib.parse.quote(pipeline.dag_id)}/clearTaskInstances",
            {"dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True, "dry_run": False},
        )
        return dict(answer)

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
        """Trigger the recovery DAG and wait for its run, and for any other recovery run still going;
        returns the triggered run's final state."""
        run_id = f"faults__{time.time_ns()}"
        self.cluster.airflow("dags", "trigger", RECOVERY_DAG_ID, "--run-id", run_id)

        def state() -> str:
            rows = self.cluster.query(
                "select state from dag_run where dag_id = :d and run_id = :r", d=RECOVERY_DAG_ID, r=run_id
            )
            return str(rows[0].state) if rows else "none"

        self.wait_until(f"recovery run {run_id}", lambda: state() in TERMINAL, timeout)

        # A scheduler restart of the run started a recovery run of its own, over every registered sink:
        # until it ends, its tasks hold their sinks' locks, and the final collection would be refused.
        def others() -> int:
            rows = self.cluster.query(
                "select count(*) as n from dag_run where dag_id = :d and state not in ('success', 'failed')",
                d=RECOVERY_DAG_ID,
            )
            return int(rows[0].n)

        self.wait_until("every recovery run", lambda: others() == 0, timeout)
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

    def open_catalog(self) -> Catalog:
        """A catalog of the cluster's Iceberg connection of its own (a ``FanOutReader``'s)."""
        return load_catalog(ICEBERG_CONN_ID, **self.cluster.catalog_properties)

    def check(self, pipeline: Pipeline, reads: FanOutReads | None = None) -> CheckResult:
        """Every table of the pipeline judged on its own, and a fan-out's tables against each other
        (with what its reader saw while the runs went, ``reads``, judged where the catalog is a SQL
        catalog: one database transaction per fan-out); then the sink's epochs in the meta store,
        each row against its history (``history_check``). An incremental pipeline's table is judged
        against its upstream table instead (``incremental_checker``), and its committed snapshots
        against the meta store's chain."""
        store = SqlSinkStateStore(self.cluster.meta.url())
        try:
            if pipeline.mode == "incremental":
                result = self._check_incremental(pipeline, store)
            else:
                tables = {name: self.catalog.load_table(name) for name in pipeline.table_names}
                results = {name: self._check_table(pipeline, table) for name, table in tables.items()}
                result = (
                    check_fan_out(
                        tables, results, pipeline.sink_id, reads, judge_reads=isinstance(self.catalog, SqlCatalog)
                    )
                    if len(tables) > 1
                    else results[pipeline.table]
                )
            anomalies, result.history_rows_checked = check_history_rows(store, pipeline.sink_id)
            uncaused, result.causes_checked = check_causes(self.cluster.eo_sink, store, pipeline.sink_id)
            anomalies.extend(uncaused)
        finally:
            store.dispose()
        result.anomalies.extend(anomalies)
        return result

    def _check_incremental(self, pipeline: Pipeline, store: SqlSinkStateStore) -> CheckResult:
        chain = store.input_ranges.chain(pipeline.sink_id)
        epochs = [pipeline.epoch(n) for n in range(pipeline.epochs)]
        statuses = {epoch: status.value for epoch, status in chain.statuses.items()}
        for epoch in epochs:  # an epoch given up before it reserved a range has a row but no link
            row = store.get(pipeline.sink_id, epoch)
            if row is not None:
                statuses[epoch] = row.status.value
        return check_incremental(
            self.catalog.load_table(pipeline.table),
            self.catalog.load_table(pipeline.upstream),
            pipeline.sink_id,
            chain.links,
            statuses,
            epochs=epochs,
            aborted={pipeline.epoch(n) for n in pipeline.failed_hours},
            commits=pipeline.commits(),
            produced=pipeline.produced,
            orphan_grace_s=FINAL_ORPHAN_GRACE_S,
            now=self.orphans_collected_at,
            storage_options=self.cluster.stack.storage_options(),
        )

    def _check_table(self, pipeline: Pipeline, table: Table) -> CheckResult:
        # An unreferenced file older than the final grace when the last collection started is one it
        # should have removed (a file a lingering Spark driver wrote later is not).
        if pipeline.mode == "upsert":
            return check_upsert(
                table,
                pipeline.landing,
                pipeline.sink_id,
                orphan_grace_s=FINAL_ORPHAN_GRACE_S,
                now=self.orphans_collected_at,
                storage_options=self.cluster.stack.storage_options(),
            )
        return check(
            table,
            pipeline.landing,
            pipeline.sink_id,
            orphan_grace_s=FINAL_ORPHAN_GRACE_S,
            now=self.orphans_collected_at,
            history=pipeline.history,
            commits=pipeline.commits(),
            storage_options=self.cluster.stack.storage_options(),
            audit_failed=frozenset(pipeline.epoch(n) for n in pipeline.bad_hours) if pipeline.audited else None,
        )

    def dispose(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()


def reland_hour(
    landing: Path,
    history: Path,
    hour: dt.datetime,
    *,
    key: str,
    change: bool = True,
    complete: bool = False,
    fail: bool = False,
) -> str:
    """The upstream lands ``hour`` anew. Its current input is kept first in ``history``
    (``<history>/YYYY/MM/DD/HH/v<N>/``, for the checker); then, with ``change``, about four in ten
    rows become purchases with new amounts, two rows go and two new ones (new event ids) come;
    without, the same rows are written again. ``complete``: the hour's checkpoint becomes
    ``_SUCCESS`` (a ``_FAILED`` one is removed); ``fail``: it becomes ``_FAILED`` (the upstream gave
    this delivery up; ``_SUCCESS`` is removed). Files are replaced by rename, so a reader never sees
    half an input. Deterministic for ``key`` and the version. Returns what changed, in words."""
    directory = hour_dir(landing, hour)
    files = sorted(directory.glob("*.json"))
    archive = history / f"{hour:%Y/%m/%d/%H}"
    archive.mkdir(parents=True, exist_ok=True)
    version = sum(1 for p in archive.glob("v*") if p.is_dir())
    kept = archive / f"v{version}"
    kept.mkdir()
    for path in files:
        shutil.copy2(path, kept / path.name)
    events = [json.loads(line) for path in files for line in path.read_text(encoding="utf-8").splitlines() if line]
    what = f"{len(events)} rows landed again unchanged"
    if change:
        rng = random.Random(f"{key}-{version}")
        changed = 0
        for event in events:
            if rng.random() < 0.4:
                event["event_type"] = "purchase"
                event["amount"] = round(rng.uniform(200, 400), 2)  # above any first-landed amount
                changed += 1
        removed = set(rng.sample(range(len(events)), k=min(2, max(0, len(events) - 1))))
        events = [e for i, e in enumerate(events) if i not in removed]
        for i in range(2):
            at = hour + dt.timedelta(seconds=rng.randrange(3600), microseconds=rng.randrange(1_000_000))
            events.append(
                {
                    "event_id": f"{hour:%Y%m%d%H}-v{version + 1}-{i:03d}",
                    "user_id": rng.randrange(1, 500),
                    "event_type": "click",
                    "event_time": at.isoformat(),
                    "amount": None,
                }
            )
        what = f"{changed} rows changed, {len(removed)} removed, 2 added: {len(events)} rows"
    count = max(1, len(files))
    names = [f"events-{i:03d}.json" for i in range(count)]
    chunks: list[list[str]] = [[] for _ in range(count)]
    for i, event in enumerate(events):
        chunks[i % count].append(json.dumps(event))
    for name, chunk in zip(names, chunks, strict=True):
        tmp = directory / f".{name}.tmp"
        tmp.write_text("\n".join(chunk) + "\n", encoding="utf-8")
        os.replace(tmp, directory / name)
    for path in files:
        if path.name not in names:
            path.unlink()
    if complete:
        (directory / "_FAILED").unlink(missing_ok=True)
        mark_hour(landing, hour, completed=True)
        what += ", checkpoint now _SUCCESS"
    elif fail:
        (directory / "_SUCCESS").unlink(missing_ok=True)
        mark_hour(landing, hour, completed=False)
        what += ", checkpoint now _FAILED"
    return f"{hour:%Y-%m-%dT%H} input v{version + 1}: {what}"
