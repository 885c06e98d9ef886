"""Spark's own Parquet writer as the epoch writer uses it: files with Iceberg field ids, one Iceberg
partition value per file and the right one, read back by DuckDB and pyiceberg after the commit; and
the tables it leaves to the pyarrow writer."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from airflow_provider_exactly_once.sinks.iceberg.descriptors import describe_parquet_file
from airflow_provider_exactly_once.sinks.layout import PRE_COMMIT_FILE
from airflow_provider_exactly_once.spark import writers
from airflow_provider_exactly_once.spark.writers import refusal
from tests.spark.conftest import files_under, job_spec, land, local, make_table, run_in_process, sample_rows
from tests.spark.test_epoch_writer import (
    check_descriptors_against_files,
    commit_iceberg,
    files_input,
    iceberg_target,
    sorted_rows,
)
from tests.spark.user_functions import typed_rows_list
from tests.support import independent_reader

TYPED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "ts", TimestamptzType()),
    NestedField(4, "local", TimestampType()),
    NestedField(5, "day", DateType()),
    NestedField(6, "flag", BooleanType()),
    NestedField(7, "ratio", DoubleType()),
    NestedField(8, "price", DecimalType(10, 2)),
    NestedField(9, "addr", StructType(NestedField(11, "city", StringType()), NestedField(12, "zip", LongType()))),
    NestedField(10, "note", StringType()),  # not in the input: written as nulls
)
TYPED_INPUT = {"kind": "function", "callable": "tests.spark.user_functions:typed_rows"}
EPOCH_DAY = dt.date(1970, 1, 1)
EPOCH_TIME = dt.datetime(1970, 1, 1)


def spec(*fields: tuple[int, Transform[Any, Any], str]) -> PartitionSpec:
    return PartitionSpec(*[PartitionField(s, 1000 + i, t, n) for i, (s, t, n) in enumerate(fields)])


def internal(value: Any) -> Any:
    """A Python value as Iceberg's transforms take it: days for a date, microseconds for an instant."""
    if isinstance(value, dt.datetime):
        naive = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
        return (naive - EPOCH_TIME) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - EPOCH_DAY).days
    return value


def source_value(row: dict[str, Any], name: str) -> Any:
    top, *nested = name.split(".")
    value = row[top]
    for part in nested:
        value = None if value is None else value[part]
    return value


PARTITIONINGS = {
    "identity string": spec((2, IdentityTransform(), "name")),
    "identity date and boolean": spec((5, IdentityTransform(), "day"), (6, IdentityTransform(), "flag")),
    "identity instants": spec((3, IdentityTransform(), "ts"), (4, IdentityTransform(), "local")),
    "month and hour": spec((3, MonthTransform(), "ts_month"), (4, HourTransform(), "local_hour")),
    "year, day and void": spec(
        (5, YearTransform(), "day_year"), (4, DayTransform(), "local_day"), (2, VoidTransform(), "name_void")
    ),
    "nested identity": spec((11, IdentityTransform(), "addr.city")),
}


