"""The harness's own actions during a scenario's runs: kill -9 of a task process or a component,
a meta-store outage, a second (zombie) committer, another writer on the table, late checkpoints;
kill -9 of the Spark Connect server during a write; on the production stack, kill -9 of the Celery
worker running a task and of the catalog (SeaweedFS), and a commit's response lost between the
catalog and the cluster (the proxy).

Each returns an ``Action``: a function of the scenario's ``Context``, run in a thread beside the runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pyarrow as pa

from fault_harness.cluster import ICEBERG_CONN_ID, REPO
from fault_harness.layout import hour_template, write_starts
from fault_harness.plans import Action, Context, wait_for


def kill_task(task_id: str, *, with_java_child: bool = False, then: Action | None = None) -> Action:
    """``kill -9`` of the task process of ``task_id`` (the first running try), as a lost worker.

    ``with_java_child``: wait until the task runs its Spark driver (a ``java`` child of ``spark-submit``)
    so the kill lands during the Spark write; the driver is left running, as it would be. On a stack
    with a Spark standalone master, also until the master runs the write's application, so that the
    kill finds executors on the worker, outside the task's process tree.
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

        pid = wait_for(ctx, f"a running {task_id}", target)
        standalone = ctx.cluster.stack.servers.get("spark-standalone")
        if with_java_child and standalone is not None:
            apps = wait_for(ctx, "the write's application on the Spark master", lambda: _active_apps(standalone))
            ctx.note(f"Spark standalone master {standalone.url} runs application(s) {', '.join(apps)}")
        os.kill(pid, signal.SIGKILL)
        ctx.note(f"kill -9 of the task process of {task_id} (pid {pid})")
        if then is not None:
            then(ctx)

    return action


def _active_apps(standalone: Any) -> list[str] | None:
    """The ids of the applications the standalone master runs with an executor core, if any."""
    try:
        apps = standalone.status().get("activeapps") or []
    except (OSError, ValueError):
        return None
    return [str(a["id"]) for a in apps if a.get("cores", 0) > 0] or None


def settle_late(ctx: Context) -> None:
    ctx.harness.settle_late(ctx.pipeline)
    ctx.note(f"markers written for the late hours {sorted(ctx.pipeline.late_hours)}")


def kill_component(name: str, *, when_task: str, state: str = "running", down_s: float = 5.0) -> Action:
    """``kill -9`` of a component (its whole session) once a task of the pipeline is in ``state``;
    restarted ``down_s`` later."""

    def action(ctx: Context) -> None:
        wait_for(ctx, f"{when_task} {state}", lambda: ctx.harness.running_task(ctx.pipeline, when_task, (state,)))
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
        wait_for(ctx, f"{when_task} running", lambda: ctx.harness.running_task(ctx.pipeline, when_task))
        with ctx.cluster.meta.outage("immediate") as stopped_here:
            ctx.note(
                "meta store stopped (immediate)" if stopped_here else "meta store already down (an overlapping outage)"
            )
            time.sleep(down_s)
        ctx.note(
            "meta store started again"
            if ctx.cluster.meta.running()
            else "meta store kept down by an overlapping outage"
        )

    return action


def second_committer(epoch_index: int) -> Action:
    """A zombie: while the DAG's commit of the epoch is paused after loading the table, a second
    process commits the same epoch; both attempts are alive at once."""

    def action(ctx: Context) -> None:
        p = ctx.pipeline
        wait_for(ctx, "the paused commit", lambda: ctx.harness.running_task(p, "events.commit"))
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
            try:
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
                table.append(rows)
                n += 1
            except Exception as exc:
                # A lost race with our commit, or the catalog down (``catalog_restart`` in the same
                # run, on the production stack): like any writer, it simply tries again.
                ctx.note(f"other writer: {type(exc).__name__}")
            time.sleep(every_s)
        ctx.note(f"other writer appended {n} snapshots")

    return action


def late_after(seconds: float) -> Action:
    def action(ctx: Context) -> None:
        time.sleep(seconds)
        settle_late(ctx)

    action.__name__ = f"settle_late_after_{seconds:.0f}s"
    return action


def kill_worker_of(task_id: str, *, when_logged: str = "", down_s: float = 5.0) -> Action:
    """``kill -9`` of the Celery worker whose task process runs ``task_id`` (``Cluster.kill``: the
    worker's process group and every process below it, as losing its machine would), restarted
    ``down_s`` later. The worker is found from the task instance's pid, the task process: the
    component whose process tree holds it (both workers share one hostname, this machine's).
    ``when_logged``: not before the task's log says so (a ``pause`` rule's line: the task is there)."""

    def action(ctx: Context) -> None:
        workers = ctx.cluster.stack.workers
        if not workers:
            raise RuntimeError(f"the {ctx.cluster.stack.name} stack has no Celery worker")

        def target() -> tuple[str, Any] | None:
            ti = ctx.harness.running_task(ctx.pipeline, task_id)
            if ti is None or ti.pid is None:
                return None
            if when_logged and not _task_log_has(ctx, task_id, when_logged):
                return None
            try:
                ancestors = {p.pid for p in psutil.Process(int(ti.pid)).parents()}
            except psutil.NoSuchProcess:
                return None
            for name in workers:
                proc = ctx.cluster.procs.get(name)
                if proc is not None and proc.pid in ancestors:
                    return name, ti
            return None

        name, ti = wait_for(ctx, f"a running {task_id} on a Celery worker", target)
        killed = ctx.cluster.kill(name)
        ctx.note(
            f"kill -9 of {name} (pids {killed}), which ran {task_id} try {ti.try_number} "
            f"(task pid {ti.pid}, hostname {ti.hostname})"
        )
        time.sleep(down_s)
        ctx.cluster.start(name)
        ctx.note(f"{name} restarted")

    return action


