"""One epoch through the exactly-once DAG against the same Spark job committing directly.

Both sides run through Airflow's ``dag.test()`` in this process (Airflow DB, meta store and Iceberg
catalog are SQLite files under a temporary root; ``spark-submit`` is real, ``local[2]``), read the
same landed JSON-lines files of one hour, and run the same Spark application (the epoch writer,
through ``SparkPreCommitOperator`` with the same settings) into two tables of the same schema and
partitioning (``day(event_time)``, as ``dags/hourly_events.py``):

- **exactly-once**: ``write >> exactly_once_epoch(...)``: write (spark-submit), persist (the Pending
  row), wait (``CheckpointSensor`` on the hour's ``_SUCCESS``, which is already there), commit (the
  coordinator: commit decision, marker walk, one snapshot with the marker, Committed row);
- **direct** (at-least-once): one task, the same operator followed in the same task by a bare
  pyiceberg fast-append of the files the job wrote (no meta store, no sensor, no marker).

``--stack s3`` puts the tables behind SeaweedFS's Iceberg REST catalog with their files on its S3,
and the landed hours and their markers on its S3 too (``demo.stacks.S3Stack``: the connections a
user defines for that platform): the executors read and write ``s3://`` through pyarrow, the
sensor reads the marker through the ``aws`` connection, the commit is HTTP round trips.

What differs is exactly the exactly-once machinery: three more tasks (persist, sensor, commit) and
what they do. Each repetition lands a fresh hour (the same rows, hard-linked) and runs both sides,
alternating which goes first; the report gives medians of the run's wall time (``dag.test()`` call),
rows/s, the direct/exactly-once throughput ratio, and where the exactly-once run's extra time goes
(task durations from the task instances, and the time between tasks).

    uv run python -m bench.e2e_epoch [--rows 1000000 10000000] [--reps 3] [--stack local|s3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._world import RESULTS, save

FIRST_HOUR = dt.datetime(2024, 6, 1, 0, tzinfo=dt.UTC)
FILES_PER_HOUR = 4
EVENT_SCHEMA = "event_id STRING, user_id BIGINT, event_type STRING, event_time TIMESTAMP, amount DOUBLE"
TYPES = ("view", "click", "purchase")
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "2g",
}
EO_TABLE, DIRECT_TABLE = "bench.events_eo", "bench.events_direct"
SINK_ID = "bench-e2e-epoch"


def land(directory: Path, hour: dt.datetime, rows: int) -> None:
    """``rows`` JSON-lines events inside ``hour``, in ``FILES_PER_HOUR`` files."""
    directory.mkdir(parents=True, exist_ok=True)
    base = hour.replace(tzinfo=None)
    step_us = 3_600_000_000 // rows
    handles = [(directory / f"events-{n:03d}.json").open("w", encoding="utf-8") for n in range(FILES_PER_HOUR)]
    try:
        for i in range(rows):
            at = (base + dt.timedelta(microseconds=i * step_us)).isoformat()
            kind = TYPES[i % 3]
            amount = f"{(i % 20000) / 100:.2f}" if kind == "purchase" else "null"
            handles[i % FILES_PER_HOUR].write(
                f'{{"event_id":"e{i:09d}","user_id":{i % 500},"event_type":"{kind}",'
                f'"event_time":"{at}Z","amount":{amount}}}\n'
            )
    finally:
        for handle in handles:
            handle.close()


def link_hour(source: Path, target: Path) -> None:
    """The same landed rows for another hour (the writer does not filter rows by time)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("events-*.json"):
        os.link(path, target / path.name)
    (target / "_SUCCESS").write_text("")


