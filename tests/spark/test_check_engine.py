"""The built-in audit checks under both engines (design.md D23): the same ``SqlCheck``s give the same
verdicts whether DuckDB or Spark runs them, over a real audit snapshot (the Spark epoch writer's
files, committed to the epoch's audit branch of a SQLite catalog); Spark runs in the shared local
session, as a task's local session would."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog

from airflow_provider_exactly_once.core.epochs import AuditCheck, EpochAudit
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.config import SqlCheck, as_checks
from airflow_provider_exactly_once.sinks.iceberg.audit_checks import AuditViews, EngineOpener, run_checks
from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.spark.check_engine import SparkChecks, spark_engine
from tests.spark.conftest import INTERVAL_START, job_spec, land, make_table, run_in_process
from tests.spark.test_epoch_writer import commit_iceberg, files_input, iceberg_target

SINCE = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
ENGINES = ["duckdb", "spark", "mixed"]

CHECKS = [
    SqlCheck(name="ids_present", sql="select * from epoch_rows where id is null", message="rows without an id"),
    SqlCheck(name="ten_rows", sql="select count(*) as n from epoch_rows having count(*) <> 10", message="not 10 rows"),
    SqlCheck(name="unique_ids", sql="select id, count(*) as n from events group by id having count(*) > 1 order by id"),
    SqlCheck(name="amounts_positive", sql="select id from epoch_rows where amount < 0 order by id"),
]


#: ``CHECKS`` on the bad epoch (``bad_rows``) over ``main``'s ids 100 to 105.
BAD_VERDICTS = [
    AuditCheck(name="ids_present", passed=True),
    AuditCheck(name="ten_rows", passed=False, message="not 10 rows: 1 row(s), e.g. (n=9)"),
    AuditCheck(
        name="unique_ids",
        passed=False,
        message="unique_ids failed: 6 row(s), e.g. (id=100, n=2); (id=101, n=2); (id=102, n=2) ...",
    ),
    AuditCheck(
        name="amounts_positive",
        passed=False,
        message="amounts_positive failed: 5 row(s), e.g. (id=98); (id=99); (id=100) ...",
    ),
]


def bad_rows() -> pa.Table:
    """Nine rows, six of whose ids ``main`` holds already, five with a negative amount."""
    return rows(list(range(98, 107)), lambda i: -1.0 if i < 103 else 1.0)


def rows(ids: list[int], amount: Any = None) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" for i in ids],
            "ts": pa.array([INTERVAL_START + dt.timedelta(minutes=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "amount": [float(i + 1) if amount is None else amount(i) for i in ids],
        }
    )


def spark_write(
    tmp_path: Path,
    props: dict[str, str],
    spark: Any,
    data: pa.Table,
    *,
    tables: list[dict[str, Any]] | None = None,
    sink_id: str = "sink-a",
) -> PreCommit:
    """The epoch written by the package's Spark writer (its files carry Iceberg field ids)."""
    landing = tmp_path / f"landing-{uuid.uuid4().hex[:6]}"
    land(landing, data)
    target = tables or [iceberg_target(props, "ns.events")]
    return run_in_process(spark, job_spec(tmp_path, input=files_input(landing), target=target, sink_id=sink_id))


def audited(catalog: Catalog, pre: PreCommit) -> EpochAudit:
    """The write committed to its audit branch, as ``coordinator.commit_audit`` commits it."""
    committer = IcebergSinkCommitter(catalog)
    snapshots = dict(committer.commit_audit(committer.prepare(pre), SINCE))
    return EpochAudit(write_id=pre.write_id, branch=committer.audit_branch(pre), snapshots=snapshots)


def engines(spark: Any) -> dict[Any, EngineOpener]:
    """Spark's engine on the session already active here: what a task's local session is."""
    assert spark is not None
    return {"spark": lambda: spark_engine(None, retry_seconds=60)}


def by(engine: str, checks: list[SqlCheck]) -> list[SqlCheck]:
    """The checks for one engine; ``mixed``: alternately, in one run."""
    if engine == "mixed":
        return [c.model_copy(update={"engine": ("duckdb", "spark")[n % 2]}) for n, c in enumerate(checks)]
    return [c.model_copy(update={"engine": engine}) for c in checks]


def with_events(spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]) -> Catalog:
    """``ns.events`` whose ``main`` holds ids 100 to 105, from another writer."""
    make_table(catalog, "ns.events")
    commit_iceberg(catalog, spark_write(tmp_path, catalog_props, spark, rows(list(range(100, 106))), sink_id="other"))
    return catalog


@pytest.fixture
def events(spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]) -> Catalog:
    return with_events(spark, tmp_path, catalog, catalog_props)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engines_give_the_same_verdicts_on_a_passing_and_a_failing_epoch(
    engine: str, spark: Any, tmp_path: Path, events: Catalog, catalog_props: dict[str, str]
) -> None:
    good = spark_write(tmp_path, catalog_props, spark, rows(list(range(10))))
    assert run_checks(events, good, audited(events, good), by(engine, CHECKS), engines(spark)) == [
        AuditCheck(name=c.name, passed=True) for c in CHECKS
    ]

    bad = spark_write(tmp_path, catalog_props, spark, bad_rows())
    assert run_checks(events, bad, audited(events, bad), by(engine, CHECKS), engines(spark)) == BAD_VERDICTS


