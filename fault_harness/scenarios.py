"""The named fault scenarios as data, the seed-driven random plans, and the driver that runs them.

A ``Scenario`` is one pipeline (its own DAG, sink, table and landed hours), the fault-plan rules
its epochs get (by epoch index; read by every task try through ``EXACTLY_ONCE_FAULT_PLAN``) and
``actions``: what the harness itself does while the runs go (kill -9 a task process or a component,
stop the meta store, start a backfill, run a second committer, append as another writer, or
reprocess: land committed hours anew and re-run them by a clear, a reprocess backfill or the REST
API, with faults armed on the re-runs' tries). ``run_scenarios`` runs any number of them at once on
one cluster, waits for every run to finish, lets the recovery DAG run after the orphan grace period,
and checks every table (``checker.check``), telling it how many revisions each epoch went through.
A report is JSON: the seed and plan (random mode), per scenario the writer used, the actions taken,
the runs' states, the epochs reprocessed and the anomalies.
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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil  # type: ignore[import-untyped]
import pyarrow as pa

from airflow_provider_exactly_once.demo.world import hour_dir
from fault_harness.checker import pyiceberg_rows, read_input
from fault_harness.cluster import FINAL_ORPHAN_GRACE_S, ICEBERG_CONN_ID, REPO, Cluster
from fault_harness.harness import TERMINAL, Harness, Pipeline
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


# -- reprocessing ------------------------------------------------------------------------------------

#: The steps a revision passes that a first commit does not, or passes differently: persist opens
#: the revision; the commit decides it, replaces the write in one overwrite snapshot per table
#: (before / after the catalog update), and marks it Committed.
REVISION_POINTS = (
    "persist.revised",
    "commit.decided",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
    "commit.marked",
)


@dataclass(frozen=True)
class RevisionFault:
    """A fault on the re-run's try of the task that reaches ``point`` for hour ``hour``: armed when
    the re-run starts, for the try after the task's last one (a cleared run's tries go on counting)."""

    hour: int
    point: str
    mode: str = "kill"

    @property
    def task(self) -> str:
        return "events.persist" if self.point.startswith("persist.") else "events.commit"


def _run_states(ctx: Context) -> dict[int, tuple[str, int]]:
    """Per hour: its run's state and clear number (how often it was cleared)."""
    p = ctx.pipeline
    states = {}
    for row in ctx.cluster.dag_runs(p.dag_id):
        start = row.data_interval_start.astimezone(dt.UTC) if row.data_interval_start is not None else None
        if start in p.hours:
            states[p.hours.index(start)] = (str(row.state), int(row.clear_number or 0))
    return states


def _first_pass(ctx: Context) -> dict[int, tuple[str, int]]:
    """Wait until every run of the pipeline has ended; their states. Twice the action timeout: all
    the scenarios' first runs share the task slots (the driver's own timeout bounds the whole)."""
    _wait(ctx, "every run finished", lambda: ctx.harness.finished(ctx.pipeline), timeout=2 * ACTION_TIMEOUT_S)
    states = _run_states(ctx)
    ctx.pipeline.committed.update(n for n, (state, _) in states.items() if state == "success")
    return states


def _checkpoint_failed(ctx: Context, n: int) -> bool:
    return (hour_dir(ctx.pipeline.landing, ctx.pipeline.hours[n]) / "_FAILED").exists()