class Landing:
    """Where the hours are landed: a local directory, or a prefix on S3 (``s3fs`` options given)."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root = root
        self.fs: Any = None
        if storage_options is not None:
            import s3fs

            self.fs = s3fs.S3FileSystem(**storage_options, skip_instance_cache=True)

    def hour(self, hour: dt.datetime) -> str:
        return f"{self.root}/{hour:%Y/%m/%d/%H}"

    def land(self, scratch: Path, hour: dt.datetime, rows: int) -> int:
        """Land ``rows`` events and the hour's ``_SUCCESS``; the input's bytes."""
        if self.fs is None:
            directory = Path(self.hour(hour))
            land(directory, hour, rows)
            (directory / "_SUCCESS").write_text("")
            settle(directory)
            return sum(p.stat().st_size for p in directory.glob("events-*.json"))
        staged = scratch / f"{hour:%Y%m%d%H}"
        land(staged, hour, rows)
        for path in sorted(staged.glob("events-*.json")):
            self.fs.put_file(str(path), f"{self.hour(hour)}/{path.name}")
        self.fs.pipe_file(f"{self.hour(hour)}/_SUCCESS", b"")
        size = sum(p.stat().st_size for p in staged.glob("events-*.json"))
        for path in staged.glob("events-*.json"):
            path.unlink()
        return size

    def copy(self, source: dt.datetime, target: dt.datetime) -> None:
        """The same landed rows for another hour (the writer does not filter rows by time)."""
        if self.fs is None:
            link_hour(Path(self.hour(source)), Path(self.hour(target)))
            return
        for key in self.fs.ls(self.hour(source), refresh=True):
            name = key.rsplit("/", 1)[-1]
            if name.startswith("events-"):
                self.fs.copy(key, f"{self.hour(target)}/{name}")
        self.fs.pipe_file(f"{self.hour(target)}/_SUCCESS", b"")


def settle(directory: Path) -> None:
    """Flush the landed files to disk and read them once, so that neither side runs against the
    write-back of gigabytes just landed or a colder page cache than the other side (at 10M rows the
    first run after landing was seen taking five times as long as the second)."""
    os.sync()
    for path in directory.glob("events-*.json"):
        with path.open("rb") as handle:
            while handle.read(1 << 24):
                pass


def create_tables(catalog: Any) -> None:
    """The example's events table, day-partitioned like ``dags/hourly_events.py``'s, twice."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    from fault_harness.harness import EVENT_SCHEMA

    spec = PartitionSpec(PartitionField(4, 1000, DayTransform(), "event_day"))
    catalog.create_namespace_if_not_exists("bench")
    for name in (EO_TABLE, DIRECT_TABLE):
        catalog.create_table(name, EVENT_SCHEMA, partition_spec=spec)


def build_dags(landing: str, storage_conn_id: str | None = None) -> tuple[Any, Any]:
    """The two DAGs; built after ``world.enter`` because importing Airflow reads its configuration."""
    return (
        build_eo_dag(landing, "bench_e2e_exactly_once", SINK_ID, EO_TABLE, storage_conn_id=storage_conn_id),
        build_direct_dag(landing),
    )


def _writer(cls: Any, task_id: str, sink: Any, landing: str, spark_conn_id: str) -> Any:
    # The target comes from the sink's Iceberg connection when the task runs (as in the example
    # DAG): a REST catalog's credentials never pass through a rendered field.
    from airflow_provider_exactly_once.spark.jobspec import FilesInput

    return cls(
        task_id=task_id,
        conn_id=spark_conn_id,
        sink=sink,
        input=FilesInput(format="json", path=landing + "/{start:%Y/%m/%d/%H}", schema_ddl=EVENT_SCHEMA),
        conf={**SPARK_CONF, "spark.pyspark.python": os.environ["PYSPARK_PYTHON"]},
    )


def _dag_settings() -> dict[str, Any]:
    from airflow.timetables.interval import CronDataIntervalTimetable

    return {
        "schedule": CronDataIntervalTimetable("@hourly", timezone="UTC"),
        "start_date": FIRST_HOUR,
        "catchup": False,
        "render_template_as_native_obj": True,
    }