@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_a_query_the_engine_refuses_fails_its_check_with_the_engines_error(
    engine: str, spark: Any, tmp_path: Path, events: Catalog, catalog_props: dict[str, str]
) -> None:
    pre = spark_write(tmp_path, catalog_props, spark, rows(list(range(10))))
    checks = [
        SqlCheck(name="typo", sql="select idd from epoch_rows", engine=engine),  # type: ignore[arg-type]
        # Spark refuses it while running it (on the executors); DuckDB has no such function.
        SqlCheck(
            name="asserted",
            sql="select id from epoch_rows where assert_true(id < 5) is null",
            engine=engine,  # type: ignore[arg-type]
        ),
        SqlCheck(name="fine", sql="select id from events where id < 0", engine=engine),  # type: ignore[arg-type]
    ]
    typo, asserted, fine = run_checks(events, pre, audited(events, pre), checks, engines(spark))
    assert not typo.passed and typo.message.startswith("the check's query failed: ") and "idd" in typo.message
    assert not asserted.passed and asserted.message.startswith("the check's query failed: ")
    if engine == "spark":  # Spark's own words, not DuckDB's
        assert "UNRESOLVED_COLUMN" in typo.message and "id < 5" in asserted.message
    assert fine == AuditCheck(name="fine", passed=True)  # the next check still runs


@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_a_fan_out_epoch_has_each_tables_view_and_its_rows_across_them(
    engine: str, spark: Any, tmp_path: Path, events: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(events, "ns.high")
    tables = [
        {**iceberg_target(catalog_props, "ns.events"), "where": "id < 4"},
        {**iceberg_target(catalog_props, "ns.high"), "where": "id >= 4"},
    ]
    pre = spark_write(tmp_path, catalog_props, spark, rows(list(range(10))), tables=tables)
    checks = by(
        engine,
        [
            SqlCheck(name="all", sql="select count(*) as n, min(id) as lo, max(id) as hi from epoch_rows"),
            SqlCheck(
                name="events", sql="select count(*) as n, min(id) as lo, max(id) as hi from events"
            ),  # main's 6 and the epoch's 4
            SqlCheck(name="high", sql="select id from high order by id"),
            SqlCheck(name="joined", sql="select e.id from events e join high h on e.id = h.id"),
        ],
    )
    found = run_checks(events, pre, audited(events, pre), checks, engines(spark))
    assert [c.message for c in found] == [
        "all failed: 1 row(s), e.g. (n=10, lo=0, hi=9)",
        "events failed: 1 row(s), e.g. (n=10, lo=0, hi=105)",
        "high failed: 6 row(s), e.g. (id=4); (id=5); (id=6) ...",
        "",
    ]


def test_spark_reads_files_with_field_ids_itself_and_others_through_pyiceberg(
    spark: Any, tmp_path: Path, events: Catalog, catalog_props: dict[str, str]
) -> None:
    """The writer's files are read by Spark's Parquet reader by field id; a file without field ids
    (imported by ``add_files``: the table's name mapping resolves it) by pyiceberg, into Spark.
    Both give the rows DuckDB reads."""
    pre = spark_write(tmp_path, catalog_props, spark, rows(list(range(10))))
    engine = SparkChecks(spark)
    try:
        for view, parts in AuditViews(events, pre, audited(events, pre)).read_by(
            "select * from epoch_rows, events", set()
        ):
            engine.register(view, parts)
        for view in ("epoch_rows", "events"):
            plan = spark.sql(f"explain select * from {view}").collect()[0][0]
            assert "FileScan parquet" in plan, plan
        count = spark.sql("select count(*), sum(id) from events").collect()[0]
        assert tuple(count) == (16, sum(range(10)) + sum(range(100, 106)))

        imported = tmp_path / "imported.parquet"
        data = rows([200, 201])
        pq.write_table(data.cast(data.schema.set(0, pa.field("id", pa.int64(), nullable=False))), imported)  # no ids
        table = events.load_table("ns.events")
        table.add_files([f"file://{imported}"])
        later = spark_write(tmp_path, catalog_props, spark, rows([301]), sink_id="later")
        engine.drop_views()
        for view, parts in AuditViews(events, later, audited(events, later)).read_by(
            "select * from epoch_rows, events", set()
        ):
            engine.register(view, parts)
        assert "FileScan parquet" in spark.sql("explain select * from epoch_rows").collect()[0][0]
        plan = spark.sql("explain select * from events").collect()[0][0]
        assert "FileScan parquet" not in plan, plan  # one file has no ids: the whole view through pyiceberg
        assert sorted(r[0] for r in spark.sql("select id from events").collect()) == [*range(100, 106), 200, 201, 301]
    finally:
        engine.drop_views()


def test_spark_checks_share_one_connection_and_duckdb_takes_none() -> None:
    with pytest.raises(ValueError, match="spark_conn_id is for engine='spark'"):
        SqlCheck(name="a", sql="select 1", spark_conn_id="spark_connect_default")
    with pytest.raises(InvalidSinkConfig, match="one spark_conn_id"):
        as_checks(
            [
                SqlCheck(name="a", sql="select 1", engine="spark", spark_conn_id="one"),
                {"name": "b", "sql": "select 1", "engine": "spark"},
            ]
        )
    checks = as_checks([{"name": "a", "sql": "select 1", "engine": "spark", "spark_conn_id": "one"}])
    assert checks[0].engine == "spark" and checks[0].spark_conn_id == "one"


def test_spark_checks_refuse_a_connection_that_is_not_spark_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run in the task: a ``spark`` connection names a ``spark-submit`` master, which
    the task cannot be a client of; the refusal says what would do."""
    from airflow_provider_exactly_once.operators.epoch import AuditChecksOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    operator = AuditChecksOperator(
        task_id="audit_checks",
        sink=IcebergSinkConfig("s", ("ns.t",), audited=True),
        checks=[SqlCheck(name="a", sql="select 1", engine="spark", spark_conn_id="spark_local")],
    )
    with pytest.raises(InvalidSinkConfig, match="'spark_local' is not a Spark Connect connection"):
        operator._spark_engine()