def _rerun(
    ctx: Context,
    before: dict[int, tuple[str, int]],
    start: Callable[[], str],
    what: str,
    *,
    expect: set[int] | None,
) -> None:
    """Start re-runs (``start``), wait until they ended, and count each successful re-run of a
    committed epoch as one more revision of it (``Pipeline.reprocessed``; a re-run that failed gave
    its revision up, which leaves no snapshot). ``expect``: the hours that must be re-run, no more
    (``None``: whatever the command re-ran, as for a backfill racing the scheduled runs). A re-run
    must succeed where the hour's checkpoint completed, and fail where it failed."""
    p = ctx.pipeline
    out = start()
    ctx.note(f"{what}: {out.strip()[-300:]}")

    def ended() -> dict[int, tuple[str, int]] | None:
        now = _run_states(ctx)
        if expect is not None and any(now.get(n, ("", 0))[1] <= before.get(n, ("", 0))[1] for n in expect):
            return None  # the command committed its clears before returning; this is a safety net
        return now if ctx.harness.finished(p) else None

    after = _wait(ctx, f"the re-runs of {what}", ended)
    problems, reran = [], []
    for n, (state, cleared) in sorted(after.items()):
        was, cleared_before = before.get(n, ("none", 0))
        times = cleared - cleared_before
        if times:
            reran.append(f"{n}: {was} -> {state}")
        if times and state == "success":
            if was == "success" or n in p.committed:
                p.reprocessed[n] += times
            elif was not in TERMINAL:  # it may have ended, committed, between the look and the command
                p.maybe_reprocessed[n] += times
        if expect is not None and (n in expect) != bool(times):
            problems.append(f"hour {n} was {'not ' if not times else ''}re-run ({times} clears)")
        if times and state != ("failed" if _checkpoint_failed(ctx, n) else "success"):
            problems.append(f"the re-run of hour {n} ended {state}")
    p.committed.update(n for n, (state, _) in after.items() if state == "success")
    ctx.note(f"re-runs ended (hour: before -> after): {', '.join(reran) or 'none'}")
    if problems:
        raise AssertionError(f"{p.name}: {'; '.join(problems)}")


def _arm_on_rerun(ctx: Context, faults: Sequence[RevisionFault]) -> list[tuple[RevisionFault, int]]:
    p = ctx.pipeline
    armed = []
    for f in faults:
        try_number = ctx.harness.try_numbers(p, f.hour).get(f.task, 0) + 1
        armed.append((f, try_number))
    ctx.harness.arm(
        {"sink": p.sink_id, "epoch": p.epoch(f.hour), "point": f.point, "mode": f.mode, "try": t, "occurrence": 1}
        for f, t in armed
    )
    if armed:
        ctx.note(
            "armed on the re-runs: "
            + ", ".join(f"hour {f.hour} {f.point}:{f.mode} on {f.task} try {t}" for f, t in armed)
        )
    return armed


def _check_fired(ctx: Context, armed: list[tuple[RevisionFault, int]]) -> None:
    """A fault fired when the armed try did not end the task: a later try exists."""
    missed = []
    for f, try_number in armed:
        last = ctx.harness.try_numbers(ctx.pipeline, f.hour).get(f.task, 0)
        if last <= try_number:
            missed.append(f"hour {f.hour} {f.point} (try {try_number}, last try {last})")
    if missed:
        raise AssertionError(f"{ctx.pipeline.name}: armed faults that did not fire: {'; '.join(missed)}")
    if armed:
        ctx.note(f"every armed fault fired ({len(armed)}): each task went on to a later try")


def _note_revisions(ctx: Context, n: int) -> None:
    """What ``eo-sink show`` says of the epoch's revisions (for the report; never judged)."""
    p = ctx.pipeline
    try:
        data = json.loads(ctx.cluster.eo_sink("show", p.sink_id, str(p.epoch(n)), "--json"))["epoch"]
        revisions = data.get("revisions") or []
        ctx.note(
            f"eo-sink show hour {n}: status {data.get('status')}, revisions: "
            + "; ".join(
                f"{r['revision']} {r['status']} write {str(r['write_id'])[:8]} {r['rows']} rows" for r in revisions
            )
        )
    except Exception as exc:  # informative only
        ctx.note(f"eo-sink show hour {n}: {type(exc).__name__}: {str(exc)[-300:]}")