@pytest.mark.parametrize("partitioning", list(PARTITIONINGS))
def test_spark_writes_files_with_field_ids_and_the_iceberg_partition_value_of_their_rows(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], partitioning: str
) -> None:
    partition_spec = PARTITIONINGS[partitioning]
    table = make_table(catalog, "ns.typed", partition_spec, schema=TYPED)
    assert table.schema() == TYPED  # the ids the files must carry
    job = job_spec(tmp_path, input=TYPED_INPUT, target=iceberg_target(catalog_props, "ns.typed"))
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")  # transforms are UTC whatever the session says
    try:
        pre_commit = run_in_process(spark, job)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)

    write = pre_commit.tables[0]
    assert pre_commit.record_count == 48
    location = local(write.location)
    written = {Path(p).name for p in files_under(Path(location))}
    assert written == {Path(local(d.path)).name for d in write.data_files} | {PRE_COMMIT_FILE}
    for descriptor in write.data_files:
        path = local(descriptor.path)
        assert Path(path).name.startswith("part-")  # Spark's writer, not the pyarrow one
        schema = pq.read_schema(path)
        assert [f.metadata[b"PARQUET:field_id"] for f in schema] == [str(i).encode() for i in range(1, 11)]
        assert [f.metadata[b"PARQUET:field_id"] for f in schema.field("addr").type] == [b"11", b"12"]
        assert (
            describe_parquet_file(
                descriptor.path, table_schema=TYPED, partition=descriptor.partition, writer=descriptor.writer
            )
            == descriptor
        )
        rows = pq.read_table(path).to_pylist()
        assert descriptor.record_count == len(rows)
        for partition_field in partition_spec.fields:
            source_type: IcebergType = TYPED.find_field(partition_field.source_id).field_type
            name = TYPED.find_column_name(partition_field.source_id)
            assert name is not None
            apply = partition_field.transform.transform(source_type)
            expected = {apply(internal(source_value(row, name))) for row in rows}
            assert expected == {descriptor.partition[partition_field.name]}, (partitioning, path)
        ratios = [row["ratio"] for row in rows]
        if any(r is not None and math.isnan(r) for r in ratios):  # never a NaN bound
            assert "ratio" not in descriptor.lower_bounds and "ratio" not in descriptor.upper_bounds

    commit_iceberg(catalog, pre_commit)
    table = catalog.load_table("ns.typed")
    expected_rows = sorted(
        (
            i,
            name,
            internal(ts),
            internal(local_ts),
            day,
            flag,
            price,
            None if addr is None else {"city": addr[0], "zip": addr[1]},
            None,
        )
        for i, name, ts, local_ts, day, flag, _, price, addr in typed_rows_list()
    )
    columns = "id, name, epoch_us(ts), epoch_us(local), day, flag, price, addr, note"
    assert independent_reader.read_rows(table, columns) == expected_rows
    scanned = table.scan().to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["name"], internal(r["ts"]), r["day"], r["addr"]) for r in scanned] == [
        (e[0], e[1], e[2], e[4], e[7]) for e in expected_rows
    ]
    ratios = {r["id"]: r["ratio"] for r in scanned}
    for i, *_, ratio, _price, _addr in typed_rows_list():
        assert (math.isnan(ratio) and math.isnan(ratios[i])) or ratio == ratios[i]
    assert sum(r["price"] for r in scanned) == sum(Decimal(i * 101) / 100 for i in range(48))


