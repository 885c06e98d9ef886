"""The named fault scenarios as data, the seed-driven random plans, and the driver that runs them.

A ``Scenario`` is one pipeline (its own DAG, sink, table and landed hours), the fault-plan rules
its epochs get (by epoch index; read by every task try through ``EXACTLY_ONCE_FAULT_PLAN``) and
``actions``: what the harness itself does while the runs go (kill -9 a task process or a component,
stop the meta store, clear runs, start a backfill, run a second committer, append as another
writer). ``run_scenarios`` runs any number of them at once on one cluster, waits for every run to
finish, lets the recovery DAG run after the orphan grace period, and checks every table
(``checker.check``). A report is JSON: the seed and plan (random mode), per scenario the writer used,
the actions taken, the runs' states and the anomalies.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import pyarrow as pa

from fault_harness.cluster import FINAL_ORPHAN_GRACE_S, ICEBERG_CONN_ID, REPO, Cluster
from fault_harness.harness import START, Harness, Pipeline
from fault_harness.layout import WRITE_POINT, hour_template

#: Every action gives up after this long; a scenario that cannot reach its fault is a failure. Long:
#: on a loaded machine a pipeline's sensor may start many minutes after the DAG was parsed.
ACTION_TIMEOUT_S = 1500.0


@dataclass(frozen=True)
class Rule:
    """A fault-plan rule for the scenario's epoch number ``epoch`` (0-based)."""

    epoch: int
    point: str
    mode: str = "kill"
    try_number: int | None = 1
    occurrence: int = 1
    seconds: float = 0.0


@dataclass
class Context:
    harness: Harness
    pipeline: Pipeline
    log: list[str]
    #: Set once every pipeline's runs have finished the first time.
    settled: threading.Event

    @property
    def cluster(self) -> Cluster:
        return self.harness.cluster

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")


Action = Callable[[Context], None]


@dataclass
class Scenario:
    name: str
    epochs: int = 2
    writer: str = "light"
    sensor: str = "poke"
    failed_hours: frozenset[int] = frozenset()
    late_hours: frozenset[int] = frozenset()
    rules: tuple[Rule, ...] = ()
    actions: tuple[Action, ...] = ()
    #: Actions run after every scenario's runs finished (then the runs are awaited again).
    after: tuple[Action, ...] = ()
    description: str = ""
    max_active_runs: int = 3
    pipeline: Pipeline | None = field(default=None, repr=False)


# -- actions --------------------------------------------------------------------------------------


