"""Reading an epoch's snapshot range of an upstream Iceberg table (``spark.snapshot_range_reads``),
through ``inputs.read_input``: a real local Spark session and a real SQLite pyiceberg catalog whose
table is appended to, overwritten, expired and evolved by pyiceberg, as an upstream job would."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import StringType
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InputRangeRefused
from airflow_provider_exactly_once.core.input_ranges import POSITIONS_KIND, SnapshotRange
from airflow_provider_exactly_once.spark.inputs import read_input
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from airflow_provider_exactly_once.spark.snapshot_range_reads import range_snapshots
from tests.spark.conftest import EPOCH, INTERVAL_END, INTERVAL_START, make_table

UPSTREAM = "ns.upstream"
START = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def batch(table: Table, first: int, count: int, *, extra: bool = False) -> pa.Table:
    """Rows ``first`` .. ``first + count - 1`` in the table's current schema; a row every five hours,
    so a batch spans days; names from a handful, so an identity partition has several values."""
    ids = range(first, first + count)
    columns: dict[str, Any] = {
        "id": list(ids),
        "ts": [START + dt.timedelta(hours=5 * i) for i in ids],
        "amount": [i * 0.5 for i in ids],
    }
    names = [f"name-{i % 3}" if i % 7 else None for i in ids]
    columns["label" if extra else "name"] = names
    if extra:
        columns["extra"] = [f"x{i}" for i in ids]
    return pa.Table.from_pydict(columns, schema=table.schema().as_arrow())


def spec(props: dict[str, str], after: int | None, to: int | None, table: str = UPSTREAM) -> EpochJobSpec:
    return EpochJobSpec.model_validate(
        {
            "sink_id": "sink-r",
            "epoch": EPOCH,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_END,
            "input": {"kind": "iceberg_table", "table": table},
            "target": {"kind": "iceberg", "catalog_properties": props, "table": "ns.sink"},
            "input_range": {"table": table, "after_snapshot_id": after, "to_snapshot_id": to},
            "input_catalog_name": "default",  # the name the ``catalog`` fixture made the table under
            "input_catalog_properties": props,
        }
    )


def appended(table: Table, rows: pa.Table) -> int:
    table.append(rows)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def read_rows(spark: Any, job: EpochJobSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    read = read_input(spark, job)
    assert read.frame is not None and read.source_positions is not None
    return sorted(read.frame.toArrow().to_pylist(), key=lambda r: r["id"]), read.source_positions


def rows_of(*tables: pa.Table) -> list[dict[str, Any]]:
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: r["id"])


def first_not_append(table: Table) -> Any:
    return next(s for s in table.snapshots() if s.summary is not None and s.summary.operation != Operation.APPEND)


def test_consecutive_ranges_read_each_row_once(spark: Any, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    table = make_table(catalog, UPSTREAM)
    batches = [batch(table, 0, 40), batch(table, 40, 25), batch(table, 65, 30), batch(table, 95, 10)]
    ids = [appended(table, b) for b in batches]

    first, first_positions = read_rows(spark, spec(catalog_props, None, ids[1]))
    second, second_positions = read_rows(spark, spec(catalog_props, ids[1], ids[2]))
    third, third_positions = read_rows(spark, spec(catalog_props, ids[2], ids[3]))

    assert first == rows_of(batches[0], batches[1])
    assert second == rows_of(batches[2])
    assert third == rows_of(batches[3])
    every = [r["id"] for r in first + second + third]
    assert sorted(every) == list(range(105))  # each row once, none missing
    assert first_positions == {
        "kind": POSITIONS_KIND,
        "table": UPSTREAM,
        "after_snapshot_id": None,
        "to_snapshot_id": ids[1],
        "snapshots": 2,
        "files": 2,
        "records": 65,
    }
    assert (second_positions["snapshots"], second_positions["records"]) == (1, 30)
    assert (third_positions["after_snapshot_id"], third_positions["records"]) == (ids[2], 10)


def test_files_of_the_range_merged_into_later_manifests_are_read_once(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Appends that merge manifests (Java's default) move the files earlier appends added into a
    manifest of their own, as EXISTING entries: planned from the range end's manifest list, a file
    added in the range is found wherever it moved, and one added before it never is."""
    table = make_table(catalog, UPSTREAM)
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
    table = catalog.load_table(UPSTREAM)
    batches = [batch(table, 10 * n, 10) for n in range(6)]
    ids = [appended(table, b) for b in batches]
    end = table.metadata.snapshot_by_id(ids[4])
    assert end is not None and len(end.manifests(table.io)) < 5, "the appends merged no manifest"

    first, _ = read_rows(spark, spec(catalog_props, ids[1], ids[4]))
    second, positions = read_rows(spark, spec(catalog_props, ids[4], ids[5]))
    assert first == rows_of(*batches[2:5])
    assert second == rows_of(batches[5]) and positions["files"] == 1


