"""The epoch writer in one shared local Spark session: what it writes, what it describes, what it refuses."""

from __future__ import annotations

import datetime as dt
import os
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, IdentityTransform

from airflow_provider_exactly_once.core.errors import SchemaMismatch, UnknownTable
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.sinks.layout import PRE_COMMIT_FILE
from airflow_provider_exactly_once.spark.epoch_writer import describe_failure
from airflow_provider_exactly_once.spark.inputs import UserFunctionFailed
from tests.spark.conftest import (
    files_under,
    job_spec,
    land,
    local,
    make_table,
    run_in_process,
    sample_rows,
)

SINCE = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def files_input(landing: Path) -> dict[str, Any]:
    return {"kind": "files", "format": "parquet", "path": str(landing) + "/{start:%Y/%m/%d}"}


def iceberg_target(props: dict[str, str], table: str) -> dict[str, Any]:
    return {"kind": "iceberg", "catalog_properties": props, "table": table}


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.select(["id", "name", "ts", "amount"]).to_pylist()
    for row in rows:
        if isinstance(row["amount"], float) and row["amount"] != row["amount"]:
            row["amount"] = "nan"
    return sorted(rows, key=lambda r: r["id"])


def check_descriptors_against_files(pre_commit: PreCommit, table: Any) -> None:
    """Every descriptor says what pyiceberg and pyarrow read back from the file itself."""
    write = pre_commit.tables[0]
    assert write.data_files, "expected data files"
    for descriptor in write.data_files:
        path = local(descriptor.path)
        assert path.startswith(local(write.location) + "/")
        metadata = pq.read_metadata(path)
        assert descriptor.record_count == metadata.num_rows
        assert descriptor.file_size_in_bytes == os.path.getsize(path)
        reread = describe_parquet_file(
            descriptor.path, table_schema=table.schema(), partition=descriptor.partition, writer=descriptor.writer
        )
        assert reread == descriptor
        content = pq.read_table(path)
        ids = content.column("id")
        assert struct.unpack("<q", descriptor.bound_bytes("lower")["id"])[0] == pc.min(ids).as_py()
        assert struct.unpack("<q", descriptor.bound_bytes("upper")["id"])[0] == pc.max(ids).as_py()
        assert descriptor.null_value_counts["name"] == content.column("name").null_count
        # field ids are in the file, so pyiceberg maps columns by id, not by name
        assert content.schema.field("id").metadata[b"PARQUET:field_id"] == b"1"


def commit_iceberg(catalog: Catalog, pre_commit: PreCommit, **options: Any) -> None:
    committer = IcebergSinkCommitter(catalog, **options)
    committed = committer.commit(committer.prepare(pre_commit), SINCE)
    assert set(committed) == {write.table for write in pre_commit.tables}


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("unpartitioned", PartitionSpec()),
        ("by_name", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))),
        ("by_day", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day"))),
    ],
)
def test_iceberg_write_describes_and_commits_exactly_the_input(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], name: str, spec: PartitionSpec
) -> None:
    rows = sample_rows(1000)
    land(tmp_path / "landing", rows)
    table = make_table(catalog, f"ns.{name}", spec)
    job = job_spec(
        tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, f"ns.{name}")
    )

    pre_commit = run_in_process(spark, job)

    write = pre_commit.tables[0]
    assert write.location.endswith(f"/data/_eo/{job.write_id}")
    assert pre_commit.record_count == 1000
    assert pre_commit.source_positions is not None and pre_commit.source_positions["file_count"] == 2
    check_descriptors_against_files(pre_commit, table)
    for descriptor in write.data_files:  # one partition value per file, and the right one
        content = pq.read_table(local(descriptor.path))
        if name == "by_name":
            assert set(content.column("name").to_pylist()) == {descriptor.partition["name"]}
        elif name == "by_day":
            days = {(v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).days for v in content.column("ts").to_pylist()}
            assert days == {descriptor.partition["ts_day"]}
        else:
            assert descriptor.partition == {}
    if name == "by_day":
        assert len({d.partition["ts_day"] for d in write.data_files}) == 5
    if name == "by_name":  # null is a partition value of its own
        assert None in {d.partition["name"] for d in write.data_files}

    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table(f"ns.{name}").scan().to_arrow()) == sorted_rows(rows)


