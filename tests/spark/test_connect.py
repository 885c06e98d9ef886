"""The write through Spark Connect: a real Connect server (``local[2]``) on a free 127.0.0.1 port,
the epoch writer's own code as its client, tables read back by DuckDB.

The server is started once for the module and stopped by its pid. A Connect session has no
``sparkContext``, no RDDs and no JVM gateway, so each test here fails if the writer reaches for one.
"""

from __future__ import annotations

import json
import os
import random
import re
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyspark.errors import PySparkException

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, SchemaMismatch, SparkUnavailable
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.operators.spark_precommit import connect_settings
from airflow_provider_exactly_once.sinks.config import SqlCheck
from airflow_provider_exactly_once.sinks.iceberg.audit_checks import run_checks
from airflow_provider_exactly_once.sinks.layout import PRE_COMMIT_FILE
from airflow_provider_exactly_once.spark import writers
from airflow_provider_exactly_once.spark.check_engine import spark_engine
from airflow_provider_exactly_once.spark.connect_write import connect_session, server_lost, write_through_connect
from airflow_provider_exactly_once.spark.epoch_writer import SESSION_SETTINGS
from demo.servers import ServerUnavailable, SparkConnectServer
from tests.spark.conftest import (
    INTERVAL_START,
    files_under,
    job_spec,
    land,
    local,
    make_table,
    run_dag_file,
    run_in_process,
    sample_rows,
)
from tests.spark.test_check_engine import BAD_VERDICTS, CHECKS, audited, bad_rows, spark_write, with_events
from tests.spark.test_epoch_writer import (
    check_descriptors_against_files,
    commit_iceberg,
    files_input,
    iceberg_target,
    sorted_rows,
)
from tests.spark.test_snapshot_range_reads import check_evolved_read
from tests.spark.test_upsert import (
    SCHEMA,
    Model,
    Upserts,
    apply_to_model,
    changes_of,
    random_epoch,
    upsert_across_schema_changes,
)
from tests.support.builders import free_port
from tests.support.independent_reader import read_rows

