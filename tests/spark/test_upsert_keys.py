"""Upserts by a composite key of every key type (string, date, timestamp, timestamptz), with rows
moving partition: the executors match the files' keys against the changed keys in Arrow, so the
types the table's files hold and the types Spark hands over must meet exactly. DuckDB reads back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DateType, NestedField, StringType, TimestampType, TimestamptzType

from tests.spark.test_upsert import Upserts
from tests.support.independent_reader import read_rows

SCHEMA = Schema(
    NestedField(1, "name", StringType(), required=True),
    NestedField(2, "day", DateType(), required=True),
    NestedField(3, "at", TimestampType(), required=True),
    NestedField(4, "at_tz", TimestamptzType(), required=True),
    NestedField(5, "shelf", StringType(), required=False),
    NestedField(6, "value", StringType(), required=False),
)
BY_SHELF = PartitionSpec(PartitionField(5, 1000, IdentityTransform(), "shelf"))
BY_DAY = PartitionSpec(PartitionField(4, 1000, DayTransform(), "at_tz_day"))
KEY = ["name", "day", "at", "at_tz"]
BASE = dt.datetime(2024, 3, 1, 12, 30, 0, 123456)
Key = tuple[str, dt.date, int, int]
Model = dict[Key, tuple[str, str]]


def key_of(i: int) -> tuple[str, dt.date, dt.datetime, dt.datetime]:
    local = BASE + dt.timedelta(hours=7 * i, microseconds=i)
    return f"n{i:03d}", dt.date(2024, 1, 1) + dt.timedelta(days=i % 4), local, local.replace(tzinfo=dt.UTC)


def micros(value: dt.datetime) -> int:
    naive = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
    return (naive - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def changes(rows: list[tuple[int, str, str | None, str]]) -> pa.Table:
    keys = [key_of(i) for i, *_ in rows]
    return pa.table(
        {
            "name": pa.array([k[0] for k in keys], pa.string()),
            "day": pa.array([k[1] for k in keys], pa.date32()),
            "at": pa.array([k[2] for k in keys], pa.timestamp("us")),
            "at_tz": pa.array([k[3] for k in keys], pa.timestamp("us", tz="UTC")),
            "shelf": pa.array([r[1] for r in rows], pa.string()),
            "value": pa.array([r[2] for r in rows], pa.string()),
            "op": pa.array([r[3] for r in rows], pa.string()),
        }
    )


def apply(model: Model, rows: list[tuple[int, str, str | None, str]]) -> None:
    for i, shelf, value, op in rows:
        name, day, at, at_tz = key_of(i)
        key = (name, day, micros(at), micros(at_tz))
        if op == "D":
            model.pop(key, None)
        else:
            model[key] = (shelf, str(value))


def table_rows(sink: Upserts) -> Model:
    rows = read_rows(sink.catalog.load_table(sink.table), '"name", "day", "at", "at_tz", "shelf", "value"')
    found = {(r[0], r[1], micros(r[2]), micros(r[3])): (r[4], r[5]) for r in rows}
    assert len(found) == len(rows), "a key is visible twice"
    return found


@pytest.mark.parametrize("spec", [BY_SHELF, BY_DAY], ids=["by_shelf", "by_day"])
def test_a_composite_key_of_every_key_type_upserts_and_moves_rows_between_partitions(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], spec: PartitionSpec
) -> None:
    catalog.create_table("ns.typed", SCHEMA, partition_spec=spec)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.typed")
    model: Model = {}
    first = [(i, ("a", "b")[i % 2], f"v1-{i}", "I") for i in range(30)]
    sink.apply(changes(first), key=KEY)
    apply(model, first)
    assert table_rows(sink) == model
    # Updates in place and across shelves, deletes, a delete of an absent key, inserts.
    second = (
        [(i, "a", f"v2-{i}", "U") for i in range(0, 10)]
        + [(i, "c", None, "D") for i in range(10, 15)]
        + [(99, "c", None, "D")]
        + [(i, "c", f"v2-{i}", "I") for i in range(30, 35)]
    )
    pre_commit = sink.apply(changes(second), key=KEY)
    apply(model, second)
    assert table_rows(sink) == model
    counts = pre_commit.tables[0].changes
    assert counts is not None
    assert (counts.updated, counts.deleted, counts.inserted, counts.deletes_of_absent_keys) == (10, 5, 5, 1)
    # Each partition value is one file: the rewritten files took the upserted rows of theirs.
    files = sink.catalog.load_table("ns.typed").inspect.files().to_pylist()
    if spec is BY_SHELF:
        assert sorted(str(f["partition"]["shelf"]) for f in files) == ["a", "b", "c"]
    else:
        days = {(dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=k[3])).date() for k in model}
        assert sorted(f["partition"]["at_tz_day"] for f in files) == sorted(days)


def test_a_file_of_an_earlier_partition_spec_is_rewritten_into_the_current_one(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """The table gained a partition field after its file was written: the rewrite splits the kept
    rows by the current spec, and a file every row of which the epoch replaces leaves nothing."""
    from tests.spark.test_upsert import SCHEMA as ACCOUNTS
    from tests.spark.test_upsert import Model as Accounts
    from tests.spark.test_upsert import apply_to_model, changes_of

    for name, second in (
        ("ns.kept", [(k, "eu", f"v2-{k}", "U") for k in range(5)] + [(40, "ap", "v2-40", "I")]),
        ("ns.emptied", [(k, "eu", None, "D") for k in range(30)]),
    ):
        table = catalog.create_table(name, ACCOUNTS)
        (tmp_path / name).mkdir()
        sink = Upserts(spark, tmp_path / name, catalog, catalog_props, name)
        model: Accounts = {}
        first = [(k, ("eu", "us", "ap")[k % 3], f"v1-{k}", "I") for k in range(30)]
        sink.apply(changes_of(first))
        apply_to_model(model, first)
        with table.update_spec() as update:
            update.add_identity("region")
        pre_commit = sink.apply(changes_of(second))
        apply_to_model(model, second)
        assert sink.rows() == model, name
        files = catalog.load_table(name).inspect.files().to_pylist()
        if model:
            # The old file's kept rows, one file per region now; the epoch's rows, new files of theirs
            # (a file of an earlier spec takes none: its partition is not one of the current spec).
            assert sorted(str(f["partition"]["region"]) for f in files) == ["ap", "ap", "eu", "eu", "us"], files
        else:
            assert files == [] and pre_commit.tables[0].data_files == [], name
