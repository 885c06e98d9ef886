"""The epoch writer on a real object store: SeaweedFS's S3 and Iceberg REST catalog on 127.0.0.1.

pyspark ships no s3a connector and none is fetched, so every ``s3://`` byte here goes through
pyarrow on the executors, with the credentials of the job spec. Each test takes its own namespace
and prefix; the server is the session's.
"""

from __future__ import annotations

import gzip
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform

from airflow_provider_exactly_once.checkpoints import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import ExactlyOnceError
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.core.ports import SinkCommitter
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.committer import IcebergSinkCommitter
from airflow_provider_exactly_once.spark.inputs import input_io_properties, read_input
from airflow_provider_exactly_once.spark.jobspec import FilesInput
from airflow_provider_exactly_once.store import SqlSinkStateStore
from demo.servers import SECRET_KEY, SeaweedFS
from tests.spark.conftest import (
    TABLE_SCHEMA,
    StandaloneCluster,
    job_spec,
    make_table,
    run_in_process,
    sample_rows,
    submit,
)
from tests.spark.test_epoch_writer import iceberg_target, sorted_rows
from tests.support import independent_reader

DAY = PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day"))


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3(seaweed: SeaweedFS) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**seaweed.s3fs_options(), skip_instance_cache=True)


@pytest.fixture
def lake(seaweed: SeaweedFS, prefix: str) -> Catalog:
    """The REST catalog, with a namespace of this test's own."""
    catalog = load_catalog("lake", **seaweed.catalog_properties())
    catalog.create_namespace(prefix)
    return catalog


def landing(prefix: str) -> str:
    return f"s3://plain/{prefix}/landing"


def parquet_input(prefix: str) -> dict[str, Any]:
    return {"kind": "files", "format": "parquet", "path": landing(prefix) + "/{start:%Y/%m/%d}"}


def land_parquet(s3: s3fs.S3FileSystem, prefix: str, rows: pa.Table, parts: int = 2) -> None:
    size = (rows.num_rows + parts - 1) // parts
    for i in range(parts):
        with s3.open(f"plain/{prefix}/landing/2024/01/01/part-{i}.parquet", "wb") as handle:
            pq.write_table(rows.slice(i * size, size), handle)
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/_SUCCESS", b"")


def commit_through_coordinator(tmp_path: Path, committer: SinkCommitter, pre_commit: PreCommit) -> None:
    """Persist, complete the checkpoint, commit: the project's own two phases, nothing by hand."""
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / f'meta-{uuid.uuid4().hex[:6]}.db'}")
    try:
        coordinator = TwoPhaseCommitCoordinator(
            store, {pre_commit.sink_id: committer}, MetaStoreCheckpointSource(store.checkpoints)
        )
        coordinator.persist(pre_commit)
        store.checkpoints.set_checkpoint(pre_commit.sink_id, pre_commit.epoch, CheckpointStatus.COMPLETED)
        assert coordinator.commit(pre_commit.sink_id, pre_commit.epoch).outcome is CommitOutcome.COMMITTED
    finally:
        store.dispose()


def check_files_on_s3(s3: s3fs.S3FileSystem, pre_commit: PreCommit) -> None:
    """Every described file is on S3, inside the write's own location, with the described size."""
    for write in pre_commit.tables:
        assert write.location.startswith("s3://") and write.location.endswith("/" + pre_commit.write_id)
        assert write.data_files
        for descriptor in write.data_files:
            assert descriptor.path.startswith(write.location + "/")
            assert s3.info(descriptor.path)["size"] == descriptor.file_size_in_bytes