def test_rows_are_clustered_by_partition_value_when_the_table_asks_for_hash_distribution(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    day = spec((3, DayTransform(), "ts_day"))
    scattered = "SELECT * FROM epoch_input"
    land = {"kind": "function", "callable": "tests.spark.user_functions:random_amounts"}
    make_table(catalog, "ns.scattered", day)
    table = make_table(catalog, "ns.clustered", day)
    with table.transaction() as tx:
        tx.set_properties({"write.distribution-mode": "hash"})
    job = job_spec(
        tmp_path,
        input=land,
        target=[
            {**iceberg_target(catalog_props, "ns.scattered"), "query": scattered},
            iceberg_target(catalog_props, "ns.clustered"),
        ],
    )

    pre_commit = run_in_process(spark, job)

    plain, clustered = pre_commit.tables
    days = {d.partition["ts_day"] for d in clustered.data_files}
    assert len(days) == 1 and len(clustered.data_files) == 1  # 200 minutes of one day, one task
    assert len(plain.data_files) == 2  # the input's two tasks each wrote the day it saw
    commit_iceberg(catalog, pre_commit)
    assert len(independent_reader.read_rows(catalog.load_table("ns.clustered"), "id")) == 200


def test_an_epoch_whose_rows_are_all_filtered_out_has_no_files(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(catalog, "ns.t")
    source = {"kind": "function", "callable": "tests.spark.user_functions:random_amounts"}
    job = job_spec(tmp_path, input=source, target={**iceberg_target(catalog_props, "ns.t"), "where": "id < 0"})
    pre_commit = run_in_process(spark, job)
    assert pre_commit.tables[0].data_files == [] and pre_commit.is_empty
    assert {Path(p).name for p in files_under(Path(local(pre_commit.tables[0].location)))} == {PRE_COMMIT_FILE}


def test_a_table_with_a_list_column_keeps_the_pyarrow_writer_and_its_element_ids(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "tags", ListType(3, StringType(), element_required=False)),
    )
    make_table(catalog, "ns.listed", schema=schema)
    query = "SELECT id, array(concat('t', cast(id AS string))) AS tags FROM range(10)"
    job = job_spec(tmp_path, input={"kind": "sql", "query": query}, target=iceberg_target(catalog_props, "ns.listed"))
    pre_commit = run_in_process(spark, job)
    for descriptor in pre_commit.tables[0].data_files:
        assert not Path(local(descriptor.path)).name.startswith("part-")
        element = pq.read_schema(local(descriptor.path)).field("tags").type.value_field
        assert element.metadata[b"PARQUET:field_id"] == b"3"
    commit_iceberg(catalog, pre_commit)
    assert independent_reader.read_rows(catalog.load_table("ns.listed")) == [(i, [f"t{i}"]) for i in range(10)]


@pytest.mark.parametrize(
    ("location", "schema", "partitioning", "properties", "reason"),
    [
        ("s3://bucket/t/data/_eo/w", TYPED, PartitionSpec(), {}, "object store"),
        ("file:///t/data/_eo/w", Schema(NestedField(1, "l", ListType(2, LongType()))), PartitionSpec(), {}, "a list"),
        (
            "file:///t/data/_eo/w",
            Schema(NestedField(1, "s", StructType(NestedField(2, "m", MapType(3, StringType(), 4, LongType()))))),
            PartitionSpec(),
            {},
            "a map",
        ),
        ("file:///t/data/_eo/w", Schema(NestedField(1, "u", UUIDType())), PartitionSpec(), {}, "type uuid"),
        (
            "file:///t/data/_eo/w",
            Schema(NestedField(1, "f", FloatType())),
            spec((1, IdentityTransform(), "f")),
            {},
            "identity partition field 'f' on float",
        ),
        ("file:///t", TYPED, PartitionSpec(), {"write.parquet.compression-codec": "lzo"}, "codec 'lzo'"),
        (
            "file:///t",
            TYPED,
            PartitionSpec(),
            {"write.parquet.compression-codec": "gzip", "write.parquet.compression-level": "3"},
            "level for 'gzip'",
        ),
    ],
)
def test_what_spark_cannot_write_as_the_table_needs_is_named(
    location: str, schema: Schema, partitioning: PartitionSpec, properties: dict[str, str], reason: str
) -> None:
    found = refusal(location, schema, partitioning, properties)
    assert found is not None and reason in found
    assert refusal("file:///t/data/_eo/w", TYPED, PARTITIONINGS["month and hour"], {}) is None


def test_sample_rows_are_written_by_spark_with_the_tables_compression(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    table = make_table(catalog, "ns.snappy")
    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "snappy", "write.parquet.row-group-limit": "100"})
    source = {"kind": "function", "callable": "tests.spark.user_functions:random_amounts"}
    pre_commit = run_in_process(
        spark, job_spec(tmp_path, input=source, target=iceberg_target(catalog_props, "ns.snappy"))
    )
    for descriptor in pre_commit.tables[0].data_files:
        metadata = pq.read_metadata(local(descriptor.path))
        assert metadata.row_group(0).column(0).compression == "SNAPPY"
        assert max(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)) <= 100
        assert len(descriptor.split_offsets or []) == metadata.num_row_groups
    assert pre_commit.record_count == 200


@pytest.mark.parametrize("on_driver_up_to", [0, writers.DRIVER_DESCRIBES_UP_TO], ids=["executors", "driver"])
def test_files_are_described_alike_on_the_executors_and_on_the_driver(
    spark: Any,
    tmp_path: Path,
    catalog: Catalog,
    catalog_props: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    on_driver_up_to: int,
) -> None:
    monkeypatch.setattr(writers, "DRIVER_DESCRIBES_UP_TO", on_driver_up_to)
    rows = sample_rows(1000)
    land(tmp_path / "landing", rows)
    table = make_table(catalog, "ns.by_day", spec((3, DayTransform(), "ts_day")))
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.by_day"))

    pre_commit = run_in_process(spark, job)

    check_descriptors_against_files(pre_commit, table)
    assert all(Path(local(d.path)).name.startswith("part-") for d in pre_commit.tables[0].data_files)
    assert len({d.partition["ts_day"] for d in pre_commit.tables[0].data_files}) == 5
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.by_day").scan().to_arrow()) == sorted_rows(rows)


def test_the_writers_session_settings_hold_for_the_write_and_the_session_is_left_as_it_was(spark: Any) -> None:
    settings = {"spark.sql.parquet.writeLegacyFormat": "false", "spark.sql.parquet.fieldId.write.enabled": "true"}
    unset, changed = settings
    spark.conf.unset(unset)
    spark.conf.set(changed, "false")
    try:
        with writers.session_conf(spark, settings):
            assert {key: spark.conf.get(key) for key in settings} == settings
        assert spark.conf.get(unset, None) is None, "a setting the session did not have is unset again"
        assert spark.conf.get(changed) == "false", "a setting the session had gets its value back"
    finally:
        spark.conf.unset(changed)
