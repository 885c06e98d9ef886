"""What one epoch costs an Airflow deployment, and how many epochs per hour one 2-core machine runs.

A real deployment (``fault_harness/cluster.py``: scheduler, dag-processor, triggerer, api-server,
LocalExecutor, Airflow's DB on the PostgreSQL at 127.0.0.1:5432; with ``--stack production`` the
CeleryExecutor with two Celery workers on Redis, and the lake on SeaweedFS) runs the fault harness's pipeline
(``fault_harness/pipeline.py``): the example's epoch (write, persist, wait, commit, abort on
failure) with its **light writer**: a real Parquet file written with pyarrow and described as the
Spark writer describes it, without a JVM. A Spark write costs 15-30 s of JVM here and would hide
everything this benchmark is about; ``bench.e2e_epoch`` measures the Spark side.

1. **Sensor modes.** For ``poke``, ``reschedule`` and ``deferrable`` (the pipeline's poke interval:
   2 s) the same epochs run, with the hour's ``_SUCCESS`` written ``--checkpoint-after`` seconds after
   the sensor first started. Airflow's DB is sampled every ``--sample`` seconds: worker slot-seconds
   of the sensor = time its task instance spent ``running`` (what holds a LocalExecutor slot; the
   sampling resolution is the sample period per state change), task starts per epoch = tries of
   every task instance plus one start per reschedule and per resume after a deferral.
2. **Sustained throughput.** ``--epochs`` hourly epochs (catch-up, checkpoints already complete,
   deferrable sensor, ``max_active_runs`` = ``--parallelism``): epochs per hour from the first run's
   start to the last run's end, and per epoch: the scheduler's and triggerer's CPU seconds and the
   work on Airflow's database (transactions and rows, from ``pg_stat_database``; these include the
   components' idle loops over the same time).
3. **The writer's share.** ``--writers`` runs the sustained part once per writer on the same cluster,
   one after the other: ``light`` (above), ``spark`` (the example's ``SparkPreCommitOperator``, a
   ``spark-submit`` of ``local[1]`` per epoch, as the harness runs it) and ``connect`` (the same
   operator as a client of the cluster's Spark Connect server, ``local[2]``, started and warmed once
   the cluster runs). ``--rows`` sets the rows landed per hour. With ``spark`` and ``connect`` both, the
   report gives Connect's epochs per hour over spark-submit's (issue 34's target: at least 4x).

The environment and the package are compiled to bytecode first (``bench._bytecode``): every task
start imports Airflow, and without ``.pyc`` files (this sandbox sets ``PYTHONDONTWRITEBYTECODE``)
each one compiles it from source, which no installed deployment does.

    uv run python -m bench.e2e_scheduler [--checkpoint-after 30] [--epochs-per-mode 3] [--epochs 24]
        [--stack local|production] [--name NAME] [--writers light spark connect] [--rows 12]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import psutil

from bench._bytecode import compile_bytecode
from bench._world import RESULTS, save
from demo.servers import SparkConnectServer
from demo.world import mark_hour
from fault_harness.cluster import Cluster
from fault_harness.harness import Harness, Pipeline
from fault_harness.stacks import STACKS

SENSOR = "events.wait_for_checkpoint"
MODES = ("poke", "reschedule", "deferrable")
WRITERS = {
    "light": "light (pyarrow Parquet, no JVM)",
    "spark": "SparkPreCommitOperator, a spark-submit (local[1]) per epoch",
    "connect": "SparkPreCommitOperator through a warm Spark Connect server (local[2])",
}
WAITING = {"running", "deferred", "up_for_reschedule", "queued", "scheduled"}


def _cpu_s(proc: Any) -> float:
    try:
        times = psutil.Process(proc.pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


def _db_stats(cluster: Cluster) -> dict[str, int]:
    row = cluster.query(
        "select xact_commit, tup_inserted, tup_updated, tup_deleted, tup_fetched from pg_stat_database "
        "where datname = :d",
        d=cluster.airflow_db,
    )[0]
    return {k: int(v) for k, v in row._mapping.items()}


def _per_run_tasks(cluster: Cluster, dag_id: str) -> dict[str, dict[str, Any]]:
    rows = cluster.query(
        "select run_id, task_id, state, try_number from task_instance where dag_id = :d",
        d=dag_id,
    )
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        run = out.setdefault(str(r.run_id), {"instances_run": 0, "tries": 0})
        if str(r.state) in ("success", "failed"):
            run["instances_run"] += 1
            run["tries"] += int(r.try_number)
    return out


def _task_seconds(cluster: Cluster, dag_id: str) -> dict[str, dict[str, float]]:
    """Median seconds per task: queued to started (the executor's start) and started to ended.

    The second holds what a task start costs on the worker (the interpreter, the task's imports, the
    first catalog load) beside the task's own work; for a deferrable sensor it is its two runs.
    """
    rows = cluster.query(
        "select task_id, queued_dttm, start_date, end_date from task_instance where dag_id = :d and state = 'success'",
        d=dag_id,
    )
    by_task: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        t = by_task.setdefault(str(r.task_id), {"queued_to_start_s": [], "start_to_end_s": []})
        if r.queued_dttm is not None and r.start_date is not None:
            t["queued_to_start_s"].append((r.start_date - r.queued_dttm).total_seconds())
        if r.start_date is not None and r.end_date is not None:
            t["start_to_end_s"].append((r.end_date - r.start_date).total_seconds())
    return {task: {k: round(statistics.median(v), 3) for k, v in kinds.items() if v} for task, kinds in by_task.items()}


def _require_success(cluster: Cluster, dag_id: str, runs: dict[str, str]) -> None:
    """A failed epoch would make its figures meaningless: stop, naming its task instances."""
    failed = [run_id for run_id, state in runs.items() if state != "success"]
    if failed:
        tis = [tuple(ti) for ti in cluster.task_instances(dag_id) if str(ti.run_id) in failed]
        raise RuntimeError(f"{dag_id}: run(s) {failed} did not succeed; task instances: {tis}")


def sensor_mode(
    harness: Harness, root: Path, mode: str, epochs: int, after_s: float, sample_s: float
) -> dict[str, Any]:
    """One mode's epochs, the checkpoint arriving ``after_s`` after each sensor first started."""
    cluster = harness.cluster
    pipeline = harness.add(
        Pipeline(
            f"bench_sensor_{mode}",
            epochs,
            root / f"landing-{mode}",
            sensor=mode,
            late_hours=frozenset(range(epochs)),
            max_active_runs=epochs,
        )
    )
    first_waiting: dict[str, float] = {}
    marked: set[str] = set()
    running_s: dict[str, float] = {}
    starts_extra: dict[str, int] = {}
    last_state: dict[str, str] = {}
    timeline: dict[str, list[tuple[float, str]]] = {}
    began = time.monotonic()
    last_sample = began
    while not harness.finished(pipeline):
        if time.monotonic() - began > 900:
            raise TimeoutError(f"{pipeline.dag_id}: not finished in 900 s; see {cluster.root / 'logs'}")
        cluster.check_alive()
        now = time.monotonic()
        elapsed, last_sample = now - last_sample, now
        hours = {str(r.run_id): r.data_interval_start.astimezone(dt.UTC) for r in cluster.dag_runs(pipeline.dag_id)}
        for ti in cluster.task_instances(pipeline.dag_id, SENSOR):
            run_id, state = str(ti.run_id), str(ti.state)
            if state == "running":
                running_s[run_id] = running_s.get(run_id, 0.0) + elapsed
            if state in ("deferred", "up_for_reschedule") and last_state.get(run_id) != state:
                starts_extra[run_id] = starts_extra.get(run_id, 0) + 1  # each one is followed by a new start
            if state in WAITING - {"queued", "scheduled"}:
                first_waiting.setdefault(run_id, now)
            if last_state.get(run_id) != state:
                timeline.setdefault(run_id, []).append((round(now - began, 2), state))
            last_state[run_id] = state
            if run_id in first_waiting and run_id not in marked and now - first_waiting[run_id] >= after_s:
                mark_hour(pipeline.landing, hours[run_id], completed=True)
                marked.add(run_id)
        time.sleep(sample_s)
    runs = harness.runs(pipeline)
    _require_success(cluster, pipeline.dag_id, runs)
    verdict = harness.check(pipeline)
    assert not verdict.anomalies, verdict.to_dict()["anomalies"]
    tasks = _per_run_tasks(cluster, pipeline.dag_id)
    per_epoch = [
        {
            "run_id": run_id,
            "task_instances_run": tasks[run_id]["instances_run"],
            "task_starts": tasks[run_id]["tries"] + starts_extra.get(run_id, 0),
            "sensor_slot_s": running_s.get(run_id, 0.0),
            "sensor_states": timeline.get(run_id, []),
        }
        for run_id in runs
    ]
    result = {
        "mode": mode,
        "epochs": epochs,
        "checkpoint_after_s": after_s,
        "task_instances_per_epoch": statistics.median(e["task_instances_run"] for e in per_epoch),
        "task_starts_per_epoch": statistics.median(e["task_starts"] for e in per_epoch),
        "sensor_slot_s_per_epoch": statistics.median(e["sensor_slot_s"] for e in per_epoch),
        "per_epoch": per_epoch,
        "checker": verdict.to_dict(),
    }
    print(
        f"{mode}: {result['task_instances_per_epoch']} task instances, {result['task_starts_per_epoch']} task starts, "
        f"sensor held a slot {result['sensor_slot_s_per_epoch']:.1f}s per epoch (checkpoint after {after_s:.0f}s)",
        flush=True,
    )
    return result


def idle_rates(cluster: Cluster, seconds: float) -> dict[str, dict[str, float]]:
    """CPU and Airflow-DB work per second of the components with no DAG running: their loops' floor."""
    names = ("scheduler", "triggerer", "dag-processor")
    cpu_before, db_before = {n: _cpu_s(cluster.procs[n]) for n in names}, _db_stats(cluster)
    time.sleep(seconds)
    db_after = _db_stats(cluster)
    return {
        "cpu_s_per_s": {n: (_cpu_s(cluster.procs[n]) - cpu_before[n]) / seconds for n in names},
        "airflow_db_per_s": {k: (db_after[k] - db_before[k]) / seconds for k in db_after},
    }


def throughput(
    harness: Harness,
    root: Path,
    epochs: int,
    parallelism: int,
    idle: dict[str, dict[str, float]] | None,
    *,
    writer: str = "light",
    rows: int = 12,
) -> dict[str, Any]:
    cluster = harness.cluster
    cpu_before = {name: _cpu_s(cluster.procs[name]) for name in ("scheduler", "triggerer", "dag-processor")}
    db_before = _db_stats(cluster)
    pipeline = Pipeline(
        f"bench_throughput_{writer}",
        epochs,
        root / f"landing-throughput-{writer}",
        writer=writer,
        rows=rows,
        sensor="deferrable",
        max_active_runs=parallelism,
    )
    harness.add(pipeline, start_dag=False)
    began = time.monotonic()
    harness.start_dag(pipeline)
    runs = harness.wait_finished(pipeline, timeout=3600)
    wall = time.monotonic() - began
    _require_success(cluster, pipeline.dag_id, runs)
    span = cluster.query(
        "select min(start_date) as first, max(end_date) as last from dag_run where dag_id = :d", d=pipeline.dag_id
    )[0]
    run_span_s = (span.last - span.first).total_seconds()
    verdict = harness.check(pipeline)
    assert not verdict.anomalies, verdict.to_dict()["anomalies"]
    cpu = {name: _cpu_s(cluster.procs[name]) - cpu_before[name] for name in cpu_before}
    db_after = _db_stats(cluster)
    db = {k: db_after[k] - db_before[k] for k in db_after}
    result = {
        "writer": WRITERS[writer],
        "rows_per_epoch": rows,
        "epochs": epochs,
        "parallelism": parallelism,
        "max_active_runs": parallelism,
        "first_run_start_to_last_run_end_s": run_span_s,
        "wall_from_dag_file_s": wall,
        "epochs_per_hour": epochs / run_span_s * 3600,
        "cpu_s_per_epoch": {name: value / epochs for name, value in cpu.items()},
        "airflow_db_per_epoch": {k: v / epochs for k, v in db.items()},
        "idle_rates": idle,
        "task_seconds": _task_seconds(cluster, pipeline.dag_id),
    }
    if idle is not None:
        # What the epochs themselves cost: the components' idle floor over the same time taken out.
        result["cpu_s_per_epoch_above_idle"] = {n: (cpu[n] - idle["cpu_s_per_s"][n] * wall) / epochs for n in cpu}
        result["airflow_db_per_epoch_above_idle"] = {
            k: (db[k] - idle["airflow_db_per_s"][k] * wall) / epochs for k in db
        }
    result["checker"] = verdict.to_dict()
    print(
        f"throughput ({writer}): {epochs} epochs in {run_span_s:.0f}s = {result['epochs_per_hour']:.0f} epochs/hour; "
        f"scheduler CPU {result['cpu_s_per_epoch']['scheduler']:.2f}s/epoch; "
        f"DB {result['airflow_db_per_epoch']['xact_commit']:.0f} transactions/epoch",
        flush=True,
    )
    for task, seconds in sorted(result["task_seconds"].items()):
        print(f"  {task}: {seconds}", flush=True)
    return result


def _warm(server: SparkConnectServer) -> None:
    """One Python task on the server first, untimed: its Python workers start (about 7 s here) and
    stay, as on a deployment's long-running server; spark-submit has nothing to keep warm. Through
    ``connect_session``, which takes back the Connect-only mark PySpark leaves in this process's
    environment: the cluster inherits it, and every spark-submit after it would fail."""
    from airflow_provider_exactly_once.spark.connect_write import connect_session

    with connect_session(server.url, {}) as session:
        session.range(4).mapInArrow(lambda batches: batches, "id long").collect()


def plot(report: dict[str, Any], path: Path) -> None:
    """The sensor modes' slot-seconds and task starts, and the epochs per hour of each writer run."""
    modes = [m["mode"] for m in report["sensor_modes"]]
    sustained = report.get("throughput", {})
    panels = (2 if modes else 0) + (1 if sustained else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    row = list(axes[0])
    if modes:
        slots, starts = row.pop(0), row.pop(0)
        slots.bar(modes, [m["sensor_slot_s_per_epoch"] for m in report["sensor_modes"]])
        slots.set_ylabel("worker slot-seconds per epoch (sensor)")
        slots.set_title(f"sensor, checkpoint after {report['checkpoint_after_s']:.0f} s")
        starts.bar(modes, [m["task_starts_per_epoch"] for m in report["sensor_modes"]])
        starts.set_ylabel("task starts per epoch (all tasks)")
        starts.set_title("task starts")
    if sustained:
        (rate,) = row
        rate.bar(list(sustained), [t["epochs_per_hour"] for t in sustained.values()])
        rate.set_ylabel("epochs per hour (sustained)")
        rate.set_title(f"writers, parallelism {report['parallelism']}, {report['rows_per_epoch']} rows per epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint-after", type=float, default=30.0)
    parser.add_argument("--epochs-per-mode", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=24, help="epochs of the sustained-throughput run (0: skip)")
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--sample", type=float, default=0.25, help="seconds between samples of Airflow's DB")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES, help="none: skip the sensor part")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle baseline before the throughput run")
    parser.add_argument("--name", default="e2e_scheduler", help="result file name (without extension)")
    parser.add_argument("--stack", default="local", choices=STACKS, help="production: Celery workers, SeaweedFS")
    parser.add_argument(
        "--writers", nargs="+", default=["light"], choices=list(WRITERS), help="sustained runs, in order"
    )
    parser.add_argument("--rows", type=int, default=12, help="rows landed per hour in the sustained runs")
    args = parser.parse_args()
    if args.epochs_per_mode < 1 or args.epochs < 0 or args.parallelism < 1 or args.sample <= 0:
        parser.error("--epochs-per-mode and --parallelism must be at least 1, --epochs at least 0, --sample positive")
    root = Path(__file__).resolve().parents[1]
    compile_bytecode(root / "airflow_provider_exactly_once", root / "fault_harness", root / "dags")
    cluster = Cluster.create(parallelism=args.parallelism, stack=args.stack)
    failed = True
    try:
        cluster.start_all()
        if "connect" in args.writers:
            cluster.start("spark-connect")
            _warm(cluster.stack.spark_connect)
        harness = Harness(cluster)
        try:
            report: dict[str, Any] = {
                "writer": WRITERS["light"] + " in the sensor modes",
                "stack": args.stack,
                "rows_per_epoch": args.rows,
                "poke_interval_s": 2,
                "checkpoint_after_s": args.checkpoint_after,
                "sample_s": args.sample,
                "parallelism": args.parallelism,
                "sensor_modes": [
                    sensor_mode(harness, cluster.root, mode, args.epochs_per_mode, args.checkpoint_after, args.sample)
                    for mode in args.modes
                ],
            }
            if args.epochs:
                idle = idle_rates(cluster, args.idle) if args.idle > 0 else None
                report["throughput"] = {
                    writer: throughput(
                        harness, cluster.root, args.epochs, args.parallelism, idle, writer=writer, rows=args.rows
                    )
                    for writer in args.writers
                }
                rates = {writer: t["epochs_per_hour"] for writer, t in report["throughput"].items()}
                if {"spark", "connect"} <= rates.keys():
                    report["connect_over_spark_submit_epochs_per_hour"] = rates["connect"] / rates["spark"]
                    print(f"Connect / spark-submit: {rates['connect'] / rates['spark']:.2f}x epochs per hour")
        finally:
            harness.dispose()
        failed = False
    finally:
        if failed:
            print(f"failed: the cluster's logs are kept under {cluster.root / 'logs'}", flush=True)
        cluster.close(keep_root=failed)
    report["measured_at_utc"] = dt.datetime.now(dt.UTC).isoformat()
    path = save(args.name, report)
    print(f"wrote {path}")
    if report["sensor_modes"] or report.get("throughput"):
        plot(report, RESULTS / f"{args.name}.png")
        print("and its PNG")


if __name__ == "__main__":
    main()
