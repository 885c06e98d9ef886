"""``SparkPreCommitOperator`` inside a real DAG run (``dag.test()``, Airflow 3, SQLite metadata DB).

The DAG runs in a child process with its own ``AIRFLOW_HOME``: Airflow reads its configuration at
import, and the other suites may already have imported it with theirs.
"""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig
from airflow_provider_exactly_once.core.precommit import COMPRESSED_PREFIX, PreCommit
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.operators.spark_precommit import (
    EPOCH_WRITER_APPLICATION,
    SparkPreCommitOperator,
    xcom_value,
)
from airflow_provider_exactly_once.runtime.assembly import run_epoch
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, TableSelect
from airflow_provider_exactly_once.spark.jobspec import IcebergTarget
from airflow_provider_exactly_once.version_compat import AirflowFailException
from tests.spark.conftest import INTERVAL_START, land, make_table, run_dag_file, sample_rows
from tests.spark.test_epoch_writer import commit_iceberg, files_input, sorted_rows

DAG_SCRIPT = textwrap.dedent(
    """
    import datetime as dt, json, os, sys
    from airflow.sdk import DAG
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.timetables.interval import CronDataIntervalTimetable
    from airflow_provider_exactly_once.core.precommit import COMPRESSED_PREFIX, PreCommit
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator

    settings = json.loads(os.environ["EO_TEST_SETTINGS"])

    def keep(ti, **_):
        values = {task: ti.xcom_pull(task_ids=task) for task in ("write", "write_files")}
        for value in values.values():
            PreCommit.parse(value)
        with open(settings["result"], "w") as f:
            json.dump(values, f)

    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "768m",
        "spark.executor.memory": "512m",
        "spark.pyspark.python": sys.executable,
    }

    with DAG(
        "eo_spark_write",
        schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
        start_date=dt.datetime(2023, 12, 1, tzinfo=dt.timezone.utc),
        catchup=False,
    ) as dag:
        write = SparkPreCommitOperator(
            task_id="write",
            conn_id="spark_local",
            # the table and its catalog come from the sink and its Iceberg connection, read when the task runs
            sink=settings["sink"],
            input=settings["input"],
            xcom_compress_above=1024,  # this run's metadata is larger: XCom carries the compressed form
            conf=conf,
        )
        write_files = SparkPreCommitOperator(
            task_id="write_files",
            conn_id="spark_standalone",  # the standalone master, client deploy mode
            total_executor_cores=1,
            sink=settings["file_sink"],
            input=settings["input"],
            conf=conf,
        )
        [write, write_files] >> PythonOperator(task_id="keep", python_callable=keep)

    if __name__ == "__main__":
        # a manual run at 2024-01-02 gets the data interval [2024-01-01, 2024-01-02)
        run = dag.test(logical_date=dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc))
        print("DAG RUN STATE", run.state)
    """
)


