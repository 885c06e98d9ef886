"""A one-machine world for the example DAGs: environment, landed events, DAG runs, read-back.

Airflow reads its configuration when first imported, so ``enter`` must run before anything imports
Airflow; the functions after it import Airflow lazily.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import random
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The ``dags/`` folder beside this one: the repository's, or a copy's laid out the same way.
DEFAULT_DAGS_FOLDER = Path(__file__).resolve().parents[1] / "dags"
ICEBERG_CONN_ID = "iceberg_default"
EVENT_TYPES = ("view", "click", "purchase")


def environment(
    root: Path, dags_folder: Path = DEFAULT_DAGS_FOLDER, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of the demo world under ``root``: every path, connection and setting.

    ``overrides`` replace the embedded defaults (another Iceberg connection, a landing zone on S3)
    and add connections; everything else stays as the local world has it.
    """
    home = root / "airflow"
    venv_bin = str(Path(sys.executable).parent)
    catalog = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'warehouse'}"}
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        # No exactly_once_default connection: the meta store is the embedded $AIRFLOW_HOME/exactly_once/meta.db.
        f"AIRFLOW_CONN_{ICEBERG_CONN_ID.upper()}": json.dumps({"conn_type": "iceberg", "extra": catalog}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "EO_EXAMPLES_LANDING": str(root / "landing" / "events"),
        "EO_EXAMPLES_FILE_SINK_ROOT": str(root / "events_parquet"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        # spark-submit is the venv's (pyspark's) one.
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        **(overrides or {}),
    }


def enter(root: Path, dags_folder: Path = DEFAULT_DAGS_FOLDER, overrides: Mapping[str, str] | None = None) -> None:
    """Point this process at the world under ``root`` and create Airflow's metadata DB there.

    Refuses when Airflow was already imported with another home: its configuration would win and
    the runs would land in someone else's database.
    """
    env = environment(root, dags_folder, overrides)
    if "airflow.configuration" in sys.modules and os.environ.get("AIRFLOW_HOME") != env["AIRFLOW_HOME"]:
        raise RuntimeError("Airflow was imported before the demo world was entered; run the demo in its own process")
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    os.environ.update(env)

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.utils import db

    db.initdb()  # from the ORM: seconds, where replaying every migration takes much longer
    DagBundlesManager().sync_bundles_to_db()  # type: ignore[no-untyped-call]


# -- landed input ---------------------------------------------------------------------------------


def hour_dir(landing: Path, hour: dt.datetime) -> Path:
    return landing / f"{hour:%Y/%m/%d/%H}"


def land_hour(landing: Path, hour: dt.datetime, rows: int, *, files: int = 2, seed: int = 0) -> list[str]:
    """Write ``rows`` JSON-lines events inside ``hour`` as ``files`` files; their event ids."""
    ids, contents = hour_files(hour, rows, files=files, seed=seed)
    directory = hour_dir(landing, hour)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (directory / name).write_text(text, encoding="utf-8")
    return ids


def hour_files(hour: dt.datetime, rows: int, *, files: int = 2, seed: int = 0) -> tuple[list[str], dict[str, str]]:
    """The event ids of an hour and its files' names and contents, wherever they are to be landed.

    Deterministic for a given hour and seed, so a rerun of the demo lands the same input, on local
    disk or on S3 alike.
    """
    rng = random.Random(f"{seed}-{hour.isoformat()}")
    ids: list[str] = []
    lines: list[list[str]] = [[] for _ in range(files)]
    for i in range(rows):
        event_type = rng.choice(EVENT_TYPES)
        at = hour + dt.timedelta(seconds=rng.randrange(3600), microseconds=rng.randrange(1_000_000))
        event = {
            "event_id": f"{hour:%Y%m%d%H}-{i:06d}",
            "user_id": rng.randrange(1, 500),
            "event_type": event_type,
            "event_time": at.isoformat(),
            "amount": round(rng.uniform(1, 200), 2) if event_type == "purchase" else None,
        }
        ids.append(str(event["event_id"]))
        lines[i % files].append(json.dumps(event))
    return ids, {f"events-{n:03d}.json": "\n".join(chunk) + "\n" for n, chunk in enumerate(lines)}


def mark_hour(landing: Path, hour: dt.datetime, *, completed: bool) -> None:
    """The upstream's checkpoint for the hour: ``_SUCCESS``, or ``_FAILED`` when it gave up on it."""
    directory = hour_dir(landing, hour)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ("_SUCCESS" if completed else "_FAILED")).write_text("", encoding="utf-8")