def reprocess(
    how: str,
    hours: Sequence[int],
    *,
    land: Sequence[int] | None = None,
    unchanged: Sequence[int] = (),
    complete: Sequence[int] = (),
    fail: Sequence[int] = (),
    faults: Sequence[RevisionFault] = (),
    show: int | None = None,
) -> Action:
    """Once the pipeline's runs have ended: land hours anew (``land``, default ``hours``; with
    changed input except the ``unchanged`` ones; ``complete``: their checkpoint becomes
    ``_SUCCESS``, ``fail``: ``_FAILED``), arm ``faults`` on the re-runs' tries, and re-run ``hours``:

    - ``clear``: ``airflow tasks clear -y -s HOUR -e HOUR DAG`` per hour; ``clear_all``: every run;
    - ``backfill``: ``airflow backfill create --reprocess-behavior completed`` from the first to the
      last of ``hours`` (every run in between is re-run);
    - ``backfill_failed``: the same over the whole range with ``--reprocess-behavior failed``
      (``hours`` are the failed runs it must re-run, and only those);
    - ``api``: ``POST /api/v2/dags/{dag_id}/clearTaskInstances`` per hour, through the api-server.

    Then waits for the re-runs and checks that every armed fault fired. A re-run of a committed
    epoch opens a revision: the checker expects one more marked snapshot for it."""
    landed = list(hours if land is None else land)

    def action(ctx: Context) -> None:
        p, h = ctx.pipeline, ctx.harness
        before = _first_pass(ctx)
        for n in sorted(set(landed) | set(complete) | set(fail)):
            ctx.note(h.reland(p, n, change=n not in unchanged, complete=n in complete, fail=n in fail))
        armed = _arm_on_rerun(ctx, faults)
        starts: dict[str, Callable[[], str]] = {
            "clear": lambda: h.clear_cli(p, hours),
            "clear_all": lambda: h.clear_cli(p),
            "backfill": lambda: h.backfill(p, min(hours), max(hours), reprocess="completed"),
            "backfill_failed": lambda: h.backfill(p, 0, p.epochs - 1, reprocess="failed"),
            "api": lambda: "; ".join(
                f"hour {n}: {h.clear_api(p, n).get('total_entries')} task instances cleared" for n in hours
            ),
        }
        expect = set(range(min(hours), max(hours) + 1)) if how == "backfill" else set(hours)
        if how == "clear_all":
            expect = set(range(p.epochs))
        _rerun(ctx, before, starts[how], f"{how} of hours {sorted(expect)}", expect=expect)
        _check_fired(ctx, armed)
        if show is not None:
            _note_revisions(ctx, show)

    parts = [f"{how} {sorted(hours)}"]
    if landed or complete or fail:
        parts.append(
            f"landed anew {sorted(set(landed) | set(complete) | set(fail))}"
            + (f" ({sorted(unchanged)} unchanged)" if unchanged else "")
        )
    if complete or fail:
        parts.append(f"now _SUCCESS {sorted(complete)}, _FAILED {sorted(fail)}")
    if faults:
        parts.append("faults " + ", ".join(f"{f.hour}:{f.point}:{f.mode}" for f in faults))
    action.__qualname__ = f"reprocess({'; '.join(parts)})"
    return action


def revision_given_up(ctx: Context) -> None:
    """A committed hour is delivered again and the upstream gives that delivery up (``_FAILED``):
    the re-run opens a revision, its sensor fails, its abort gives the revision up, and the first
    write must stay visible, the epoch Committed. Then the upstream delivers once more
    (``_SUCCESS``) and a second clear replaces the epoch: one revision committed, none for the
    given-up one."""
    reprocess("clear", [0], fail=[0])(ctx)
    p = ctx.pipeline
    first = read_input(p.history / f"{p.hours[0]:%Y/%m/%d/%H}" / "v0")
    shown = [r for r in pyiceberg_rows(ctx.harness.load_table(p)) if r[0].startswith(f"{p.hours[0]:%Y%m%d%H}-")]
    if Counter(shown) != Counter(first):
        raise AssertionError(
            f"{p.name}: after the given-up revision the table shows {len(shown)} rows, not the first write's {len(first)}"
        )
    ctx.note(f"after the given-up revision the table still shows the first write's {len(first)} rows")
    _note_revisions(ctx, 0)
    reprocess("clear", [0], complete=[0], show=0)(ctx)


def clear_runs(ctx: Context) -> None:
    """A user clears every run of the DAG once they have ended: every task runs again, on the same
    input, so each committed epoch is replaced by a revision with the same rows."""
    before = _first_pass(ctx)
    _rerun(ctx, before, lambda: ctx.harness.clear_cli(ctx.pipeline), "tasks clear of every run", expect=set(before))


