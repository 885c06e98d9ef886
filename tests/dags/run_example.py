"""Run an example DAG end to end in a world of its own; print what it left behind as JSON.

``python -m tests.dags.run_example <root> parse`` imports every example DAG file (DagBag) and
reports import errors and whether importing wrote anything; ``... <root> run <file> <hours> [rerun]``
lands ``hours`` hours of events, runs the DAG once per hour with ``dag.test()`` (real spark-submit,
``local[2]``), optionally reruns the last hour, and reports the sink's contents and the meta store;
``... <root> silver`` fills the bronze table with ``hourly_events.py`` for one hour, runs
``purchases_silver.py``, fills bronze's next hour, and runs the silver again. A child process, because Airflow reads its configuration once per process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from demo import world

FIRST_HOUR = dt.datetime(2024, 6, 1, 10, tzinfo=dt.UTC)
EXAMPLES = ("hourly_events.py", "fan_out.py", "file_sink.py", "purchases_silver.py", "audited_orders.py")


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def parse(root: Path) -> dict[str, Any]:
    from airflow_provider_exactly_once.version_compat import AIRFLOW_V_3_2_PLUS

    if AIRFLOW_V_3_2_PLUS:
        from airflow.dag_processing.dagbag import DagBag
    else:  # 3.1 keeps it among the models
        from airflow.models.dagbag import DagBag

    before = files_under(root)
    result: dict[str, Any] = {}
    for name in EXAMPLES:
        bag = DagBag(dag_folder=str(world.DEFAULT_DAGS_FOLDER / name))
        result[name] = {
            "errors": {k: str(v) for k, v in bag.import_errors.items()},
            "dags": {dag_id: sorted(dag.task_dict) for dag_id, dag in bag.dags.items()},
        }
    result["written_by_import"] = sorted(set(files_under(root)) - set(before))
    return result


def run(root: Path, name: str, hours: int, rerun: bool) -> dict[str, Any]:
    from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start

    landing = Path(os.environ["EO_EXAMPLES_LANDING"])
    landed = {}
    for i in range(hours):
        start = FIRST_HOUR + dt.timedelta(hours=i)
        landed[start] = len(world.land_hour(landing, start, 40 + 25 * i, seed=7))
        world.mark_hour(landing, start, completed=True)
    events = [
        json.loads(line)
        for start in landed
        for path in sorted(world.hour_dir(landing, start).glob("*.json"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    module = world.load_module(world.DEFAULT_DAGS_FOLDER / name)
    dag = world.dag_of(module)
    world.quick_retries(dag)
    starts = list(landed) + ([max(landed)] if rerun else [])
    runs = [world.run_interval(dag, start) for start in starts]

    sink_id = module.SINK.sink_id
    store = world.meta_store()
    try:
        epochs = {}
        for start in landed:
            row = store.get(sink_id, epoch_from_interval_start(start))
            epochs[str(epoch_from_interval_start(start))] = None if row is None else row.status.value
    finally:
        store.dispose()
    out: dict[str, Any] = {
        "runs": [{"state": r.state, "tasks": r.tasks} for r in runs],
        "landed": {str(epoch_from_interval_start(s)): n for s, n in landed.items()},
        "landed_by_hour": {s.isoformat(): n for s, n in landed.items()},
        "landed_ids_by_type": {
            t: sorted(e["event_id"] for e in events if e["event_type"] == t) for t in {e["event_type"] for e in events}
        },
        "epochs": epochs,
        "tables": {},
    }
    if hasattr(module.SINK, "tables"):
        catalog = world.catalog()
        for table_name in module.SINK.tables:
            table = catalog.load_table(table_name)
            per_hour, total, distinct = world.rows_per_hour(table)
            out["tables"][table_name] = {
                "rows": total,
                "distinct_ids": distinct,
                "ids": sorted(
                    str(r["event_id"]) for r in table.scan(selected_fields=("event_id",)).to_arrow().to_pylist()
                ),
                "by_hour": {h.isoformat(): n for h, n in per_hour.items()},
                "marker_snapshots": {str(e): n for e, n in world.marker_snapshots(table, sink_id).items()},
                "snapshots": len(table.metadata.snapshots),
                "partition_fields": [f.name for f in table.spec().fields],
                "metadata_files": len(
                    [p for p in Path(table.location().removeprefix("file://"), "metadata").glob("*.metadata.json")]
                ),
            }
    else:
        import pyarrow.parquet as pq

        sink_root = Path(module.SINK.root)
        finals = [p for p in sink_root.rglob("*.parquet") if not any(part.startswith("_") for part in p.parts)]
        ids = [i for p in finals for i in pq.read_table(p, columns=["event_id"]).column("event_id").to_pylist()]
        out["files"] = {
            "final_files": sorted(str(p.relative_to(sink_root)) for p in finals),
            "rows": len(ids),
            "distinct_ids": len(set(ids)),
            "staging_left": files_under(sink_root / "_staging") if (sink_root / "_staging").exists() else [],
        }
    return out


def silver(root: Path) -> dict[str, Any]:
    """Bronze by the hourly DAG, silver incrementally from it, bronze's next hour read by the
    silver's next run; each silver epoch's consumed range and the tables' purchase ids."""
    from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
    from airflow_provider_exactly_once.sinks.iceberg.markers import SOURCE_TO_KEY, marker_of

    landing = Path(os.environ["EO_EXAMPLES_LANDING"])
    world.land_hour(landing, FIRST_HOUR, 60, seed=11)
    world.mark_hour(landing, FIRST_HOUR, completed=True)
    bronze_dag = world.dag_of(world.load_module(world.DEFAULT_DAGS_FOLDER / "hourly_events.py"))
    module = world.load_module(world.DEFAULT_DAGS_FOLDER / "purchases_silver.py")
    dag = world.dag_of(module)
    for one in (bronze_dag, dag):
        world.quick_retries(one)
    runs = [world.run_interval(bronze_dag, FIRST_HOUR), world.run_interval(dag, FIRST_HOUR)]
    # The bronze DAG's next hour, appended after the silver's first run: the silver's next range.
    second_hour = FIRST_HOUR + dt.timedelta(hours=1)
    world.land_hour(landing, second_hour, 30, seed=12)
    world.mark_hour(landing, second_hour, completed=True)
    runs.append(world.run_interval(bronze_dag, second_hour))
    runs.append(world.run_interval(dag, FIRST_HOUR + dt.timedelta(hours=1)))

    def purchase_ids(name: str) -> list[str]:
        rows = catalog.load_table(name).scan(selected_fields=("event_id", "event_type")).to_arrow().to_pylist()
        return sorted(r["event_id"] for r in rows if r["event_type"] == "purchase")

    catalog = world.catalog()
    silver_table = catalog.load_table(module.SILVER)
    store = world.meta_store()
    try:
        epochs = {}
        for start in (FIRST_HOUR, FIRST_HOUR + dt.timedelta(hours=1)):
            epoch = epoch_from_interval_start(start)
            row = store.get(module.SINK.sink_id, epoch)
            epochs[str(epoch)] = {
                "status": None if row is None else row.status.value,
                "rows": None if row is None else row.pre_commit.record_count,
                "positions": None if row is None else row.pre_commit.source_positions,
            }
    finally:
        store.dispose()
    return {
        "runs": [{"state": r.state, "tasks": r.tasks} for r in runs],
        "bronze_purchases": purchase_ids(module.BRONZE),
        "second_hour_purchases": sum(
            1
            for path in sorted(world.hour_dir(landing, second_hour).glob("*.json"))
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["event_type"] == "purchase"
        ),
        "silver_purchases": purchase_ids(module.SILVER),
        "silver_rows": len(silver_table.scan(selected_fields=("event_id",)).to_arrow()),
        "bronze_snapshots": [s.snapshot_id for s in catalog.load_table(module.BRONZE).snapshots()],
        "silver_consumed_to": [
            (marker_of(s) or {}).get(SOURCE_TO_KEY) for s in silver_table.snapshots() if marker_of(s) is not None
        ],
        "epochs": epochs,
    }


def main() -> None:
    root = Path(sys.argv[1])
    world.enter(root)
    if sys.argv[2] == "parse":
        result = parse(root)
    elif sys.argv[2] == "silver":
        result = silver(root)
    else:
        result = run(root, sys.argv[3], int(sys.argv[4]), len(sys.argv) > 5 and sys.argv[5] == "rerun")
    print("RESULT-JSON " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