def kill_catalog(*, when_task: str, down_s: float) -> Action:
    """``kill -9`` of SeaweedFS (the REST catalog and the S3 under the tables) once ``when_task`` of
    the pipeline runs; started again ``down_s`` later on the same ports."""

    def action(ctx: Context) -> None:
        if "seaweedfs" not in ctx.cluster.stack.servers:
            raise RuntimeError(f"the {ctx.cluster.stack.name} stack has no SeaweedFS")
        wait_for(ctx, f"{when_task} running", lambda: ctx.harness.running_task(ctx.pipeline, when_task))
        killed = ctx.cluster.kill("seaweedfs")
        ctx.note(f"kill -9 of seaweedfs (pid {killed}) while {when_task} runs")
        time.sleep(down_s)
        ctx.cluster.start("seaweedfs")
        ctx.note(f"seaweedfs restarted after {down_s:.0f} s")

    return action


def kill_spark_connect(*, down_s: float = 3.0) -> Action:
    """``kill -9`` of the Spark Connect server while it runs one of the pipeline's writes (its
    executors inside ``slow_input``, which names the write), started again ``down_s`` later on the
    same port. Once every run ended, the note gives the write task's tries: the killed one failed
    and a later one, a new write, is the epoch's."""

    def action(ctx: Context) -> None:
        starts = Path(write_starts(str(ctx.pipeline.landing)))
        started = wait_for(ctx, "a write running on the Spark Connect server", lambda: sorted(starts.glob("*")))
        killed = ctx.cluster.kill("spark-connect")
        ctx.note(f"kill -9 of the Spark Connect server (pid {killed}) during write {started[0].name}")
        time.sleep(down_s)
        ctx.cluster.start("spark-connect")
        ctx.note(f"the Spark Connect server restarted after {down_s:.0f} s")
        ctx.settled.wait()
        tries = sorted(int(ti.try_number or 0) for ti in ctx.cluster.task_instances(ctx.pipeline.dag_id, "transform"))
        writes = sorted(p.name for p in starts.glob("*"))
        ctx.note(f"write tasks' tries {tries}; writes started on the server: {len(writes)}")
        if not tries or max(tries) < 2:
            raise AssertionError(f"no write task of {ctx.pipeline.name} failed: the kill missed its write")

    return action


def drop_commit_response(*, answer: bytes | None = None) -> Action:
    """The REST catalog applies the pipeline's first commit (``POST .../tables/<table>`` adding a
    snapshot; a fan-out's ``POST .../transactions/commit`` of all its tables) and the proxy in front
    of it (``Stack.catalog_proxy``) loses the response: the client's connection is closed unanswered,
    or gets ``answer`` (a gateway's 504, say) instead. The commit has landed and its task cannot know;
    the scenario's pipeline must use the proxied connection. Once every run ended, the note says how
    many tries each commit task took."""

    def action(ctx: Context) -> None:
        proxy = ctx.cluster.stack.catalog_proxy
        if proxy is None:
            raise RuntimeError(f"the {ctx.cluster.stack.name} stack has no proxy in front of its catalog")
        names = [name.rsplit(".", 1)[-1] for name in ctx.pipeline.table_names]
        suffix = "/transactions/commit" if len(names) > 1 else "/tables/" + names[0]

        def is_commit(method: str, path: str, body: bytes) -> bool:
            return (
                method == "POST"
                and path.split("?", 1)[0].endswith(suffix)
                and b'"add-snapshot"' in body
                and (len(names) == 1 or all(f'"{name}"'.encode() in body for name in names))
            )

        proxy.drop_response(is_commit, answer=answer)
        tables = ", ".join(ctx.pipeline.table_names)
        ctx.note(f"proxy armed: the next commit to {tables} loses its response")
        dropped = wait_for(
            ctx,
            "a commit whose response the proxy dropped",
            lambda: [r for r in proxy.dropped() if r.path.endswith(suffix)],
        )
        ctx.note(f"the catalog's response to {dropped[0].method} {dropped[0].path} was dropped by the proxy")
        ctx.settled.wait()
        commit_task = "events.publish" if ctx.pipeline.audited else "events.commit"  # design.md D23
        tries = sorted(int(ti.try_number or 0) for ti in ctx.cluster.task_instances(ctx.pipeline.dag_id, commit_task))
        commits = sum(1 for r in proxy.requests if r.path.endswith(suffix) and r.method == "POST")
        ctx.note(f"commit tasks' tries {tries}; {commits} POST(s) of a commit passed the proxy")

    return action


def _task_log_has(ctx: Context, task_id: str, text: str) -> bool:
    """Whether a log of the pipeline's ``task_id`` (any run, any try) holds ``text``."""
    logs = ctx.cluster.root / "logs" / "tasks" / f"dag_id={ctx.pipeline.dag_id}"
    for path in logs.glob(f"run_id=*/task_id={task_id}/attempt=*.log"):
        try:
            if text in path.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            continue
    return False