def _wait(ctx: Context, what: str, predicate: Callable[[], Any], timeout: float = ACTION_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{ctx.pipeline.name}: {what} did not happen within {timeout:.0f} s")


def kill_task(task_id: str, *, with_java_child: bool = False, then: Action | None = None) -> Action:
    """``kill -9`` of the task process of ``task_id`` (the first running try), as a lost worker.

    ``with_java_child``: wait until the task runs its Spark driver (a ``java`` child of ``spark-submit``)
    so the kill lands during the Spark write; the driver is left running, as it would be.
    """

    def action(ctx: Context) -> None:
        def target() -> int | None:
            ti = ctx.harness.running_task(ctx.pipeline, task_id)
            if ti is None or ti.pid is None:
                return None
            if with_java_child:
                try:
                    children = psutil.Process(int(ti.pid)).children(recursive=True)
                except psutil.NoSuchProcess:
                    return None
                if not any("java" in (c.name() or "") for c in children):
                    return None
            return int(ti.pid)

        pid = _wait(ctx, f"a running {task_id}", target)
        os.kill(pid, signal.SIGKILL)
        ctx.note(f"kill -9 of the task process of {task_id} (pid {pid})")
        if then is not None:
            then(ctx)

    return action


def settle_late(ctx: Context) -> None:
    ctx.harness.settle_late(ctx.pipeline)
    ctx.note(f"markers written for the late hours {sorted(ctx.pipeline.late_hours)}")


def kill_component(name: str, *, when_task: str, state: str = "running", down_s: float = 5.0) -> Action:
    """``kill -9`` of a component (its whole session) once a task of the pipeline is in ``state``;
    restarted ``down_s`` later."""

    def action(ctx: Context) -> None:
        _wait(ctx, f"{when_task} {state}", lambda: ctx.harness.running_task(ctx.pipeline, when_task, (state,)))
        ctx.cluster.kill(name)
        ctx.note(f"kill -9 of the {name}")
        if ctx.pipeline.late_hours:
            settle_late(ctx)
        time.sleep(down_s)
        ctx.cluster.start(name)
        ctx.note(f"{name} restarted")

    return action


def stop_meta_store(*, when_task: str, down_s: float = 12.0) -> Action:
    def action(ctx: Context) -> None:
        _wait(ctx, f"{when_task} running", lambda: ctx.harness.running_task(ctx.pipeline, when_task))
        ctx.cluster.meta.stop("immediate")
        ctx.note("meta store stopped (immediate)")
        time.sleep(down_s)
        ctx.cluster.meta.start()
        ctx.note("meta store started again")

    return action


def second_committer(epoch_index: int) -> Action:
    """A zombie: while the DAG's commit of the epoch is paused after loading the table, a second
    process commits the same epoch; both attempts are alive at once."""

    def action(ctx: Context) -> None:
        p = ctx.pipeline
        _wait(ctx, "the paused commit", lambda: ctx.harness.running_task(p, "events.commit"))
        time.sleep(4)  # inside the pause (the commit decided and loaded the table by now)
        args = {
            "catalog_name": ICEBERG_CONN_ID,
            "catalog": ctx.cluster.catalog_properties,
            "meta_url": ctx.cluster.meta.url(),
            "sink_id": p.sink_id,
            "epoch": p.epoch(epoch_index),
            "checkpoint_template": hour_template(str(p.landing)),
        }
        done = subprocess.run(
            [sys.executable, "-m", "fault_harness.second_committer", json.dumps(args)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
        )
        ctx.note(f"second committer exited {done.returncode}: {done.stdout.strip() or done.stderr.strip()[-500:]}")

    return action


def other_writer(*, every_s: float = 1.0) -> Action:
    """Another writer appending its own rows to the same table until the pipeline's runs finished."""

    def action(ctx: Context) -> None:
        n = 0
        while not ctx.settled.is_set():
            table = ctx.harness.load_table(ctx.pipeline)
            rows = pa.Table.from_pylist(
                [
                    {
                        "event_id": f"foreign-{n}",
                        "user_id": n,
                        "event_type": "foreign",
                        "event_time": None,
                        "amount": None,
                    }
                ],
                schema=table.schema().as_arrow(),
            )
            try:
                table.append(rows)
                n += 1
            except Exception as exc:  # a lost race with our commit: the other writer simply tries again
                ctx.note(f"other writer: {type(exc).__name__}")
            time.sleep(every_s)
        ctx.note(f"other writer appended {n} snapshots")

    return action


def clear_runs(ctx: Context) -> None:
    """A user clears every (successful) run of the DAG: every task runs again."""
    ctx.cluster.airflow("tasks", "clear", "-y", ctx.pipeline.dag_id)
    ctx.note("cleared every run")


def backfill_overlap(ctx: Context) -> None:
    """A backfill over the whole range while the scheduled runs are still going."""
    p = ctx.pipeline
    _wait(ctx, "a first successful run", lambda: "success" in ctx.harness.runs(p).values())
    end = START + dt.timedelta(hours=p.epochs - 1)
    out = ctx.cluster.airflow(
        "backfill",
        "create",
        "--dag-id",
        p.dag_id,
        "--from-date",
        START.isoformat(),
        "--to-date",
        end.isoformat(),
        "--reprocess-behavior",
        "completed",
    )
    ctx.note(f"backfill created over the whole range: {out.strip()[-200:]}")


# -- the named scenarios ----------------------------------------------------------------------------


def named_scenarios() -> dict[str, Scenario]:
    """Every scenario of the issue, by name."""
    scenarios = [
        Scenario(
            "kill_spark_write",
            epochs=1,
            writer="spark",
            actions=(kill_task("transform", with_java_child=True),),
            description="kill -9 of the task process during the Spark write (real spark-submit)",
        ),
        Scenario(
            "kill_light_write",
            epochs=1,
            rules=(Rule(0, WRITE_POINT),),
            description="kill -9 of the write task after its files exist, before it returns them",
        ),
        Scenario(
            "kill_after_persist", epochs=1, rules=(Rule(0, "persist.inserted"),), description="kill -9 after persist"
        ),
        Scenario(
            "kill_sensor_wait",
            epochs=1,
            late_hours=frozenset({0}),
            actions=(kill_task("events.wait_for_checkpoint", then=settle_late),),
            description="kill -9 of the sensor's task process while it waits",
        ),
        Scenario(
            "kill_before_catalog_update",
            epochs=1,
            rules=(Rule(0, "iceberg.before_catalog_update"),),
            description="kill -9 inside the Iceberg commit, before the catalog update",
        ),
        Scenario(
            "kill_after_catalog_update",
            epochs=1,
            rules=(Rule(0, "iceberg.after_catalog_update"),),
            description="kill -9 inside the Iceberg commit, after the catalog update",
        ),
        Scenario(
            "kill_before_mark",
            epochs=1,
            rules=(Rule(0, "commit.visible"),),
            description="kill -9 after the commit, before the Committed mark",
        ),
        Scenario(
            "kill_during_abort",
            epochs=1,
            failed_hours=frozenset({0}),
            rules=(Rule(0, "abort.marked"),),
            description="kill -9 during the abort of a failed checkpoint (marked, files not yet deleted)",
        ),
        Scenario(
            "kill_scheduler",
            epochs=2,
            actions=(kill_component("scheduler", when_task="transform"),),
            description="kill -9 of the scheduler (and its LocalExecutor's task processes)",
        ),
        Scenario(
            "kill_triggerer",
            epochs=1,
            sensor="deferrable",
            late_hours=frozenset({0}),
            actions=(kill_component("triggerer", when_task="events.wait_for_checkpoint", state="deferred"),),
            description="kill -9 of the triggerer while a deferred sensor waits",
        ),
        Scenario(
            "meta_store_outage",
            epochs=2,
            actions=(stop_meta_store(when_task="transform"),),
            description="the meta store stopped (immediate) and restarted while epochs run",
        ),
        Scenario(
            "failed_checkpoint",
            epochs=2,
            failed_hours=frozenset({1}),
            description="a checkpoint that fails: the epoch is aborted, nothing of it visible",
        ),
        Scenario(
            "zombie",
            epochs=1,
            rules=(Rule(0, "iceberg.loaded", mode="pause", seconds=25),),
            actions=(second_committer(0),),
            description="the same epoch committed by two live attempts at once",
        ),
        Scenario(
            "other_writer",
            epochs=2,
            actions=(other_writer(),),
            description="another writer appending to the same table while epochs commit",
        ),
        Scenario(
            "clear_successful",
            epochs=2,
            after=(clear_runs,),
            description="a user clearing successful runs (every task runs again)",
        ),
        Scenario(
            "backfill_overlap",
            epochs=2,
            max_active_runs=1,
            actions=(backfill_overlap,),
            description="a backfill over the range while the scheduled runs are still going",
        ),
    ]
    return {s.name: s for s in scenarios}


# -- random plans ---------------------------------------------------------------------------------------

#: Points a random plan may arm on an epoch whose checkpoint completes / fails.
COMMIT_POINTS = (
    WRITE_POINT,
    "persist.inserted",
    "commit.decided",
    "iceberg.loaded",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
    "commit.marked",
)
ABORT_POINTS = (WRITE_POINT, "persist.inserted", "abort.marked", "abort.cleaned")


def random_plan(seed: int, epochs: int, *, per_pipeline: int = 10) -> list[Scenario]:
    """Seed -> pipelines of up to ``per_pipeline`` epochs, every epoch faulted: a fault point and
    mode (crash or kill, on the first try, sometimes on the second as well), about one hour in six
    with a failed checkpoint, some hours settled late, and one process-level event per pipeline
    (kill -9 of the scheduler or the triggerer, or a meta-store outage) at a random moment."""
    rng = random.Random(seed)
    scenarios = []
    for n, first in enumerate(range(0, epochs, per_pipeline)):
        count = min(per_pipeline, epochs - first)
        failed = frozenset(i for i in range(count) if rng.random() < 1 / 6)
        late = frozenset(i for i in range(count) if rng.random() < 0.2)
        rules: list[Rule] = []
        for i in range(count):
            point = rng.choice(ABORT_POINTS if i in failed else COMMIT_POINTS)
            mode = rng.choice(("crash", "kill"))
            rules.append(Rule(i, point, mode=mode, try_number=1))
            if rng.random() < 0.2:
                rules.append(
                    Rule(i, rng.choice(COMMIT_POINTS if i not in failed else ABORT_POINTS), mode=mode, try_number=2)
                )
        sensor = rng.choice(("poke", "reschedule", "deferrable"))
        event = rng.choice(("scheduler", "triggerer", "meta_store", "none"))
        when = rng.choice(("transform", "events.persist", "events.commit"))
        actions: list[Action] = []
        if late:
            actions.append(_late_after(rng.uniform(5, 40)))
        if event == "scheduler":
            actions.append(kill_component("scheduler", when_task=when, down_s=rng.uniform(2, 10)))
        elif event == "triggerer":
            actions.append(kill_component("triggerer", when_task=when, down_s=rng.uniform(2, 10)))
        elif event == "meta_store":
            actions.append(stop_meta_store(when_task=when, down_s=rng.uniform(3, 15)))
        scenarios.append(
            Scenario(
                f"random_{seed}_{n}",
                epochs=count,
                sensor=sensor,
                failed_hours=failed,
                late_hours=late,
                rules=tuple(rules),
                actions=tuple(actions),
                description=f"seed {seed} pipeline {n}: {sensor} sensor, event {event} at {when}",
            )
        )
    return scenarios


def _late_after(seconds: float) -> Action:
    def action(ctx: Context) -> None:
        time.sleep(seconds)
        settle_late(ctx)

    action.__name__ = f"settle_late_after_{seconds:.0f}s"
    return action


def describe_plan(scenarios: Sequence[Scenario]) -> list[dict[str, Any]]:
    return [
        {
            "name": s.name,
            "description": s.description,
            "epochs": s.epochs,
            "writer": s.writer,
            "sensor": s.sensor,
            "failed_hours": sorted(s.failed_hours),
            "late_hours": sorted(s.late_hours),
            "rules": [r.__dict__ for r in s.rules],
            "actions": [getattr(a, "__qualname__", repr(a)).split(".<locals>")[0] for a in (*s.actions, *s.after)],
        }
        for s in scenarios
    ]


# -- the driver ---------------------------------------------------------------------------------------------


def run_scenarios(cluster: Cluster, scenarios: Sequence[Scenario], *, timeout: float = 1500) -> dict[str, Any]:
    """Run the scenarios at once on the cluster; the report (see the module docstring)."""
    started = time.monotonic()
    harness = Harness(cluster)
    logs: dict[str, list[str]] = {s.name: [] for s in scenarios}
    errors: dict[str, str] = {}
    settled = threading.Event()
    try:
        for s in scenarios:
            s.pipeline = harness.add(
                Pipeline(
                    s.name,
                    s.epochs,
                    cluster.root / "landing" / s.name,
                    writer=s.writer,
                    sensor=s.sensor,
                    failed_hours=s.failed_hours,
                    late_hours=s.late_hours,
                    max_active_runs=s.max_active_runs,
                ),
                start_dag=False,
            )
        cluster.write_plan(
            [
                {
                    "sink": s.pipeline.sink_id,
                    "epoch": s.pipeline.epoch(r.epoch),
                    "point": r.point,
                    "mode": r.mode,
                    "try": r.try_number,
                    "occurrence": r.occurrence,
                    "seconds": r.seconds,
                }
                for s in scenarios
                if s.pipeline is not None
                for r in s.rules
            ]
        )
        for s in scenarios:
            assert s.pipeline is not None
            harness.start_dag(s.pipeline, wait=False)
        for s in scenarios:
            assert s.pipeline is not None
            cluster.wait_for_dag(s.pipeline.dag_id, timeout=300)

        def run_actions(s: Scenario, actions: Sequence[Action]) -> list[threading.Thread]:
            assert s.pipeline is not None
            ctx = Context(harness, s.pipeline, logs[s.name], settled)

            def one(action: Action) -> None:
                try:
                    action(ctx)
                except Exception:
                    errors[s.name] = traceback.format_exc(limit=3)
                    if ctx.pipeline.late_hours:
                        settle_late(ctx)  # so the runs can end; the scenario still fails on the error

            threads = [threading.Thread(target=one, args=(a,), daemon=True) for a in actions]
            for t in threads:
                t.start()
            return threads

        threads = [t for s in scenarios for t in run_actions(s, s.actions)]
        deadline = time.monotonic() + timeout
        for s in scenarios:
            assert s.pipeline is not None
            harness.wait_finished(s.pipeline, timeout=max(10.0, deadline - time.monotonic()))
        settled.set()
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        later = [t for s in scenarios if s.after for t in run_actions(s, s.after)]
        for t in later:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        for s in scenarios:  # again: an action (a backfill, a clear) may have re-opened runs
            assert s.pipeline is not None
            harness.wait_finished(s.pipeline, timeout=max(10.0, deadline - time.monotonic()))
        finished_at = time.monotonic()
        recovery_state = harness.run_recovery()
        time.sleep(max(0.0, finished_at + FINAL_ORPHAN_GRACE_S + 3 - time.monotonic()))
        collected = harness.collect_orphans()
        results = {}
        for s in scenarios:
            assert s.pipeline is not None
            checked = harness.check(s.pipeline)
            results[s.name] = {
                "description": s.description,
                "writer": "spark-submit (real Spark)" if s.writer == "spark" else "light (pyarrow, no JVM)",
                "runs": harness.runs(s.pipeline),
                "actions": logs[s.name],
                "action_error": errors.get(s.name),
                **checked.to_dict(),
            }
        return {
            "scenarios": results,
            "recovery_run": recovery_state,
            "orphans_collected": collected,
            "anomalies": sum(len(r["anomalies"]) for r in results.values()),
            "action_errors": sum(1 for r in results.values() if r["action_error"]),
            "faulted_epochs": sum(len({r.epoch for r in s.rules}) for s in scenarios),
            "epochs": sum(s.epochs for s in scenarios),
            "runs_seconds": round(finished_at - started, 1),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        settled.set()
        harness.dispose()