BY_DAY = PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day"))


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    server = SparkConnectServer(tmp_path_factory.mktemp("connect"))
    try:
        server.start({"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"})
    except ServerUnavailable as exc:
        pytest.fail(f"the Spark Connect server did not come up: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def remote(connect_server: SparkConnectServer) -> Iterator[Any]:
    """A Connect session set up as ``write_through_connect`` sets one up, for the writer's helpers."""
    with connect_session(connect_server.url, SESSION_SETTINGS) as session:
        yield session
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ  # a later spark-submit child stays classic


def test_an_epoch_written_through_connect_is_read_back_by_duckdb(
    connect_server: SparkConnectServer, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(700)
    land(tmp_path / "landing", rows)
    (tmp_path / "landing/2024/01/01/nested").mkdir()  # a subfolder's files are not the day's
    land(tmp_path / "landing/2024/01/01/nested", sample_rows(5), parts=1, day="x")
    make_table(catalog, "ns.by_day", BY_DAY)
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.by_day"))

    pre_commit = write_through_connect(connect_server.url, job)

    assert not Path(job.output_path).exists()  # the pre-commit comes back to the caller, not through a file
    assert pre_commit.write_id == job.write_id and pre_commit.record_count == 700
    assert pre_commit.source_positions is not None and pre_commit.source_positions["file_count"] == 2
    table = catalog.load_table("ns.by_day")
    check_descriptors_against_files(pre_commit, table)
    commit_iceberg(catalog, pre_commit)
    table = catalog.load_table("ns.by_day")
    assert sorted(read_rows(table, "id")) == [(i,) for i in range(700)]
    assert sorted_rows(table.scan().to_arrow()) == sorted_rows(rows)


@pytest.mark.parametrize("on_driver_up_to", [0, writers.DRIVER_DESCRIBES_UP_TO], ids=["executors", "driver"])
def test_files_are_described_on_the_servers_executors_or_by_the_client(
    remote: Any,
    tmp_path: Path,
    catalog: Catalog,
    catalog_props: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    on_driver_up_to: int,
) -> None:
    monkeypatch.setattr(writers, "DRIVER_DESCRIBES_UP_TO", on_driver_up_to)
    rows = sample_rows(300)
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.by_name", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    job = job_spec(
        tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.by_name")
    )

    pre_commit = run_in_process(remote, job)

    assert len(pre_commit.tables[0].data_files) >= 13  # one file per name at least
    check_descriptors_against_files(pre_commit, catalog.load_table("ns.by_name"))
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.by_name").scan().to_arrow()) == sorted_rows(rows)


def test_a_fan_out_and_a_file_sink_through_connect(
    remote: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(400)
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.low", BY_DAY)
    make_table(catalog, "ns.high")
    fan_out = job_spec(
        tmp_path,
        input=files_input(tmp_path / "landing"),
        target=[
            {**iceberg_target(catalog_props, "ns.low"), "where": "id < 150"},
            {**iceberg_target(catalog_props, "ns.high"), "query": "SELECT * FROM epoch_input WHERE id >= 150"},
        ],
    )
    pre_commit = run_in_process(remote, fan_out)
    assert [t.record_count for t in pre_commit.tables] == [150, 250]
    commit_iceberg(catalog, pre_commit)
    for name, part in (("ns.low", rows.slice(0, 150)), ("ns.high", rows.slice(150))):
        assert sorted(read_rows(catalog.load_table(name), "id")) == [(r,) for r in part.column("id").to_pylist()]

    files = run_in_process(
        remote,
        job_spec(
            tmp_path,
            input=files_input(tmp_path / "landing"),
            target={"kind": "files", "root": str(tmp_path / "sink"), "partition_by": ["name"]},
        ),
    )
    assert files.record_count == 400
    assert all(d.path.startswith(f"{tmp_path}/sink/_staging/{files.write_id}/") for d in files.tables[0].data_files)


def test_the_audit_checks_run_on_the_connect_server_as_they_run_on_duckdb(
    connect_server: SparkConnectServer, remote: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """``SqlCheck(engine="spark", spark_conn_id=<a spark_connect connection>)``: a Connect session
    of the checks' own reads the writer's files by field id on the server; the verdicts are
    DuckDB's, and a query the server refuses fails its check."""
    with_events(remote, tmp_path, catalog, catalog_props)
    bad = spark_write(tmp_path, catalog_props, remote, bad_rows())
    audit = audited(catalog, bad)
    typo = SqlCheck(name="typo", sql="select idd from epoch_rows")
    on_duckdb = run_checks(catalog, bad, audit, [*CHECKS, typo])
    opener = {"spark": lambda: spark_engine(connect_server.url, retry_seconds=30)}

    on_spark = run_checks(
        catalog, bad, audit, [c.model_copy(update={"engine": "spark"}) for c in [*CHECKS, typo]], opener
    )

    assert on_spark[:-1] == on_duckdb[:-1] == BAD_VERDICTS
    assert not on_spark[-1].passed and "UNRESOLVED_COLUMN" in on_spark[-1].message


def test_a_refused_write_through_connect_writes_nothing(
    connect_server: SparkConnectServer, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(20)
    land(tmp_path / "landing", rows.set_column(0, "id", pa.array([str(i) for i in range(20)])))
    make_table(catalog, "ns.strict")
    before = files_under(tmp_path / "warehouse")
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.strict"))

    with pytest.raises(SchemaMismatch, match="column 'id' is string in the input but long in the table"):
        write_through_connect(connect_server.url, job)

    assert files_under(tmp_path / "warehouse") == before


def test_upsert_epochs_through_connect_leave_the_table_equal_to_the_model(
    remote: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.accounts", SCHEMA, partition_spec=PartitionSpec())
    sink = Upserts(remote, tmp_path, catalog, catalog_props, "ns.accounts", target_file_size_bytes=4800)
    rng, model = random.Random(11), Model()
    first: list[tuple[int, str, str | None, str]] = [(k, ("eu", "us", "ap")[k % 3], f"v1-{k}", "I") for k in range(200)]
    sink.apply(changes_of(first))
    apply_to_model(model, first)
    for epoch in range(2, 4):
        rows = random_epoch(rng, model, 30, 260, epoch)
        sink.apply(changes_of(rows))
        apply_to_model(model, rows)
        assert sink.rows() == model, f"epoch {epoch}"


def test_an_upsert_through_connect_finds_its_keys_in_files_written_before_the_key_was_renamed(
    remote: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    upsert_across_schema_changes(remote, tmp_path, catalog, catalog_props)


def test_a_range_across_schema_changes_read_through_connect_reads_each_column_by_its_field_id(
    remote: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    check_evolved_read(remote, catalog, catalog_props)


@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_a_connect_server_killed_during_a_write_fails_it_and_the_retry_commits_once(
    tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], upsert: bool
) -> None:
    """kill -9 of the server while its executors write: the write task's call fails, no pre-commit
    is left, and the retry (a new write id, on the restarted server) is the one committed; whatever
    the dead write put down is an orphan the scan of write locations finds, never a table file.
    The upsert updates every row of a file the table holds: the retry rewrites it once."""
    server = SparkConnectServer(tmp_path / "connect").start({"spark.sql.shuffle.partitions": "2"})
    table = make_table(catalog, "ns.killed")
    target = iceberg_target(catalog_props, "ns.killed")
    if upsert:
        old = sample_rows(50).set_column(1, "name", pa.array([f"old{i}" for i in range(50)], pa.string()))
        table.append(old.cast(table.schema().as_arrow()))
        target["upsert"] = {"key": ["id"]}
    source = {
        "kind": "function",
        "callable": "tests.spark.user_functions:slow_rows",
        # An upsert reads its changes in its first pass: slow enough that the kill lands in it.
        "options": {"seconds_per_row": 0.4 if upsert else 0.2},
    }
    killed = job_spec(tmp_path, input=source, target=target)

    def crash_and_restart() -> None:
        server.kill()
        server.start({"spark.sql.shuffle.partitions": "2"})  # the same port: the connection is unchanged

    try:
        # By 6 s the server's Python workers are up and its executors in the slow rows. The client
        # retries an unreachable server for minutes; the restarted one no longer knows its session.
        killer = threading.Timer(6.0, crash_and_restart)
        killer.start()
        with pytest.raises(PySparkException) as caught:
            write_through_connect(server.url, killed)
        killer.join()
        assert server_lost(caught.value), repr(caught.value)  # what the operator's error names
        assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
        retry = job_spec(
            tmp_path, input={**source, "options": {"seconds_per_row": 0}}, target=killed.targets[0].model_dump()
        )
        pre_commit = write_through_connect(server.url, retry)
    finally:
        server.stop()
    commit_iceberg(catalog, pre_commit)
    table = catalog.load_table("ns.killed")
    assert sorted(read_rows(table, "id, name")) == [(i, f"n{i}") for i in range(50)]
    if upsert:
        assert pre_commit.tables[0].changes is not None and pre_commit.tables[0].changes.updated == 50
    dead = Path(local(pre_commit.tables[0].location)).parent / killed.write_id
    assert not (dead / PRE_COMMIT_FILE).exists()  # never finished: persist could never take it
    referenced = {f.file_path for task in table.scan().plan_files() for f in [task.file]}
    assert not any(str(path) in {local(p) for p in referenced} for path in dead.rglob("*"))


def test_connect_takes_session_settings_and_leaves_spark_submit_ones_to_the_server(
    connect_server: SparkConnectServer, caplog: pytest.LogCaptureFixture
) -> None:
    conf, ignored = connect_settings(
        {"conf": {"spark.sql.shuffle.partitions": 4}, "name": "x", "executor_memory": "2g", "verbose": False}
    )
    assert conf == {"spark.sql.shuffle.partitions": "4"} and ignored == ["executor_memory"]
    settings = {"spark.sql.shuffle.partitions": "3", "spark.driver.memory": "768m", "spark.ui.enabled": "false"}
    with caplog.at_level("WARNING"), connect_session(connect_server.url, settings) as session:
        assert session.conf.get("spark.sql.shuffle.partitions") == "3"
    assert "the server's to set: spark.driver.memory, spark.ui.enabled" in caplog.text
    refused = pytest.raises(InvalidSinkConfig, match=r"spark\.sql\.shuffle\.partitions='many'")
    with refused, connect_session(connect_server.url, {"spark.sql.shuffle.partitions": "many"}):
        pass


#: The token a Connect server started with ``spark.connect.authenticate.token`` lets in.
SERVER_TOKEN = "the-servers-token-42"


def test_a_server_that_refuses_the_credentials_is_said_to_refuse_them(tmp_path: Path) -> None:
    """A real server asking for a token (``spark.connect.authenticate.token``, Spark 4's pre-shared
    key): without one, or with another, its answer is UNAUTHENTICATED, which was reported as the
    server refusing the session setting ``spark.sql.session.timeZone``. PySpark sends a token only
    over a secure channel; to ``localhost`` a local one, so the wrong token is sent to that name."""
    server = SparkConnectServer(tmp_path / "connect").start({"spark.connect.authenticate.token": SERVER_TOKEN})
    try:
        for url, told in (
            (server.url, "No authentication token provided"),
            (f"sc://localhost:{server.port}/;token=not-the-token", "Invalid authentication token"),
        ):
            started = time.monotonic()
            with pytest.raises(InvalidSinkConfig) as refused, connect_session(url, SESSION_SETTINGS):
                pass
            message = str(refused.value)
            assert message.startswith("the Spark Connect server at ") and "refused the credentials" in message
            assert f"(UNAUTHENTICATED: {told})" in message and "token" in message, message
            assert "session setting" not in message and "not-the-token" not in message and "\n" not in message
            assert time.monotonic() - started < 10  # a refusal is not retried
        with connect_session(f"sc://localhost:{server.port}/;token={SERVER_TOKEN}", SESSION_SETTINGS) as session:
            assert session.conf.get("spark.sql.session.timeZone") == "UTC"  # the right token is let in
    finally:
        server.stop()


def test_an_unreachable_server_fails_the_write_within_the_configured_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the port: PySpark's own retries waited ten minutes and more before the task
    failed. ``[exactly_once] spark_connect_retry_seconds`` bounds them, and the error says the
    address, how long and how many attempts; it is retryable (the task's retry tries again)."""
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import FileSinkConfig

    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__SPARK_CONNECT_RETRY_SECONDS", "3")
    port = free_port()
    operator = SparkPreCommitOperator(
        task_id="write", sink=FileSinkConfig("files", str(tmp_path / "sink")), input=files_input(tmp_path / "in")
    )
    job = job_spec(
        tmp_path, input=files_input(tmp_path / "in"), target={"kind": "files", "root": str(tmp_path / "sink")}
    )
    started = time.monotonic()
    with pytest.raises(SparkUnavailable) as unreachable:
        operator._connect_write(f"sc://127.0.0.1:{port}", job)
    took = time.monotonic() - started
    message = str(unreachable.value)
    assert 3 <= took < 15, took
    assert message.startswith(f"the Spark Connect server at 127.0.0.1:{port} did not answer: "), message
    attempts, seconds = re.search(r"(\d+) attempt\(s\) over ([\d.]+) s", message).groups()  # type: ignore[union-attr]
    assert int(attempts) >= 3 and 3 <= float(seconds) < 5, message
    assert "[exactly_once] spark_connect_retry_seconds = 3" in message and "Connection refused" in message
    assert unreachable.value.retryable and "\n" not in message
    assert not (tmp_path / "sink").exists()  # nothing was written
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-3", "1e300", "soon"])
def test_the_connect_retry_bound_refuses_an_absurd_setting_naming_it(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_exactly_once.operators.spark_precommit import connect_retry_seconds

    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__SPARK_CONNECT_RETRY_SECONDS", value)
    with pytest.raises(ValueError, match=r"^\[exactly_once\] spark_connect_retry_seconds .* is refused: give a number"):
        connect_retry_seconds()
    monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__SPARK_CONNECT_RETRY_SECONDS")
    assert connect_retry_seconds() == 60


DAG_SCRIPT = textwrap.dedent(
    """
    import datetime as dt, json, os
    from airflow.sdk import DAG
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.timetables.interval import CronDataIntervalTimetable
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator

    settings = json.loads(os.environ["EO_TEST_SETTINGS"])

    def keep(ti, **_):
        with open(settings["result"], "w") as f:
            json.dump(ti.xcom_pull(task_ids="write"), f)

    with DAG(
        "eo_connect_write",
        schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
        start_date=dt.datetime(2023, 12, 1, tzinfo=dt.timezone.utc),
        catchup=False,
    ) as dag:
        write = SparkPreCommitOperator(
            task_id="write",
            conn_id="spark_connect_test",  # of type spark_connect: the task is a client of the server
            sink=settings["sink"],
            input=settings["input"],
            # the same settings a spark-submit write takes: the server's own are left to it
            conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "768m"},
            executor_memory="512m",
        )
        write >> PythonOperator(task_id="keep", python_callable=keep)

    if __name__ == "__main__":
        run = dag.test(logical_date=dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc))
        print("DAG RUN STATE", run.state)
    """
)


def test_the_write_operator_on_a_spark_connect_connection_writes_through_the_server(
    airflow_env: dict[str, str],
    connect_server: SparkConnectServer,
    tmp_path: Path,
    catalog: Catalog,
    catalog_props: dict[str, str],
) -> None:
    rows = sample_rows(300)
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.orders", BY_DAY)
    result_file = tmp_path / "result.json"
    settings = {
        "input": files_input(tmp_path / "landing"),
        "sink": {"kind": "iceberg", "sink_id": "orders", "tables": ["ns.orders"], "iceberg_conn_id": "default"},
        "result": str(result_file),
    }
    connection = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_server.port}
    output = run_dag_file(
        airflow_env,
        "eo_connect_write",
        DAG_SCRIPT,
        settings,
        spark_connect_test=connection,
        default={"conn_type": "iceberg", "extra": catalog_props},
    )
    assert "DAG RUN STATE success" in output, output[-5000:]
    assert "Spark-Submit cmd" not in output  # no driver of its own: the server ran the write
    assert "executor_memory shape a spark-submit driver and are not applied" in output
    pre_commit = PreCommit.parse(json.loads(result_file.read_text()))
    assert pre_commit.sink_id == "orders" and pre_commit.record_count == 300
    assert pre_commit.epoch == int(INTERVAL_START.timestamp() * 1000)
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.orders").scan().to_arrow()) == sorted_rows(rows)