def test_landing_files_on_s3_go_into_an_iceberg_table_of_the_rest_catalog(
    spark: Any, tmp_path: Path, seaweed: SeaweedFS, s3: s3fs.S3FileSystem, lake: Catalog, prefix: str
) -> None:
    rows = sample_rows(600)
    land_parquet(s3, prefix, rows)
    table = make_table(lake, f"{prefix}.daily", DAY)
    job = job_spec(
        tmp_path, input=parquet_input(prefix), target=iceberg_target(seaweed.catalog_properties(), f"{prefix}.daily")
    )

    pre_commit = run_in_process(spark, job)

    (write,) = pre_commit.tables
    assert write.location == f"{table.location()}/data/_eo/{job.write_id}"
    assert write.location.startswith("s3://lake/")
    assert pre_commit.record_count == 600
    check_files_on_s3(s3, pre_commit)
    positions = pre_commit.source_positions
    assert positions is not None
    assert positions["files"] == [f"{landing(prefix)}/2024/01/01/part-{i}.parquet" for i in range(2)]

    commit_through_coordinator(tmp_path, IcebergSinkCommitter(lake), pre_commit)

    committed = lake.load_table(f"{prefix}.daily")
    assert sorted_rows(committed.scan().to_arrow()) == sorted_rows(rows)
    snapshot = committed.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["exactly-once.write-id"] == job.write_id
    # DuckDB, reading the table's metadata on S3 by itself, agrees
    assert independent_reader.read_rows(committed, "id") == [(i,) for i in range(600)]


def test_an_upsert_on_s3_rewrites_its_files_and_leaves_none_of_its_staged_rows(
    spark: Any, tmp_path: Path, seaweed: SeaweedFS, s3: s3fs.S3FileSystem, lake: Catalog, prefix: str
) -> None:
    """The upserted rows go to the rewrite's tasks as staged files in the write location on S3
    (``spark/upsert.py``): read there by the tasks, deleted before the pre-commit is written."""
    table = make_table(lake, f"{prefix}.accounts")
    table.append(sample_rows(300).cast(table.schema().as_arrow()))
    changed = sample_rows(360).slice(200)  # 100 updates of the table's last rows, 60 new keys
    changed = changed.set_column(1, "name", pa.array([f"new-{i}" for i in range(changed.num_rows)], pa.string()))
    land_parquet(s3, prefix, changed)
    target = iceberg_target(seaweed.catalog_properties(), f"{prefix}.accounts")
    target["upsert"] = {"key": ["id"]}
    job = job_spec(tmp_path, input=parquet_input(prefix), target=target)

    pre_commit = run_in_process(spark, job)

    (write,) = pre_commit.tables
    assert write.changes is not None and (write.changes.updated, write.changes.inserted) == (100, 60)
    check_files_on_s3(s3, pre_commit)
    left = s3.find(write.location.removeprefix("s3://"))
    # (SeaweedFS's filer keeps the emptied folder as an entry of its own; S3 has no folders)
    assert not [path for path in left if "/_staging/" in path and not path.endswith("/_staging/")], left
    commit_through_coordinator(tmp_path, IcebergSinkCommitter(lake), pre_commit)
    committed = lake.load_table(f"{prefix}.accounts")
    expected = [(i, f"name-{i % 13}" if i % 11 else None) for i in range(200)]
    expected += [(i, f"new-{i - 200}") for i in range(200, 360)]
    # DuckDB, reading the table's metadata on S3 by itself, agrees
    assert independent_reader.read_rows(committed, "id, name") == expected