def build_eo_dag(
    landing: str,
    dag_id: str,
    sink_id: str,
    table: str,
    *,
    spark_conn_id: str = "spark_default",
    storage_conn_id: str | None = None,
) -> Any:
    """The exactly-once epoch (write, persist, wait, commit) of the landed hour into ``table``,
    written through the Spark connection ``spark_conn_id`` (type ``spark``: spark-submit;
    ``spark_connect``: a Connect server)."""
    from airflow.sdk import DAG

    from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
    from airflow_provider_exactly_once.task_groups import exactly_once_epoch
    from demo.world import ICEBERG_CONN_ID

    sink = IcebergSinkConfig(sink_id, (table,), iceberg_conn_id=ICEBERG_CONN_ID)
    with DAG(dag_id, **_dag_settings()) as dag:
        exactly_once_epoch(
            _writer(SparkPreCommitOperator, "write", sink, landing, spark_conn_id),
            sink=sink,
            checkpoint=MarkerFileCheckpoint(landing + "/{start:%Y/%m/%d/%H}", storage_conn_id=storage_conn_id),
            group_id="epoch",
            sensor_kwargs={"poke_interval": 5, "timeout": 600, "mode": "poke"},
        )
    return dag


def build_direct_dag(landing: str) -> Any:
    """At-least-once: the same write, its files appended in the same task."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook
    from airflow.sdk import DAG

    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
    from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
    from demo.world import ICEBERG_CONN_ID

    class DirectAppendOperator(SparkPreCommitOperator):
        """At-least-once: the same Spark job, then its files appended as they are (no marker, no meta store)."""

        def execute(self, context: Any) -> Any:  # type: ignore[override]
            pre = PreCommit.parse(super().execute(context))
            catalog = IcebergHook(ICEBERG_CONN_ID).catalog
            for write in pre.tables:
                table = catalog.load_table(write.table)
                data_files = build_data_files(
                    write.data_files,
                    schema=table.schema(),
                    spec=table.spec(),
                    spec_id=table.spec().spec_id,
                    table=write.table,
                )
                with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                    for data_file in data_files:
                        append.append_data_file(data_file)
            return pre.record_count

    direct_sink = IcebergSinkConfig("bench-e2e-direct", (DIRECT_TABLE,), iceberg_conn_id=ICEBERG_CONN_ID)
    with DAG("bench_e2e_direct", **_dag_settings()) as direct_dag:
        _writer(DirectAppendOperator, "write_and_append", direct_sink, landing, "spark_default")
    return direct_dag


def run(dag: Any, hour: dt.datetime) -> dict[str, Any]:
    """One run of the hour; its wall time and each task's duration from its task instance."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    began = time.perf_counter()
    dr = dag.test(logical_date=hour + dt.timedelta(hours=1))
    wall = time.perf_counter() - began
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id)
        ).all()
        tasks = {
            ti.task_id: {
                "state": str(ti.state),
                "duration_s": None if ti.duration is None else float(ti.duration),
            }
            for ti in tis
        }
    if str(dr.state) != "success":
        raise RuntimeError(f"{dag.dag_id} run for {hour} ended {dr.state}: {tasks}")
    ran = sum(t["duration_s"] or 0.0 for t in tasks.values() if t["state"] == "success")
    return {"wall_s": wall, "tasks": tasks, "between_tasks_s": wall - ran}


def check(catalog: Any, rows: int, reps: int, offset: int) -> dict[str, Any]:
    """Both tables hold the rows once per run; the exactly-once one has one marked snapshot per run."""
    out = {}
    for name in (EO_TABLE, DIRECT_TABLE):
        table = catalog.load_table(name)
        snapshots = table.metadata.snapshots[offset:]
        added = [int(s.summary["added-records"]) for s in snapshots if s.summary is not None]
        assert added == [rows] * reps, (name, added)
        marked = [
            s for s in snapshots if s.summary is not None and "exactly-once.epoch" in s.summary.additional_properties
        ]
        assert len(marked) == (reps if name == EO_TABLE else 0), (name, len(marked))
        out[name] = {"snapshots": len(snapshots), "added_records": added}
    return out