def compact(table: Table) -> int:
    """Another engine's compaction: every live data file rewritten into one with the same rows,
    committed as the spec's ``replace`` (pyiceberg 0.12 has no such operation: its overwrite
    producer with the operation set, as Java's ``RewriteFiles`` commits one)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.snapshots import Summary

    tasks = list(table.scan().plan_files())
    rows = table.scan().to_arrow()
    with table.transaction() as tx:
        producer = tx.update_snapshot().overwrite()
        summarised = producer._summary  # totals as an overwrite's (pyiceberg refuses to total a replace)
        producer._summary = lambda props: Summary(  # type: ignore[method-assign]
            Operation.REPLACE, **summarised(props).additional_properties
        )
        for task in tasks:
            producer.delete_data_file(task.file)
        for data_file in _dataframe_to_data_files(tx.table_metadata, rows, table.io):
            producer.append_data_file(data_file)
        producer.commit()
    snapshot = table.refresh().current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation is Operation.REPLACE
    return snapshot.snapshot_id


def test_a_compaction_in_the_range_is_stepped_over_and_each_row_read_once(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """A replace changes no row: the range reads what its appends added, also the files the
    compaction removed (they stay in storage while the range's snapshots name them), and never the
    compacted file, which also holds rows from before the range."""
    table = make_table(catalog, UPSTREAM)
    batches = [batch(table, 10 * n, 10) for n in range(5)]
    before, *in_range = (appended(table, b) for b in batches[:3])
    replaced = compact(table)  # the three appends' files, one from before the range among them
    after = appended(table, batches[3])

    rows, positions = read_rows(spark, spec(catalog_props, before, after))
    assert rows == rows_of(batches[1], batches[2], batches[3])
    assert (positions["snapshots"], positions["files"], positions["records"]) == (4, 3, 30)
    ending, _ = read_rows(spark, spec(catalog_props, before, replaced))
    assert ending == rows_of(batches[1], batches[2])
    empty = read_input(spark, spec(catalog_props, in_range[-1], replaced))
    assert empty.frame is None and empty.source_positions is not None  # the replace alone added nothing
    last, _ = read_rows(spark, spec(catalog_props, replaced, after))
    assert last == rows_of(batches[3])


def test_frame_schema_follows_the_iceberg_schema(spark: Any, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    table = make_table(catalog, UPSTREAM)
    to = appended(table, batch(table, 0, 5))
    read = read_input(spark, spec(catalog_props, None, to))
    assert read.frame is not None
    assert read.frame.schema == st.StructType(
        [
            st.StructField("id", st.LongType(), nullable=False),  # required upstream
            st.StructField("name", st.StringType()),
            st.StructField("ts", st.TimestampType()),  # timestamptz
            st.StructField("amount", st.DoubleType()),
        ]
    )


def test_empty_range_returns_no_frame_and_touches_nothing(spark: Any, catalog_props: dict[str, str]) -> None:
    # No catalog behind these properties: an empty range must not even load the table.
    nowhere = {**catalog_props, "uri": "sqlite:////nonexistent/dir/catalog.db"}
    for after, to in ((None, None), (123, 123)):
        read = read_input(spark, spec(nowhere, after, to))
        assert read.frame is None
        assert read.source_positions == {
            "kind": POSITIONS_KIND,
            "table": UPSTREAM,
            "after_snapshot_id": after,
            "to_snapshot_id": to,
            "snapshots": 0,
            "files": 0,
            "records": 0,
        }


def test_a_range_of_appends_without_files_returns_no_frame(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    table = make_table(catalog, UPSTREAM)
    after = appended(table, batch(table, 0, 5))
    to = appended(table, batch(table, 5, 0))  # pyiceberg commits an append of no rows as a snapshot
    read = read_input(spark, spec(catalog_props, after, to))
    assert read.frame is None
    assert read.source_positions is not None
    assert (read.source_positions["snapshots"], read.source_positions["files"]) == (1, 0)


def test_overwrite_and_delete_in_the_range_are_refused(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    table = make_table(catalog, UPSTREAM)
    kept = batch(table, 0, 10)
    first = appended(table, kept)
    table.overwrite(batch(table, 100, 5))  # pyiceberg: a delete of every file, then an append
    replaced = first_not_append(table)
    assert replaced.summary.operation == Operation.DELETE
    current = table.current_snapshot()
    assert current is not None

    with pytest.raises(InputRangeRefused) as refused:
        read_input(spark, spec(catalog_props, None, current.snapshot_id))
    message = str(refused.value)
    committed = dt.datetime.fromtimestamp(replaced.timestamp_ms / 1000, dt.UTC).isoformat()
    assert f"snapshot {replaced.snapshot_id} of {UPSTREAM} (committed {committed})" in message
    assert "is not an append: its operation is 'delete'" in message and "appends only" in message
    assert "sink 'sink-r' epoch" in message

    # The range before it reads as ever; the one after it (appends only) too.
    assert read_rows(spark, spec(catalog_props, None, first))[0] == rows_of(kept)
    appended_after, _ = read_rows(spark, spec(catalog_props, current.parent_snapshot_id, current.snapshot_id))
    assert [r["id"] for r in appended_after] == list(range(100, 105))

    # A delete of some rows of a file rewrites it: an overwrite.
    before = current.snapshot_id
    table.delete("id = 101")
    rewritten = table.current_snapshot()
    assert rewritten is not None and rewritten.summary is not None
    assert rewritten.summary.operation == Operation.OVERWRITE
    after = appended(table, batch(table, 200, 3))
    with pytest.raises(
        InputRangeRefused, match=f"snapshot {rewritten.snapshot_id} .* is not an append: its operation is 'overwrite'"
    ):
        read_input(spark, spec(catalog_props, before, after))


def test_expired_snapshots_are_refused_naming_the_range(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    table = make_table(catalog, UPSTREAM)
    ids = [appended(table, batch(table, 10 * i, 10)) for i in range(4)]
    # pyiceberg's expiry: the snapshots go, and their children's parent links with them.
    table.maintenance.expire_snapshots().by_id(ids[0]).commit()
    table.maintenance.expire_snapshots().by_id(ids[2]).commit()
    assert table.metadata.snapshot_by_id(ids[0]) is None
    kept = table.metadata.snapshot_by_id(ids[1])
    assert kept is not None and kept.parent_snapshot_id is None

    # From the first snapshot: ids[1] looks like a root, but ids[0]'s file is still live.
    job = spec(catalog_props, None, ids[1])
    with pytest.raises(InputRangeRefused) as refused:
        read_input(spark, job)
    message = str(refused.value)
    assert f"was added by snapshot {ids[0]}, which is gone" in message
    assert job.input_range is not None and job.input_range.describe() in message
    assert "history.expire.max-snapshot-age-ms" in message and "start_after_snapshot_id" in message

    # The range's end gone.
    with pytest.raises(InputRangeRefused, match=f"snapshot {ids[2]} of {UPSTREAM} is gone"):
        read_input(spark, spec(catalog_props, ids[1], ids[2]))
    # The range's start gone with the link to it: an expiry cannot be told from a rollback.
    with pytest.raises(InputRangeRefused, match=f"snapshot {ids[3]} names no parent: the snapshots before it"):
        read_input(spark, spec(catalog_props, ids[2], ids[3]))


def test_an_expired_start_whose_child_still_names_it_is_read(catalog: Catalog) -> None:
    """Java's expiry keeps the parent links: the exclusive start need not be there, the rest must."""
    table = make_table(catalog, UPSTREAM)
    ids = [appended(table, batch(table, 10 * i, 10)) for i in range(4)]
    metadata = table.metadata
    without = metadata.model_copy(update={"snapshots": [s for s in metadata.snapshots if s.snapshot_id != ids[1]]})
    walked = range_snapshots(
        without, SnapshotRange(table=UPSTREAM, after_snapshot_id=ids[1], to_snapshot_id=ids[3]), "t"
    )
    assert [s.snapshot_id for s in walked] == ids[2:]
    with pytest.raises(InputRangeRefused, match=f"snapshot {ids[1]}, the parent of snapshot {ids[2]}, of"):
        range_snapshots(without, SnapshotRange(table=UPSTREAM, after_snapshot_id=ids[0], to_snapshot_id=ids[3]), "t")
    with pytest.raises(InputRangeRefused, match=f"snapshot {ids[1]}, the parent of snapshot {ids[2]}, of"):
        range_snapshots(without, SnapshotRange(table=UPSTREAM, to_snapshot_id=ids[3]), "t")


def test_rolled_back_upstream_is_refused(spark: Any, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    table = make_table(catalog, UPSTREAM)
    first = appended(table, batch(table, 0, 10))
    consumed = appended(table, batch(table, 10, 10))
    table.manage_snapshots().rollback_to_snapshot(first).commit()
    after_rollback = appended(table, batch(table, 20, 10))
    with pytest.raises(InputRangeRefused, match=f"snapshot {consumed} of {UPSTREAM} is not an ancestor of snapshot"):
        read_input(spark, spec(catalog_props, consumed, after_rollback))


def test_schema_change_after_the_range_does_not_change_its_read(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    table = make_table(catalog, UPSTREAM)
    batches = [batch(table, 0, 20), batch(table, 20, 20)]
    ids = [appended(table, b) for b in batches]
    before = read_rows(spark, spec(catalog_props, None, ids[1]))[0]

    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.add_column("extra", StringType())
    evolved = batch(table, 40, 10, extra=True)
    later = appended(table, evolved)

    again, _ = read_rows(spark, spec(catalog_props, None, ids[1]))
    assert again == before == rows_of(*batches)
    assert list(again[0]) == ["id", "name", "ts", "amount"]
    newer, _ = read_rows(spark, spec(catalog_props, ids[1], later))
    assert newer == rows_of(evolved)
    assert list(newer[0]) == ["id", "label", "ts", "amount", "extra"]


def test_partitioned_upstream_reads_its_partition_columns(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    # Identity: pyiceberg writes a day() partition only with pyiceberg-core, which is not installed.
    partitioning = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))
    table = make_table(catalog, UPSTREAM, spec=partitioning)
    batches = [batch(table, 0, 30), batch(table, 30, 30)]
    ids = [appended(table, b) for b in batches]

    rows, positions = read_rows(spark, spec(catalog_props, None, ids[1]))
    assert rows == rows_of(*batches)
    assert positions["files"] == 8  # a file per name (and null) and batch: several tasks' worth
    assert {r["name"] for r in rows} == {"name-0", "name-1", "name-2", None}
    second, _ = read_rows(spark, spec(catalog_props, ids[0], ids[1]))
    assert second == rows_of(batches[1])