def test_operator_in_a_dag_run_puts_the_pre_commit_in_xcom(
    airflow_env: dict[str, str], standalone: str, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Two write tasks in one DAG run: an Iceberg table through local[2], a file sink through a
    standalone master in client deploy mode; a downstream task reads both from XCom."""
    rows = sample_rows(500)
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.orders", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    result_file = tmp_path / "result.json"
    settings = {
        "input": files_input(tmp_path / "landing"),
        # the fixture's catalog is named "default": the connection id names the catalog, as in IcebergHook
        "sink": {"kind": "iceberg", "sink_id": "orders", "tables": ["ns.orders"], "iceberg_conn_id": "default"},
        "file_sink": {"kind": "files", "sink_id": "orders-files", "root": str(tmp_path / "sink")},
        "result": str(result_file),
    }
    host, port = standalone.rsplit(":", 1)
    connection = {"conn_type": "spark", "host": host, "port": int(port), "extra": {"deploy-mode": "client"}}

    output = run_dag_file(
        airflow_env,
        "eo_spark_write",
        DAG_SCRIPT,
        settings,
        spark_standalone=connection,
        default={"conn_type": "iceberg", "extra": catalog_props},
    )
    assert "DAG RUN STATE success" in output, output[-5000:]
    assert f"--master {standalone}" in output and "--deploy-mode client" in output
    result = json.loads(result_file.read_text())
    assert isinstance(result["write"], str) and result["write"].startswith(COMPRESSED_PREFIX)
    pre_commit = PreCommit.parse(result["write"])
    assert pre_commit.sink_id == "orders"
    assert pre_commit.epoch == epoch_from_interval_start(INTERVAL_START)
    assert pre_commit.record_count == 500
    assert "/data/_eo/" + pre_commit.write_id in pre_commit.tables[0].location
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.orders").scan().to_arrow()) == sorted_rows(rows)

    files = PreCommit.parse(result["write_files"])
    assert isinstance(result["write_files"], dict)  # small enough to stay readable JSON
    assert files.sink_id == "orders-files" and files.record_count == 500
    assert files.tables[0].location == f"{tmp_path / 'sink'}/_staging/{files.write_id}"
    assert files.write_id != pre_commit.write_id


def test_operator_defaults() -> None:
    operator = SparkPreCommitOperator(
        task_id="w", sink=FileSinkConfig("s", "/x"), input={"kind": "sql", "query": "select 1"}
    )
    assert operator.application == EPOCH_WRITER_APPLICATION and Path(EPOCH_WRITER_APPLICATION).is_file()
    assert operator.durable is False  # a retry is a new write, never a re-attach to the old driver


def test_operator_without_interval_allocates_the_runs_epoch_in_the_meta_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manual run of an unscheduled DAG has no data interval: the write task must arrive at the
    epoch every other task of the run allocates for its run id, before anything is submitted."""
    import json

    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'meta.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_EO_SPARK_META", json.dumps({"conn_type": "exactly_once_meta", "host": url}))
    operator = SparkPreCommitOperator(
        task_id="w",
        sink=FileSinkConfig("s", "/x"),
        input={"kind": "sql", "query": "select 1"},
        writers=0,  # refused after the epoch is known, before any submit
        meta_conn_id="eo_spark_meta",
        work_dir=str(tmp_path),
    )
    context: dict[str, Any] = {"data_interval_start": None, "data_interval_end": None, "run_id": "manual__1"}
    with pytest.raises(AirflowFailException, match=r"(?s)InvalidSinkConfig.*writers"):
        operator.execute(context)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        allocated = (
            conn.execute(sa.text("select epoch from epoch_allocation where run_id = 'manual__1'")).scalars().all()
        )
    engine.dispose()
    assert len(allocated) == 1
    assert run_epoch(context, "s", "eo_spark_meta") == allocated[0]


def test_operator_refuses_bad_writer_settings_before_submitting(tmp_path: Path) -> None:
    operator = SparkPreCommitOperator(
        task_id="w",
        sink=FileSinkConfig("s", "/x"),
        input={"kind": "sql", "query": "select 1"},
        writers=0,
        work_dir=str(tmp_path),
    )
    # a configuration error is not retried: a retry would fail the same way
    with pytest.raises(AirflowFailException, match=r"(?s)InvalidSinkConfig.*writers"):
        operator.execute({"data_interval_start": INTERVAL_START, "data_interval_end": INTERVAL_START})
    assert list(tmp_path.iterdir()) == []


def test_the_target_is_derived_from_the_sink_when_the_task_runs_and_never_rendered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    props = {
        "type": "sql",
        "uri": "sqlite:////secret/catalog.db",
        "warehouse": "file:///w",
        "s3.secret-access-key": "K",
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "iceberg", "extra": props}))
    sink = IcebergSinkConfig("orders", ("ns.orders",), iceberg_conn_id="lake", allow_schema_evolution=True)
    operator = SparkPreCommitOperator(task_id="w", sink=sink, input={"kind": "sql", "query": "select 1"})
    assert operator.sink_id == "orders" and operator.allow_schema_evolution is True
    rendered = {name: getattr(operator, name) for name in operator.template_fields}
    assert "K" not in json.dumps(rendered, default=str) and operator.target_spec is None
    assert operator._resolve_targets() == [
        {"kind": "iceberg", "catalog_name": "lake", "catalog_properties": props, "table": "ns.orders", "branch": "main"}
    ]
    files = SparkPreCommitOperator(
        task_id="f",
        sink={"kind": "files", "sink_id": "f", "root": "/data/out/"},
        input={"kind": "sql", "query": "select 1"},
        partition_by=["day"],
    )
    (target,) = files._resolve_targets()
    assert target["root"] == "/data/out" and target["partition_by"] == ["day"]