def measure(
    root: Path, landing: Landing, eo_dag: Any, direct_dag: Any, rows: int, reps: int, hour_index: int
) -> dict[str, Any]:
    from demo import world

    first = FIRST_HOUR + dt.timedelta(hours=hour_index)
    began = time.perf_counter()
    input_bytes = landing.land(root / "staging", first, rows)
    landed_s = time.perf_counter() - began
    catalog = world.catalog()
    offsets = {n: len(catalog.load_table(n).metadata.snapshots) for n in (EO_TABLE, DIRECT_TABLE)}
    assert offsets[EO_TABLE] == offsets[DIRECT_TABLE]
    eo_runs: list[dict[str, Any]] = []
    direct_runs: list[dict[str, Any]] = []
    for rep in range(reps):
        hour = first + dt.timedelta(hours=rep)
        if rep:
            landing.copy(first, hour)
        order = [(eo_dag, eo_runs), (direct_dag, direct_runs)]
        for dag, runs in order if rep % 2 == 0 else reversed(order):
            runs.append(run(dag, hour))
            print(f"{rows} rows, rep {rep}, {dag.dag_id}: {runs[-1]['wall_s']:.1f}s", flush=True)
    verified = check(catalog, rows, reps, offsets[EO_TABLE])

    def med(runs: list[dict[str, Any]], task: str) -> float:
        return float(statistics.median(r["tasks"][task]["duration_s"] for r in runs))

    eo_wall = statistics.median(r["wall_s"] for r in eo_runs)
    direct_wall = statistics.median(r["wall_s"] for r in direct_runs)
    result = {
        "rows": rows,
        "reps": reps,
        "input_json_bytes": input_bytes,
        "landing_s": landed_s,
        "exactly_once": {
            "wall_s_median": eo_wall,
            "rows_per_s": rows / eo_wall,
            "breakdown_s_median": {
                "write (spark-submit)": med(eo_runs, "write"),
                "persist": med(eo_runs, "epoch.persist"),
                "wait_for_checkpoint": med(eo_runs, "epoch.wait_for_checkpoint"),
                "commit": med(eo_runs, "epoch.commit"),
                "between tasks (dag.test scheduling)": float(statistics.median(r["between_tasks_s"] for r in eo_runs)),
            },
            "runs": eo_runs,
        },
        "direct": {
            "wall_s_median": direct_wall,
            "rows_per_s": rows / direct_wall,
            "breakdown_s_median": {
                "write_and_append (spark-submit + append)": med(direct_runs, "write_and_append"),
                "between tasks (dag.test scheduling)": float(
                    statistics.median(r["between_tasks_s"] for r in direct_runs)
                ),
            },
            "runs": direct_runs,
        },
        "throughput_ratio_eo_over_direct": direct_wall / eo_wall,
        **machinery(eo_runs, direct_runs),
        "paired_ratios": [d["wall_s"] / e["wall_s"] for e, d in zip(eo_runs, direct_runs, strict=True)],
        "verified": verified,
    }
    print(
        f"{rows} rows: exactly-once {eo_wall:.1f}s ({rows / eo_wall:,.0f} rows/s), direct {direct_wall:.1f}s "
        f"({rows / direct_wall:,.0f} rows/s); exactly-once throughput = {direct_wall / eo_wall:.2f} of direct",
        flush=True,
    )
    return result


def machinery(eo_runs: list[dict[str, Any]], direct_runs: list[dict[str, Any]]) -> dict[str, float]:
    """The exactly-once machinery's own time, and the ratio it alone would give against the direct run.

    The Spark write's run-to-run spread on a shared machine (tens of seconds) is far larger than the
    machinery, so the wall-time ratio of two runs mostly measures noise; persist, wait and commit
    plus the extra time between tasks are measured per run and do not depend on the write.
    """
    per_run = [
        sum(r["tasks"][t]["duration_s"] for t in ("epoch.persist", "epoch.wait_for_checkpoint", "epoch.commit"))
        + r["between_tasks_s"]
        for r in eo_runs
    ]
    between_direct = statistics.median(r["between_tasks_s"] for r in direct_runs)
    extra = statistics.median(per_run) - between_direct
    direct_wall = statistics.median(r["wall_s"] for r in direct_runs)
    return {"machinery_s_median": extra, "ratio_from_machinery": direct_wall / (direct_wall + extra)}