def test_the_write_records_its_spec_and_is_committed_under_it_after_the_spec_changed(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(200)
    land(tmp_path / "landing", rows)
    table = make_table(catalog, "ns.evolving")
    with table.update_spec() as update:
        update.add_identity("name")  # spec 1: what the write partitions for
    job = job_spec(
        tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.evolving")
    )

    pre_commit = run_in_process(spark, job)

    write = pre_commit.tables[0]
    assert write.spec_id == 1
    assert all(set(d.partition) == {"name"} for d in write.data_files)
    with catalog.load_table("ns.evolving").update_spec() as update:
        update.add_field("ts", DayTransform(), "ts_day")  # spec 2, between the write and the commit
    commit_iceberg(catalog, pre_commit)
    table = catalog.load_table("ns.evolving")
    assert table.metadata.default_spec_id == 2
    assert sorted_rows(table.scan().to_arrow()) == sorted_rows(rows)
    assert {task.file.spec_id for task in table.scan().plan_files()} == {1}


def test_file_sink_write_stages_then_commits_the_input(spark: Any, tmp_path: Path) -> None:
    rows = sample_rows(600).append_column("day", pa.array([f"2024-01-0{1 + i % 3}" for i in range(600)]))
    land(tmp_path / "landing", rows)
    root = tmp_path / "sink"
    job = job_spec(
        tmp_path,
        input=files_input(tmp_path / "landing"),
        target={"kind": "files", "root": str(root), "partition_by": ["day"]},
    )

    pre_commit = run_in_process(spark, job)

    write = pre_commit.tables[0]
    assert write.table == str(root)
    assert write.location == f"{root}/_staging/{job.write_id}"
    assert {d.partition["day"] for d in write.data_files} == {"2024-01-01", "2024-01-02", "2024-01-03"}
    assert [c.name for c in write.schema_written] == ["id", "name", "ts", "amount", "day"]
    for descriptor in write.data_files:
        content = pq.read_table(descriptor.path)
        assert set(content.column("day").to_pylist()) == {descriptor.partition["day"]}
        assert descriptor.record_count == content.num_rows
    committer = FileSinkCommitter(str(root))
    committer.commit(committer.prepare(pre_commit), SINCE)
    visible = ds.dataset(str(root), format="parquet").to_table()  # "_staging" is skipped like "_" names
    assert sorted_rows(visible) == sorted_rows(rows)


def test_schema_evolution_adds_column_with_the_ids_the_commit_assigns(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(catalog, "ns.evolving")
    target = iceberg_target(catalog_props, "ns.evolving")
    function = {"kind": "function", "callable": "tests.spark.user_functions:rows_with_extra"}

    with pytest.raises(SchemaMismatch, match="extra_col"):
        run_in_process(spark, job_spec(tmp_path, input=function, target=target))

    pre_commit = run_in_process(spark, job_spec(tmp_path, input=function, target=target, allow_schema_evolution=True))
    assert [(c.name, c.type, c.required) for c in pre_commit.tables[0].added_columns] == [("extra_col", "int", False)]
    commit_iceberg(catalog, pre_commit, allow_schema_evolution=True)
    table = catalog.load_table("ns.evolving")
    assert table.schema().find_field("extra_col").field_id == 5
    result = table.scan().to_arrow()
    assert sorted(result.column("extra_col").to_pylist()) == sorted(i % 3 for i in range(50))


def test_empty_interval_gives_an_empty_pre_commit(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    land(tmp_path / "landing", sample_rows(10), day="2023/12/31")  # another day's files only
    make_table(catalog, "ns.empty")
    before = files_under(tmp_path)
    pre_commit = run_in_process(
        spark,
        job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.empty")),
    )
    assert pre_commit.is_empty and pre_commit.tables[0].table == "ns.empty"
    assert pre_commit.source_positions == {
        "kind": "files",
        "patterns": [str(tmp_path / "landing/2024/01/01")],
        "file_count": 0,
        "files": [],
    }
    # no data file: only the pre-commit, left where persist finds it when no XCom carries it
    assert files_under(tmp_path) - before == {f"{local(pre_commit.tables[0].location)}/{PRE_COMMIT_FILE}"}
    assert IcebergSinkCommitter(catalog).commit(CommitPlan(pre_commit), SINCE) == {"ns.empty": "empty"}


def test_hourly_directories_under_a_daily_epoch(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    for hour in (0, 5, 23):
        land(tmp_path / "landing", sample_rows(10).slice(hour % 3 * 3, 3), parts=1, day=f"2024/01/01/{hour:02d}")
    land(tmp_path / "landing", sample_rows(10), parts=1, day="2024/01/02/00")  # next epoch's
    make_table(catalog, "ns.hourly")
    source = {
        "kind": "files",
        "format": "parquet",
        "path": str(tmp_path / "landing") + "/{start:%Y/%m/%d/%H}",
        "step_seconds": 3600,
    }
    pre_commit = run_in_process(
        spark, job_spec(tmp_path, input=source, target=iceberg_target(catalog_props, "ns.hourly"))
    )
    assert pre_commit.record_count == 9
    assert len(pre_commit.source_positions["patterns"]) == 24  # type: ignore[index]


def test_schema_mismatch_is_refused_before_anything_is_written(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(20)
    bad = rows.set_column(0, "id", pa.array([str(i) for i in range(20)])).rename_columns(["id", "Name", "ts", "amount"])
    land(tmp_path / "landing", bad)
    make_table(catalog, "ns.strict")
    before = files_under(tmp_path)
    with pytest.raises(SchemaMismatch) as caught:
        run_in_process(
            spark,
            job_spec(
                tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.strict")
            ),
        )
    message = str(caught.value)
    assert "column 'id' is string in the input but long in the table" in message
    assert "'Name' matches it only ignoring case" in message
    assert files_under(tmp_path) == before


def test_unknown_table_is_named(spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    with pytest.raises(UnknownTable, match=r"ns\.missing"):
        run_in_process(
            spark,
            job_spec(tmp_path, input=files_input(tmp_path / "x"), target=iceberg_target(catalog_props, "ns.missing")),
        )


def test_unreadable_input_fails_and_writes_nothing(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    directory = land(tmp_path / "landing", sample_rows(20))
    (directory / "part-9.parquet").write_bytes(b"this is not parquet at all")
    make_table(catalog, "ns.t")
    before = files_under(tmp_path)
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.t"))
    with pytest.raises(Exception) as caught:
        run_in_process(spark, job)
    assert "part-9.parquet" in describe_failure(caught.value)
    # the other task may have finished its file: only ever inside this write's own location
    location = str(tmp_path / "warehouse/ns/t/data/_eo" / job.write_id)
    assert all(path.startswith(location + "/") for path in files_under(tmp_path) - before)


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("boom", r"input function 'tests.spark.user_functions:boom' raised RuntimeError: upstream table for epoch"),
        ("not_a_frame", r"returned list, not a pyspark DataFrame"),
    ],
)
def test_failing_user_function_is_named(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], function: str, expected: str
) -> None:
    make_table(catalog, "ns.t")
    before = files_under(tmp_path)
    source = {"kind": "function", "callable": f"tests.spark.user_functions:{function}"}
    with pytest.raises(UserFunctionFailed, match=expected):
        run_in_process(spark, job_spec(tmp_path, input=source, target=iceberg_target(catalog_props, "ns.t")))
    assert files_under(tmp_path) == before


def test_failure_on_the_executors_leaves_files_only_in_the_write_location(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(catalog, "ns.t")
    before = files_under(tmp_path)
    job = job_spec(
        tmp_path,
        input={"kind": "function", "callable": "tests.spark.user_functions:lazily_failing"},
        target=iceberg_target(catalog_props, "ns.t"),
    )
    with pytest.raises(Exception) as caught:
        run_in_process(spark, job)
    assert describe_failure(caught.value) == "ValueError: row 7 cannot be parsed"
    location = str(tmp_path / "warehouse/ns/t/data/_eo" / job.write_id)
    assert all(path.startswith(location + "/") for path in files_under(tmp_path) - before)


def test_nulls_in_a_required_column_fail_the_write(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(30)
    rows = rows.set_column(0, "id", pa.array([None if i == 4 else i for i in range(30)], pa.int64()))
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.t")
    with pytest.raises(Exception) as caught:
        run_in_process(
            spark,
            job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.t")),
        )
    assert describe_failure(caught.value).startswith(
        "RequiredColumnHasNulls: required column 'id' holds 1 null value(s)"
    )


def test_sql_input_binds_the_interval(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(500)  # 500 * 7 minutes: about 2.4 days, one of them in the interval
    land(tmp_path / "landing", rows, day="all")
    make_table(catalog, "ns.t")
    query = f"SELECT * FROM parquet.`{tmp_path / 'landing/all'}` WHERE ts >= :interval_start AND ts < :interval_end"
    pre_commit = run_in_process(
        spark, job_spec(tmp_path, input={"kind": "sql", "query": query}, target=iceberg_target(catalog_props, "ns.t"))
    )
    assert pre_commit.record_count == len(
        [t for t in rows.column("ts").to_pylist() if t < dt.datetime(2024, 1, 2, tzinfo=dt.UTC)]
    )


@pytest.mark.postgres
def test_iceberg_write_with_a_postgresql_catalog(spark: Any, tmp_path: Path, pg_url: str) -> None:
    from pyiceberg.catalog import load_catalog

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    props = {"type": "sql", "uri": pg_url, "warehouse": f"file://{warehouse}"}
    catalog = load_catalog(f"pg_{tmp_path.name[-8:]}", **props)
    namespace = f"ns_{os.getpid()}_{tmp_path.name[-6:]}".replace("-", "_")
    catalog.create_namespace(namespace)
    table = make_table(catalog, f"{namespace}.daily", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    rows = sample_rows(300)
    land(tmp_path / "landing", rows)
    target = {
        "kind": "iceberg",
        "catalog_name": catalog.name,
        "catalog_properties": props,
        "table": f"{namespace}.daily",
    }
    pre_commit = run_in_process(spark, job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=target))
    check_descriptors_against_files(pre_commit, table)
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table(f"{namespace}.daily").scan().to_arrow()) == sorted_rows(rows)