def test_a_fan_out_sink_is_one_write_of_every_table_with_its_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    props = {"type": "sql", "uri": "sqlite:////secret/catalog.db", "s3.secret-access-key": "K"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "iceberg", "extra": props}))
    sink = IcebergSinkConfig(
        "fan",
        ("ns.all", "ns.buys", "ns.totals"),
        iceberg_conn_id="lake",
        select={
            "ns.buys": TableSelect(where="event_type = 'purchase'"),
            "ns.totals": TableSelect(query="SELECT user_id, sum(amount) AS total FROM epoch_input GROUP BY user_id"),
        },
    )
    operator = SparkPreCommitOperator(
        task_id="w", sink=sink.model_dump(mode="json"), input={"kind": "sql", "query": "select 1"}
    )
    rendered = {name: getattr(operator, name) for name in operator.template_fields}
    assert "K" not in json.dumps(rendered, default=str)
    base = {"kind": "iceberg", "catalog_name": "lake", "catalog_properties": props, "branch": "main"}
    assert operator._resolve_targets() == [
        {**base, "table": "ns.all"},
        {**base, "table": "ns.buys", "where": "event_type = 'purchase'"},
        {**base, "table": "ns.totals", "query": sink.select["ns.totals"].query},
    ]


def test_an_upsert_sinks_key_and_branch_reach_the_job_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "iceberg", "extra": {"type": "sql", "uri": "x"}}))
    sink = IcebergSinkConfig(
        "cdc", ("ns.accounts",), iceberg_conn_id="lake", branch="audit", upsert=UpsertSpec(key=("id",), op_column="op")
    )
    operator = SparkPreCommitOperator(
        task_id="w", sink=sink.model_dump(mode="json"), input={"kind": "sql", "query": "select 1"}
    )
    (target,) = operator._resolve_targets()
    assert target["branch"] == "audit"
    assert IcebergTarget.model_validate(target).upsert == sink.upsert


@pytest.mark.parametrize(
    ("kwargs", "refusal"),
    [
        ({"sink": IcebergSinkConfig("s", ("a.b",)), "partition_by": ["x"]}, "partitioned by its table"),
        ({"sink": IcebergSinkConfig("s", ("a.b",)), "target": {"kind": "files", "root": "/x"}}, "derived"),
        ({"sink": FileSinkConfig("s", "/x"), "target": {"kind": "files", "root": "/y"}}, "not the sink's root"),
    ],
)
def test_contradictory_arguments_are_refused_when_the_dag_is_parsed(kwargs: dict[str, Any], refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=refusal):
        SparkPreCommitOperator(task_id="w", input={"kind": "sql", "query": "select 1"}, **kwargs)


def test_the_removed_raw_spelling_is_refused_naming_the_sink_form() -> None:
    for removed in ({"sink_id": "s", "target": {"kind": "files", "root": "/x"}}, {"allow_schema_evolution": True}):
        with pytest.raises(
            TypeError, match=r"SparkPreCommitOperator\((sink_id|allow_schema_evolution)=\) was removed: .*sink"
        ):
            SparkPreCommitOperator(
                task_id="w", sink=FileSinkConfig("s", "/x"), input={"kind": "sql", "query": "select 1"}, **removed
            )