# -- DAG runs -------------------------------------------------------------------------------------


def load_module(path: Path) -> Any:
    """Import a DAG file under a private module name (nothing registered, no DagBag side effects)."""
    spec = importlib.util.spec_from_file_location(f"eo_dag_{path.stem}_{uuid.uuid4().hex[:6]}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dag_of(module: Any, dag_id: str | None = None) -> Any:
    """The one DAG a DAG file's module defines (or the one named ``dag_id``)."""
    from airflow.sdk import DAG

    dags = [value for value in vars(module).values() if isinstance(value, DAG)]
    if dag_id is not None:
        dags = [d for d in dags if d.dag_id == dag_id]
    if len(dags) != 1:
        raise RuntimeError(f"{module.__file__} defines {len(dags)} DAG(s) matching {dag_id!r}, expected one")
    return dags[0]


def load_dag(path: Path, dag_id: str | None = None) -> Any:
    return dag_of(load_module(path), dag_id)


def quick_retries(dag: Any, *, retries: Mapping[str, int] | None = None) -> None:
    """No waiting between tries (a demo, not production), and optional retry counts per task id."""
    for task in dag.tasks:
        task.retry_delay = dt.timedelta(0)
        task.retry_exponential_backoff = False
        if hasattr(task, "poke_interval"):
            task.poke_interval = 1
            task.timeout = 120
    for task_id, count in (retries or {}).items():
        dag.task_dict[task_id].retries = count


@dataclass(frozen=True)
class RunResult:
    run_id: str
    state: str
    #: task id -> (state, try number)
    tasks: dict[str, tuple[str | None, int]]
    interval_start: dt.datetime | None


def run_interval(dag: Any, start: dt.datetime, interval: dt.timedelta = dt.timedelta(hours=1)) -> RunResult:
    """One ``dag.test()`` run whose data interval is ``[start, start + interval)``.

    A manual run at ``t`` of an interval timetable covers the interval that ends at ``t``.
    """
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dr = dag.test(logical_date=start + interval)
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id)
        ).all()
        tasks = {ti.task_id: (None if ti.state is None else str(ti.state), int(ti.try_number)) for ti in tis}
    return RunResult(dr.run_id, str(dr.state), tasks, dr.data_interval_start)


# -- reading back ---------------------------------------------------------------------------------


def catalog() -> Any:
    """The demo's Iceberg catalog, from the same connection the DAG's tasks use."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

    return IcebergHook(ICEBERG_CONN_ID).catalog


def rows_per_hour(table: Any) -> tuple[Counter[dt.datetime], int, int]:
    """Rows per hour of ``event_time``, total rows, distinct event ids."""
    data = table.scan(selected_fields=("event_id", "event_time")).to_arrow().to_pylist()
    hours: Counter[dt.datetime] = Counter(
        r["event_time"].astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) for r in data
    )
    return hours, len(data), len({r["event_id"] for r in data})


def marker_snapshots(table: Any, sink_id: str) -> Counter[int]:
    """Snapshots carrying this sink's marker, per epoch (the ``exactly-once.epoch`` summary property)."""
    from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, SINK_ID_KEY, marker_of

    found: Counter[int] = Counter()
    for snapshot in table.metadata.snapshots:
        marker = marker_of(snapshot)
        if marker is not None and marker[SINK_ID_KEY] == sink_id:
            found[int(marker[EPOCH_KEY])] += 1
    return found


def meta_store() -> Any:
    """The meta store the tasks use (the embedded SQLite file, as no connection is defined)."""
    from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook

    return ExactlyOnceMetaStoreHook().get_store()