def plot(results: list[dict[str, Any]], path: Path, stack: str = "local") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['rows'] / 1e6:g}M rows" for r in results]
    x = list(range(len(results)))
    left.bar([i - 0.2 for i in x], [r["direct"]["rows_per_s"] for r in results], 0.4, label="direct (at-least-once)")
    left.bar([i + 0.2 for i in x], [r["exactly_once"]["rows_per_s"] for r in results], 0.4, label="exactly-once DAG")
    for i, r in enumerate(results):
        left.annotate(f"{r['throughput_ratio_eo_over_direct']:.2f}x", (i + 0.2, r["exactly_once"]["rows_per_s"]))
    left.set_xticks(x, labels)
    left.set_ylabel("rows/s (median run)")
    where = "local disk, SQL catalog" if stack == "local" else "SeaweedFS S3, REST catalog"
    left.set_title(f"one epoch, dag.test(), spark-submit local[2], {where}")
    left.legend()
    bottom = [0.0] * len(results)
    for part in results[0]["exactly_once"]["breakdown_s_median"]:
        values = [r["exactly_once"]["breakdown_s_median"][part] for r in results]
        right.bar(x, values, 0.5, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.plot(x, [r["direct"]["wall_s_median"] for r in results], "k_", markersize=40, label="direct run, total")
    right.set_xticks(x, labels)
    right.set_ylabel("seconds (medians)")
    right.set_title("where the exactly-once run's time goes")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default=None, help="result file name (default: e2e_epoch, e2e_epoch_s3)")
    parser.add_argument("--stack", choices=("local", "s3"), default="local", help="local disk, or SeaweedFS")
    args = parser.parse_args()
    name = args.name or ("e2e_epoch" if args.stack == "local" else "e2e_epoch_s3")
    for value in [*args.rows, args.reps]:
        if value < 1:
            parser.error(f"--rows and --reps must be at least 1, got {value}")
    from demo import world
    from demo.stacks import STORAGE_CONN_ID, make_stack

    with tempfile.TemporaryDirectory(prefix="eo-bench-e2e-") as tmp:
        root = Path(tmp)
        stack = make_stack(args.stack, root)
        stack.start()
        try:
            world.enter(root, overrides=stack.environment())
            create_tables(world.catalog())
            if args.stack == "s3":
                seaweed = stack.seaweed  # type: ignore[attr-defined]
                landing = Landing(f"s3://{seaweed.bucket}/bench/landing", seaweed.s3fs_options())
                eo_dag, direct_dag = build_dags(landing.root, STORAGE_CONN_ID)
            else:
                landing = Landing(str(root / "landing"))
                eo_dag, direct_dag = build_dags(landing.root)
            from tests.support.airflow_world import register  # after world.enter: it imports Airflow

            register(eo_dag)
            register(direct_dag)
            # Not measured: the first runs in a process pay one-time imports and connection set-up.
            warm_up = FIRST_HOUR + dt.timedelta(days=60)
            landing.land(root / "staging", warm_up, 1000)
            run(eo_dag, warm_up)
            run(direct_dag, warm_up)
            results = []
            for k, rows in enumerate(args.rows):
                results.append(measure(root, landing, eo_dag, direct_dag, rows, args.reps, hour_index=k * 24))
                save(
                    name,
                    {"master": "local[2]", "stack": stack.description, "spark_conf": SPARK_CONF, "results": results},
                )
        finally:
            stack.stop()
    plot(results, RESULTS / f"{name}.png", args.stack)
    print(f"wrote {RESULTS / (name + '.json')} and its PNG")


if __name__ == "__main__":
    main()