def _json_lines(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\r\n" for row in rows)


def test_json_landing_on_s3_goes_into_a_file_sink_on_s3(
    spark: Any, tmp_path: Path, seaweed: SeaweedFS, s3: s3fs.S3FileSystem, prefix: str
) -> None:
    rows = [{"id": i, "bucket": i % 3, "name": f"n\u2028{i}" if i % 5 else None, "amount": i / 4} for i in range(90)]
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/a.json", _json_lines(rows[:40]))
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/b.json.gz", gzip.compress(_json_lines(rows[40:])))
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/.b.json.tmp", b"{not json")  # an upload in progress: skipped
    root = f"s3://plain/{prefix}/out"
    job = job_spec(
        tmp_path,
        input={
            "kind": "files",
            "format": "json",
            "path": landing(prefix) + "/{start:%Y/%m/%d}",
            "schema_ddl": "id BIGINT, bucket INT, name STRING, amount DOUBLE",
        },
        target={"kind": "files", "root": root, "partition_by": ["bucket"], "io_properties": seaweed.s3_properties()},
        sink_id="files-on-s3",
    )

    pre_commit = run_in_process(spark, job)

    assert pre_commit.tables[0].location == f"{root}/_staging/{job.write_id}"
    assert pre_commit.record_count == 90
    check_files_on_s3(s3, pre_commit)

    commit_through_coordinator(tmp_path, FileSinkCommitter(root, storage_options=seaweed.s3fs_options()), pre_commit)

    s3.invalidate_cache()
    final = sorted(p for p in s3.find(f"plain/{prefix}/out") if "/_staging/" not in p)
    assert {p.split("/")[-2] for p in final} == {"bucket=0", "bucket=1", "bucket=2"}
    read: list[dict[str, Any]] = []
    for path in final:
        bucket = int(path.split("/")[-2].removeprefix("bucket="))
        with s3.open(path, "rb") as handle:
            read += [{**row, "bucket": bucket} for row in pq.read_table(handle).to_pylist()]
    assert sorted(read, key=lambda r: r["id"]) == rows


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_bad_record_on_s3_fails_the_read_as_spark_would_for_a_local_file(
    spark: Any, tmp_path: Path, seaweed: SeaweedFS, s3: s3fs.S3FileSystem, prefix: str, fmt: str
) -> None:
    """Spark's own parsers read the lines: header handling and FAILFAST hold for S3 input too."""
    good = "id,name\n1,a\n2,b\n" if fmt == "csv" else '{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n'
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/good.{fmt}.gz", gzip.compress(good.encode()))
    spec = job_spec(
        tmp_path,
        input={
            "kind": "files",
            "format": fmt,
            "path": landing(prefix) + "/{start:%Y/%m/%d}",
            "schema_ddl": "id BIGINT, name STRING",
            "options": {"header": "true"} if fmt == "csv" else {},
        },
        target={"kind": "files", "root": f"s3://plain/{prefix}/out", "io_properties": seaweed.s3_properties()},
    )
    frame = read_input(spark, spec).frame
    assert frame is not None
    assert sorted(tuple(r) for r in frame.collect()) == [(1, "a"), (2, "b")]

    bad = "id,name\nthree,c\n" if fmt == "csv" else '{"id": "three", "name": "c"}\n'
    s3.pipe(f"plain/{prefix}/landing/2024/01/01/bad.{fmt}", bad.encode())
    frame = read_input(spark, spec).frame
    assert frame is not None
    with pytest.raises(Exception, match=r"(?i)malformed|FAILFAST"):
        frame.collect()


def test_standalone_executors_reach_s3_with_the_credentials_of_the_spec_alone(
    standalone_cluster: StandaloneCluster,
    tmp_path: Path,
    seaweed: SeaweedFS,
    s3: s3fs.S3FileSystem,
    lake: Catalog,
    prefix: str,
) -> None:
    """The executors are the worker's processes, started without any AWS setting in their
    environment: they read the landing files and write the table's files with what the spec says."""
    rows = sample_rows(700)
    land_parquet(s3, prefix, rows, parts=3)
    make_table(lake, f"{prefix}.by_name", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    job = job_spec(
        tmp_path, input=parquet_input(prefix), target=iceberg_target(seaweed.catalog_properties(), f"{prefix}.by_name")
    )

    result = submit(
        job,
        standalone_cluster.url,
        tmp_path,
        "--deploy-mode",
        "client",
        "--total-executor-cores",
        "1",
        "--executor-memory",
        "512m",
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Granted executor ID app-" in result.stderr  # the cluster's executor ran the tasks
    assert SECRET_KEY not in result.stdout + result.stderr
    executor_logs = [p for p in standalone_cluster.work.rglob("*") if p.is_file() and p.name in ("stdout", "stderr")]
    assert executor_logs, "the executors' logs should be under the worker's work directory"
    assert all(SECRET_KEY not in p.read_text(errors="replace") for p in executor_logs)
    pre_commit = PreCommit.from_json(Path(job.output_path).read_text())
    check_files_on_s3(s3, pre_commit)
    commit_through_coordinator(tmp_path, IcebergSinkCommitter(lake), pre_commit)
    assert sorted_rows(lake.load_table(f"{prefix}.by_name").scan().to_arrow()) == sorted_rows(rows)


def test_a_failed_write_removes_the_files_it_already_put_on_s3(
    spark: Any, tmp_path: Path, seaweed: SeaweedFS, s3: s3fs.S3FileSystem, lake: Catalog, prefix: str
) -> None:
    """The first table of a fan-out is written, the second fails on a null in a required column:
    the first table's write folder goes too, removed on S3 with the spec's credentials."""
    from airflow_provider_exactly_once.spark.epoch_writer import WriteLocation, run

    land_parquet(s3, prefix, sample_rows(60))
    first = make_table(lake, f"{prefix}.first")
    strict = Schema(*[f.model_copy(update={"required": True}) if f.name == "name" else f for f in TABLE_SCHEMA.fields])
    make_table(lake, f"{prefix}.strict", schema=strict)
    props = seaweed.catalog_properties()
    spec = job_spec(
        tmp_path,
        input=parquet_input(prefix),
        target=[iceberg_target(props, f"{prefix}.first"), iceberg_target(props, f"{prefix}.strict")],
    )
    written: list[WriteLocation] = []

    with pytest.raises(Exception, match="RequiredColumnHasNulls"):
        run(spark, spec, written)

    assert written[0].location == f"{first.location()}/data/_eo/{spec.write_id}"
    assert written[0].io_properties["s3.secret-access-key"] == SECRET_KEY  # how the driver reached it
    s3.invalidate_cache()
    # Files only: SeaweedFS lists an emptied folder as an entry of its own (type "directory").
    left = {w.location: files_below(s3, w.location) for w in written}
    assert left == {w.location: [] for w in written}


def files_below(s3: s3fs.S3FileSystem, location: str) -> list[str]:
    return sorted(name for name, info in s3.find(location, detail=True).items() if info.get("type") != "directory")


# -- without Spark: how text is split, how a spec is kept, what the operator lets through ---------------


def test_lines_are_split_as_spark_splits_them_across_read_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_exactly_once.spark import inputs

    monkeypatch.setattr(inputs, "READ_CHUNK", 3)
    text = 'a\r\nbb\rccc\n\n{"s": "x\u2028y"}\r\n' + "last"
    (tmp_path / "t.txt").write_text(text)
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(text.encode()))
    expected = ["a", "bb", "ccc", "", '{"s": "x\u2028y"}', "last"]
    for name in ("t.txt", "t.txt.gz"):
        assert list(inputs._lines(str(tmp_path / name), {}, "utf-8", None)) == expected
    (tmp_path / "sep.txt").write_text("a||b|c||")
    assert list(inputs._lines(str(tmp_path / "sep.txt"), {}, "utf-8", "||")) == ["a", "b|c"]


def test_the_job_spec_file_is_readable_by_its_owner_alone(tmp_path: Path) -> None:
    from airflow_provider_exactly_once.spark.jobspec import dump_spec

    path = tmp_path / "job.json"
    path.write_text("{}")
    os.chmod(path, 0o644)
    dump_spec(job_spec(tmp_path, input=parquet_input("p"), target={"kind": "files", "root": "/x"}), path)
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.fixture
def storage_connection(seaweed: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    extra = {"endpoint_url": seaweed.s3_endpoint, "region_name": "us-east-1"}
    conn = {"conn_type": "aws", "login": "eo-access", "password": SECRET_KEY, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_EO_S3", json.dumps(conn))
    yield "eo_s3"


def test_a_file_sinks_storage_connection_reaches_the_writer_and_never_a_rendered_field(
    storage_connection: str, seaweed: SeaweedFS
) -> None:
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import FileSinkConfig

    sink = FileSinkConfig("files", "s3://plain/out", storage_conn_id=storage_connection)
    operator = SparkPreCommitOperator(task_id="w", sink=sink, input=parquet_input("p"), partition_by=["day"])
    rendered = json.dumps({name: getattr(operator, name) for name in operator.template_fields}, default=str)
    assert SECRET_KEY not in rendered

    (target,) = operator._resolve_targets()

    assert target["io_properties"] == seaweed.s3_properties()  # what the committer's s3fs options say, as FileIO


@pytest.mark.parametrize(
    ("kwargs", "refused"),
    [
        ({"input": {**parquet_input("p"), "io_properties": {"s3.secret-access-key": "x"}}}, "input io_properties"),
        ({"input": {**parquet_input("p"), "options": {"fs.s3a.secret.key": "x"}}}, "input options"),
        (
            {"target": {"kind": "files", "root": "s3://b/o", "io_properties": {"s3.session-token": "t"}}},
            "target io_properties",
        ),
    ],
)
def test_credentials_in_a_templated_argument_are_refused_when_the_dag_is_parsed(
    kwargs: dict[str, Any], refused: str
) -> None:
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import FileSinkConfig

    arguments: dict[str, Any] = {"sink": FileSinkConfig("s", "s3://b/o"), "input": parquet_input("p"), **kwargs}
    with pytest.raises(ExactlyOnceError, match=f"{refused} holds credentials"):
        SparkPreCommitOperator(task_id="w", **arguments)


def test_storage_options_the_writer_cannot_honour_are_refused() -> None:
    from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
    from airflow_provider_exactly_once.operators.spark_precommit import file_sink_io_properties

    options = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "r", "verify": True},
        "config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 3}, "s3": {"addressing_style": "virtual"}},
    }
    assert file_sink_io_properties("s3://b/o", options) == {
        "s3.access-key-id": "k",
        "s3.secret-access-key": "s",
        "s3.endpoint": "http://h:1",
        "s3.region": "r",
        "s3.connect-timeout": "5",
        "s3.force-virtual-addressing": "true",
    }
    assert file_sink_io_properties("/local/out", {"auto_mkdir": True}) == {}
    with pytest.raises(InvalidSinkConfig, match=r"\['client_kwargs.verify', 'requester_pays'\]"):
        file_sink_io_properties("s3://b/o", {"requester_pays": True, "client_kwargs": {"verify": False}})
    with pytest.raises(InvalidSinkConfig, match="only on S3"):
        file_sink_io_properties("gs://b/o", {"project": "p"})


def test_a_landing_bucket_of_another_store_is_read_with_its_own_connection(
    spark: Any,
    tmp_path: Path,
    seaweed: SeaweedFS,
    s3: s3fs.S3FileSystem,
    prefix: str,
    catalog: Catalog,
    catalog_props: dict[str, str],
    storage_connection: str,
) -> None:
    """The tables on local disk, the landing on S3: the target's properties say nothing of that
    store, the input's connection does, and only through the private spec (never a rendered field)."""
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    rows = sample_rows(300)
    land_parquet(s3, prefix, rows)
    catalog.create_namespace("db")
    make_table(catalog, "db.landed_elsewhere")
    target = iceberg_target(catalog_props, "db.landed_elsewhere")
    without = job_spec(tmp_path, input=parquet_input(prefix), target=target)
    assert "s3.endpoint" not in input_io_properties(without, FilesInput.model_validate(parquet_input(prefix)))

    operator = SparkPreCommitOperator(
        task_id="w",
        sink=IcebergSinkConfig("landed-elsewhere", ("db.landed_elsewhere",)),
        input=parquet_input(prefix),
        input_storage_conn_id=storage_connection,
    )
    rendered = json.dumps({name: getattr(operator, name) for name in operator.template_fields}, default=str)
    assert SECRET_KEY not in rendered
    properties = operator._input_io_properties()
    assert properties == seaweed.s3_properties()

    pre_commit = run_in_process(
        spark, job_spec(tmp_path, input=parquet_input(prefix), target=target, input_io_properties=properties)
    )

    assert pre_commit.record_count == 300
    assert pre_commit.source_positions is not None
    assert pre_commit.source_positions["files"] == [f"{landing(prefix)}/2024/01/01/part-{i}.parquet" for i in range(2)]


def test_an_input_connection_is_refused_for_an_input_that_is_no_landing_directory() -> None:
    from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    with pytest.raises(InvalidSinkConfig, match=r"task w: input_storage_conn_id is for a landing directory .* 'table'"):
        SparkPreCommitOperator(
            task_id="w",
            sink=IcebergSinkConfig("s", ("db.t",)),
            input={"kind": "table", "table": "src.events", "time_column": "ts"},
            input_storage_conn_id="eo_s3",
        )


def test_an_input_connection_the_reader_cannot_honour_names_the_task_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    # An unverified TLS endpoint: pyarrow's S3 client has no such switch, so the reader would not
    # connect as the connection says.
    extra = {"endpoint_url": "https://127.0.0.1:1", "verify": False}
    monkeypatch.setenv(
        "AIRFLOW_CONN_ODD_S3", json.dumps({"conn_type": "aws", "login": "k", "password": "s", "extra": extra})
    )
    operator = SparkPreCommitOperator(
        task_id="w", sink=IcebergSinkConfig("s", ("db.t",)), input=parquet_input("p"), input_storage_conn_id="odd_s3"
    )
    with pytest.raises(
        InvalidSinkConfig, match=r"task w: landing path \(input_storage_conn_id 'odd_s3'\).*FilesInput\(io_properties"
    ):
        operator._input_io_properties()
