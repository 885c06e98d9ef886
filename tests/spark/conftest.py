"""Fixtures for the epoch writer: one local Spark session per test session, real SQL catalogs.

Spark is the expensive part (the machine's two cores are shared), so in-process tests share one
``local[2]`` session and call the writer's ``run`` directly; only the tests about submission itself
pay for ``spark-submit``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from demo.servers import ServerUnavailable, SparkStandalone

VENV_BIN = Path(sys.executable).parent
SPARK_SUBMIT = str(VENV_BIN / "spark-submit")
APPLICATION = str(Path(__file__).resolve().parents[2] / "airflow_provider_exactly_once" / "spark" / "epoch_writer.py")
INTERVAL_START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
INTERVAL_END = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
EPOCH = 1704067200000

TABLE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "ts", TimestamptzType()),
    NestedField(4, "amount", DoubleType()),
)


def spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.update({k: v for k, v in spark_env().items() if k.startswith(("PYSPARK", "SPARK_LOCAL", "PATH"))})
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("eo-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def sample_rows(n: int, *, start: dt.datetime = INTERVAL_START, step_minutes: int = 7) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": [f"name-{i % 13}" if i % 11 else None for i in range(n)],
            "ts": pa.array(
                [start + dt.timedelta(minutes=step_minutes * i) for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
            "amount": [i * 0.25 if i % 17 else float("nan") for i in range(n)],
        }
    )


@pytest.fixture
def catalog_props(tmp_path: Path) -> dict[str, str]:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{warehouse}"}


@pytest.fixture
def catalog(catalog_props: dict[str, str]) -> Catalog:
    catalog = load_catalog("default", **catalog_props)
    catalog.create_namespace("ns")
    return catalog


def make_table(catalog: Catalog, name: str, spec: PartitionSpec | None = None, schema: Schema = TABLE_SCHEMA) -> Any:
    return catalog.create_table(name, schema, partition_spec=spec or PartitionSpec())


def land(root: Path, table: pa.Table, parts: int = 2, day: str = "2024/01/01") -> Path:
    directory = root / day
    directory.mkdir(parents=True, exist_ok=True)
    size = (table.num_rows + parts - 1) // parts
    for i in range(parts):
        pq.write_table(table.slice(i * size, size), directory / f"part-{i}.parquet")
    (directory / "_SUCCESS").write_text("")
    return directory


def job_spec(
    tmp_path: Path,
    *,
    input: dict[str, Any],
    target: dict[str, Any] | list[dict[str, Any]],
    sink_id: str = "sink-a",
    **extra: Any,
) -> EpochJobSpec:
    """A spec with one target, or with a list of them (a fan-out)."""
    return EpochJobSpec.model_validate(
        {
            "sink_id": sink_id,
            "epoch": EPOCH,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_END,
            "input": input,
            **({"targets": target} if isinstance(target, list) else {"target": target}),
            "output_path": str(tmp_path / f"out-{uuid.uuid4().hex[:6]}.json"),
            **extra,
        }
    )


def run_in_process(spark: Any, spec: EpochJobSpec) -> PreCommit:
    from airflow_provider_exactly_once.spark.epoch_writer import run

    return PreCommit.from_json(run(spark, spec, []).model_dump_json(exclude_defaults=True))


def submit(
    spec: EpochJobSpec, master: str, tmp_path: Path, *extra: str, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    spec_file = tmp_path / f"spec-{uuid.uuid4().hex[:6]}.json"
    spec_file.write_text(spec.to_json())
    command = [
        SPARK_SUBMIT,
        "--master",
        master,
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.driver.memory=768m",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        *extra,
        APPLICATION,
        str(spec_file),
    ]
    return subprocess.run(command, env=spark_env(), capture_output=True, text=True, timeout=timeout, check=False)


def files_under(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def local(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


@dataclass(frozen=True)
class StandaloneCluster:
    url: str
    #: The worker's work directory: each executor's stdout and stderr end up below it.
    work: Path


@pytest.fixture(scope="session")
def standalone(standalone_cluster: StandaloneCluster) -> str:
    return standalone_cluster.url


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A real Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1."""
    spark = SparkStandalone(tmp_path_factory.mktemp("standalone"))
    try:
        spark.start()
    except ServerUnavailable as exc:
        pytest.fail(f"standalone cluster did not come up: {exc}")
    try:
        yield StandaloneCluster(spark.url, spark.work_dir)
    finally:
        spark.stop()


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated Airflow home (SQLite) for DAG runs in child processes, with a ``spark_local`` connection."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = spark_env()
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
    )
    migrate = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    return env


def run_dag_file(
    airflow_env: dict[str, str], name: str, script: str, settings: dict[str, Any], **connections: dict[str, Any]
) -> str:
    """Run ``script`` (a DAG file that calls ``dag.test()`` under ``__main__``) in a child process of
    the migrated Airflow home, with ``settings`` as ``EO_TEST_SETTINGS`` and each connection as
    ``AIRFLOW_CONN_<NAME>``; its output, stdout then stderr."""
    dags = Path(airflow_env["AIRFLOW_HOME"]) / "dags"
    dags.mkdir(exist_ok=True)
    (dags / f"{name}.py").write_text(script)
    variables = {f"AIRFLOW_CONN_{key.upper()}": json.dumps(value) for key, value in connections.items()}
    run = subprocess.run(
        [sys.executable, str(dags / f"{name}.py")],
        env={**airflow_env, "EO_TEST_SETTINGS": json.dumps(settings), **variables},
        capture_output=True,
        text=True,
        timeout=400,
    )
    return run.stdout + run.stderr