def backfill_overlap(ctx: Context) -> None:
    """A backfill over the whole range while the scheduled runs are still going: the runs that
    ended by then are re-run (revisions), the others are left to the scheduler."""
    p = ctx.pipeline
    _wait(ctx, "a first successful run", lambda: "success" in ctx.harness.runs(p).values())
    before = _run_states(ctx)
    _rerun(
        ctx,
        before,
        lambda: ctx.harness.backfill(p, 0, p.epochs - 1, reprocess="completed"),
        "backfill over the whole range",
        expect=None,
    )


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
            actions=(clear_runs,),
            description="a user clearing successful runs: every task runs again, each epoch replaced by the same rows",
        ),
        Scenario(
            "backfill_overlap",
            epochs=2,
            max_active_runs=1,
            actions=(backfill_overlap,),
            description="a reprocess backfill over the range while the scheduled runs are still going",
        ),
        Scenario(
            "reprocess_completed",
            epochs=3,
            actions=(reprocess("backfill", [0, 1], show=0),),
            description="input of two committed hours changed, then a backfill --reprocess-behavior completed of them",
        ),
        Scenario(
            "reprocess_failed",
            epochs=3,
            failed_hours=frozenset({1}),
            actions=(reprocess("backfill_failed", [1], complete=[1], show=1),),
            description="a failed hour landed anew with _SUCCESS, then a backfill --reprocess-behavior failed",
        ),
        Scenario(
            "clear_via_api",
            epochs=2,
            actions=(reprocess("api", [0], show=0),),
            description="input of a committed hour changed, then its run cleared through the REST API",
        ),
        Scenario(
            "kill_during_replacement",
            epochs=len(REVISION_POINTS),
            actions=(
                reprocess(
                    "clear_all",
                    range(len(REVISION_POINTS)),
                    faults=[RevisionFault(n, point) for n, point in enumerate(REVISION_POINTS)],
                ),
            ),
            description="every hour's input changed and its run cleared; each revision killed at another of its steps",
        ),
        Scenario(
            "revision_given_up",
            epochs=1,
            actions=(revision_given_up,),
            description="a re-run whose checkpoint fails gives its revision up (the first write stays); a second one replaces it",
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
    with a failed checkpoint, some hours settled late, one process-level event per pipeline
    (kill -9 of the scheduler or the triggerer, or a meta-store outage) at a random moment, and for
    some pipelines a reprocessing of committed hours once their runs ended (``_random_reprocess``)."""
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
        again = _random_reprocess(seed, n, count, failed)
        if again is not None:
            actions.append(again)
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


def _random_reprocess(seed: int, n: int, count: int, failed: frozenset[int]) -> Action | None:
    """Pipeline ``n``'s reprocessing, or none: drawn from its own generator, so that adding it left
    every other draw of a seed's plan as it was. Three pipelines in five re-run one to three of their
    committed hours once every run ended (clears, a reprocess backfill over a range, or REST API
    clears), most with changed input, and three in five of those arm a crash or a kill at one step
    of one revision."""
    rng = random.Random(f"{seed}-reprocess-{n}")
    committed = [i for i in range(count) if i not in failed]
    if rng.random() >= 0.6 or not committed:
        return None
    how = rng.choice(("clear", "backfill", "api"))
    if how == "backfill":
        first = rng.choice(committed)
        hours = list(range(first, min(count - 1, first + rng.randrange(3)) + 1))
        land = [i for i in hours if i not in failed]  # a failed hour's re-run aborts again
    else:
        hours = sorted(rng.sample(committed, k=min(len(committed), rng.randint(1, 3))))
        land = hours
    unchanged = [i for i in land if rng.random() < 0.2]
    faults = []
    if rng.random() < 0.6:
        faults.append(RevisionFault(rng.choice(land), rng.choice(REVISION_POINTS), rng.choice(("crash", "kill"))))
    return reprocess(how, hours, land=land, unchanged=unchanged, faults=faults)


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
        harness.arm(
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
                "reprocessed": {str(n): k for n, k in sorted(s.pipeline.reprocessed.items())},
                **checked.to_dict(),
            }
        return {
            "scenarios": results,
            "recovery_run": recovery_state,
            "orphans_collected": collected,
            "anomalies": sum(len(r["anomalies"]) for r in results.values()),
            "action_errors": sum(1 for r in results.values() if r["action_error"]),
            "faulted_epochs": sum(len({r.epoch for r in s.rules}) for s in scenarios),
            "reprocessed_epochs": sum(
                sum(s.pipeline.reprocessed.values()) for s in scenarios if s.pipeline is not None
            ),
            "epochs": sum(s.epochs for s in scenarios),
            "runs_seconds": round(finished_at - started, 1),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        settled.set()
        harness.dispose()