def test_a_bad_rendered_sink_id_is_refused_before_anything_reads_the_store(tmp_path: Path) -> None:
    operator = SparkPreCommitOperator(
        task_id="w", sink=FileSinkConfig("s", "/x"), input={"kind": "sql", "query": "select 1"}, work_dir=str(tmp_path)
    )
    operator.sink_id = "../etc"  # as a template could render it
    with pytest.raises(AirflowFailException, match=r"sink_id '\.\./etc' has characters unsafe in a path"):
        operator.execute({"data_interval_start": INTERVAL_START, "data_interval_end": INTERVAL_START})
    assert list(tmp_path.iterdir()) == []


def test_xcom_value_of_ten_thousand_files_stays_small(tmp_path: Path) -> None:
    """10,000 descriptors of real files: the XCom value is compressed and parses back unchanged."""
    import pyarrow.parquet as pq

    from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
    from tests.spark.conftest import TABLE_SCHEMA

    location = f"file://{tmp_path}/data/_eo/0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e"
    files = []
    for i in range(20):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(sample_rows(50 + i).cast(_with_ids(sample_rows(50).schema)), path)
        files.append(describe_parquet_file(str(path), table_schema=TABLE_SCHEMA, partition={"ts_day": 19723 + i % 5}))
    descriptors = [
        files[i % 20].model_copy(
            update={"path": f"{location}/ts_day={i % 5}/{i % 8:05d}-0-{i:012x}.parquet", "writer": f"{i % 8:05d}-0"}
        )
        for i in range(10_000)
    ]
    pre_commit = PreCommit.parse(
        {
            "sink_id": "s",
            "epoch": 1,
            "write_id": "0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e",
            "tables": [{"table": "ns.t", "location": location, "data_files": [d.model_dump() for d in descriptors]}],
        }
    )
    plain = len(pre_commit.model_dump_json(exclude_defaults=True))
    value = xcom_value(pre_commit)
    assert isinstance(value, str)
    assert len(value) < plain / 4, (len(value), plain)
    assert PreCommit.parse(value) == pre_commit
    with pytest.raises(InvalidPreCommit, match="compressed form"):
        PreCommit.parse(value[: len(value) // 2])
    small = xcom_value(
        pre_commit.model_copy(
            update={"tables": [pre_commit.tables[0].model_copy(update={"data_files": DataFiles(descriptors[:3])})]}
        )
    )
    assert isinstance(small, dict) and PreCommit.parse(small).record_count == sum(
        d.record_count for d in descriptors[:3]
    )


def _with_ids(schema: Any) -> Any:
    import pyarrow as pa

    return pa.schema(
        [field.with_metadata({b"PARQUET:field_id": str(i + 1).encode()}) for i, field in enumerate(schema)]
    )


def test_a_kept_sink_skips_the_spark_job_of_a_newer_generation_and_says_so(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_reprocess="keep"``: a cleared run finds its epoch committed and submits nothing."""
    import datetime as dt
    import types

    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.epochs import CheckpointStatus
    from tests.support.pipeline import Pipeline

    pipeline: Pipeline = world.pipeline
    sink = world.iceberg_sink().model_copy(update={"on_reprocess": "keep"})
    pipeline.create_table("orders")
    start = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    epoch = epoch_from_interval_start(start)
    first = pipeline.write_iceberg(sink.sink_id, epoch, ["orders"]).model_copy(
        update={"generation": "2024-06-02T00:00:00.000000Z/0000000000"}
    )
    coordinator = TwoPhaseCommitCoordinator(
        pipeline.store, {sink.sink_id: pipeline.iceberg_committer()}, pipeline.checkpoints
    )
    coordinator.persist(first)
    pipeline.checkpoint(sink.sink_id, epoch, CheckpointStatus.COMPLETED)
    coordinator.commit(sink.sink_id, epoch)

    op = SparkPreCommitOperator(
        task_id="write", sink=sink, input=files_input(Path("/nowhere")), meta_conn_id=world.meta_conn_id
    )
    submitted: list[object] = []
    monkeypatch.setattr(
        "airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator.execute",
        lambda self, context: submitted.append(context),
    )
    cleared = types.SimpleNamespace(start_date=dt.datetime(2024, 6, 3, tzinfo=dt.UTC), run_after=start, clear_number=1)
    context = {"data_interval_start": start, "data_interval_end": start, "dag_run": cleared, "run_id": "cleared"}

    value = op._execute(context)

    assert submitted == []  # no Spark job for a write persist would only discard
    assert PreCommit.parse(value).write_id == first.write_id
    row = pipeline.store.get(sink.sink_id, epoch)
    assert row is not None and row.warning is not None
    assert row.warning.startswith("run cleared: ") and "on_reprocess='keep'" in row.warning

    # a retry inside the committed write's own generation is no reprocess: it writes as usual
    assert op._kept_write(epoch, "2024-06-02T00:00:00.000000Z/0000000000", "first") is None


def test_a_reprocessed_upsert_epoch_is_planned_as_a_revision_of_the_committed_write(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upsert sink replacing on reprocess: a cleared run finds its epoch committed as changes by
    key, and its Spark job gets the committed write to revise and the table state to plan at."""
    import datetime as dt
    import types
    import uuid

    from airflow_provider_exactly_once.core.precommit import TableWrite
    from airflow_provider_exactly_once.core.upserts import ChangeCounts, RewrittenFile

    sink = world.iceberg_sink().model_copy(update={"upsert": UpsertSpec(key=("id",))})
    start = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    epoch = epoch_from_interval_start(start)
    write_id = str(uuid.uuid4())
    location = f"/lake/t/_eo/{write_id}"
    committed = PreCommit(
        sink_id=sink.sink_id,
        epoch=epoch,
        write_id=write_id,
        generation="2024-06-02T00:00:00.000000Z/0000000000",
        tables=[
            TableWrite(
                table=world.table,
                location=location,
                rewritten=[RewrittenFile(path="/lake/t/data/old.parquet", record_count=3)],
                read_snapshot_id=7,
                key_lower_bounds={"id": "AQAAAAAAAAA="},
                key_upper_bounds={"id": "AgAAAAAAAAA="},
                changes=ChangeCounts(updated=1),
            )
        ],
    )
    store = world.pipeline.store
    store.insert_pending(committed, run_id="first", try_number=1)
    store.decide_commit(sink.sink_id, epoch, write_id=write_id)
    store.mark_committed(sink.sink_id, epoch, write_id=write_id, committed={world.table: "123"})

    op = SparkPreCommitOperator(
        task_id="write", sink=sink, input=files_input(Path("/nowhere")), meta_conn_id=world.meta_conn_id
    )
    specs: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator.execute",
        lambda self, context: specs.append(json.loads(Path(self.application_args[0]).read_text())),
    )
    cleared = types.SimpleNamespace(start_date=dt.datetime(2024, 6, 3, tzinfo=dt.UTC), run_after=start, clear_number=1)
    context = {"data_interval_start": start, "data_interval_end": start, "dag_run": cleared, "run_id": "cleared"}

    with pytest.raises(RuntimeError, match="left no pre-commit metadata"):  # no Spark job ran
        op._execute(context)

    (target,) = specs[0]["targets"]
    assert target["revision"] == {
        "write_id": write_id,
        "added": [],
        "rewritten": ["/lake/t/data/old.parquet"],
        "key_lower_bounds": {"id": "AQAAAAAAAAA="},
        "key_upper_bounds": {"id": "AgAAAAAAAAA="},
        "parent_of": 123,  # planned at the table just before the committed write's snapshot
        "snapshot_id": None,
        "table_uuid": None,  # the row recorded no table identity: the Spark job does not compare
    }
    # a retry inside the committed write's generation writes as usual
    first = types.SimpleNamespace(start_date=dt.datetime(2024, 6, 2, tzinfo=dt.UTC), run_after=start, clear_number=0)
    with pytest.raises(RuntimeError, match="left no pre-commit metadata"):
        op._execute({**context, "dag_run": first, "run_id": "first"})
    assert specs[1]["targets"][0]["revision"] is None


FAILING_DAG_SCRIPT = textwrap.dedent(
    """
    import datetime as dt, json, os, sys
    from airflow.sdk import DAG
    from airflow_provider_exactly_once import MetaStoreCheckpoint, SparkWrite, SqlInput, exactly_once_epoch

    settings = json.loads(os.environ["EO_TEST_SETTINGS"])
    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "768m", "spark.pyspark.python": sys.executable}

    with DAG("eo_failing_write", schedule="@daily", start_date=dt.datetime(2023, 12, 1, tzinfo=dt.timezone.utc),
             catchup=False) as dag:
        exactly_once_epoch(
            SparkWrite(SqlInput(query=settings["query"]), conn_id="spark_local", conf=conf, retries=1,
                       retry_delay=dt.timedelta(0)),
            sink=settings["sink"],
            checkpoint=MetaStoreCheckpoint(),
            meta_conn_id="eo_meta",
            group_id="orders",
            commit_retries=0,
        )

    if __name__ == "__main__":
        run = dag.test(logical_date=dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc))
        print("DAG RUN STATE", run.state)
    """
)


def test_a_write_that_spark_refuses_leaves_sparks_error_on_its_epoch(
    airflow_env: dict[str, str], tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Design.md D22 with real spark-submit: the epoch of a write whose query overflows a cast says,
    on its row and in its history, which task failed on which try with Spark's own error."""
    from airflow_provider_exactly_once.store import SqlSinkStateStore

    make_table(catalog, "ns.orders")
    meta = f"sqlite:///{tmp_path / 'meta.db'}"
    settings = {
        "query": "SELECT CAST(1e32 AS BIGINT) AS id, 'x' AS name, current_timestamp() AS ts, CAST(1 AS DOUBLE) AS amount",
        "sink": {"kind": "iceberg", "sink_id": "orders", "tables": ["ns.orders"], "iceberg_conn_id": "default"},
    }
    output = run_dag_file(
        airflow_env,
        "eo_failing_write",
        FAILING_DAG_SCRIPT,
        settings,
        default={"conn_type": "iceberg", "extra": catalog_props},
        eo_meta={"conn_type": "exactly_once_meta", "host": meta},
    )
    assert "DAG RUN STATE failed" in output, output[-5000:]
    store = SqlSinkStateStore(meta)
    try:
        epoch = epoch_from_interval_start(dt.datetime(2024, 1, 2, tzinfo=dt.UTC))  # a manual run's logical date
        row = store.get("orders", epoch)
        events = [(e.event.value, e.actor.name, e.actor.try_number) for e in store.history.events("orders", epoch)]
        reasons = [e.reason or "" for e in store.history.events("orders", epoch)]
    finally:
        store.dispose()
    assert row is not None and row.status.value == "Aborted" and row.error is not None, output[-8000:]
    assert row.error.startswith("write failed on try 2: ") and "[CAST_OVERFLOW]" in row.error, row.error
    assert events[:2] == [
        ("try failed", "eo_failing_write.orders.write", 1),
        ("error", "eo_failing_write.orders.write", 2),
    ]
    assert all("[CAST_OVERFLOW]" in reason and "epoch writer failed" not in reason for reason in reasons[:2]), reasons
