"""Reading an epoch's snapshot range of an upstream Iceberg table (``spark.inputs``),
through ``inputs.read_input``: a real local Spark session and a real SQLite pyiceberg catalog whose
table is appended to, overwritten, expired and evolved by pyiceberg, as an upstream job would."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg import manifest as manifests_module
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
)
from pyspark.sql import types as st

from airflow_provider_exactly_once.core.errors import InputRangeRefused
from airflow_provider_exactly_once.core.input_ranges import POSITIONS_KIND, SnapshotRange
from airflow_provider_exactly_once.spark.inputs import range_snapshots, read_input
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec
from airflow_provider_exactly_once.type_mapping import FIELD_ID
from tests.spark.conftest import EPOCH, INTERVAL_END, INTERVAL_START, make_table
from tests.support.independent_reader import read_rows as read_rows_independently

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


@contextmanager
def manifest_lists_read(monkeypatch: pytest.MonkeyPatch, table: Table) -> Iterator[list[int]]:
    """The snapshots whose manifest list the driver reads inside the block, in the order read:
    pyiceberg's reader of manifest lists (``pyiceberg.manifest.read_manifest_list``, which
    ``Snapshot.manifests`` calls on every call, its cache holding manifests, not lists) wrapped, each
    file read named by the snapshot that wrote it. The executors read data files only."""
    by_list = {s.manifest_list: s.snapshot_id for s in table.refresh().snapshots()}
    read: list[int] = []
    reader = manifests_module.read_manifest_list

    def counted(input_file: Any) -> Iterator[ManifestFile]:
        read.append(by_list[input_file.location])
        return reader(input_file)

    with monkeypatch.context() as patched:
        patched.setattr(manifests_module, "read_manifest_list", counted)
        yield read


def test_a_range_of_appends_is_planned_from_the_manifest_list_of_its_end_alone(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a replace in the range, every file its appends added is live at its end, in a
    manifest they wrote: one manifest list read, whatever the number of appends (each append's own
    list read instead grew the planning with the range's snapshots, ``bench.incremental_read``)."""
    table = make_table(catalog, UPSTREAM)
    batches = [batch(table, 10 * n, 10) for n in range(6)]
    before, *in_range = (appended(table, b) for b in batches)

    with manifest_lists_read(monkeypatch, table) as read:
        rows, positions = read_rows(spark, spec(catalog_props, before, in_range[-1]))
    assert read == [in_range[-1]]
    assert rows == rows_of(*batches[1:]) and (positions["snapshots"], positions["files"]) == (5, 5)


def merging(catalog: Catalog) -> Table:
    """The upstream with pyiceberg's merge-append (Java's default append): each append from the
    second on merges the manifests it finds into one it writes, its own files ADDED in it and the
    live files of earlier snapshots EXISTING, with the ids of the snapshots that added them."""
    table = make_table(catalog, UPSTREAM)
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
    return catalog.load_table(UPSTREAM)


def existing_at(table: Table, snapshot_id: int) -> set[int]:
    """The snapshots whose files sit as EXISTING entries in ``snapshot_id``'s manifests."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    return {
        entry.snapshot_id
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.status == ManifestEntryStatus.EXISTING and entry.snapshot_id is not None
    }


def test_appends_a_manifest_merge_moved_to_existing_entries_are_read_without_a_replace_in_the_range(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Planted bug "reading only ADDED entries after the last replace": the files of a range's
    appends that a later append of the range merged into its manifest are EXISTING there, and must
    be read, once; a file added before the range, EXISTING in the same manifest, never is."""
    table = merging(catalog)
    batches = [batch(table, 10 * n, 10) for n in range(6)]
    ids = [appended(table, b) for b in batches]
    assert set(ids[:4]) <= existing_at(table, ids[4]), "the appends merged no manifest"

    first, positions = read_rows(spark, spec(catalog_props, ids[1], ids[4]))
    assert first == rows_of(*batches[2:5]) and (positions["files"], positions["records"]) == (3, 30)
    second, positions = read_rows(spark, spec(catalog_props, ids[4], ids[5]))
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
    spark: Any, catalog: Catalog, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replace changes no row: the range reads what its appends added, also the files the
    compaction removed (they stay in storage while the range's snapshots name them), and never the
    compacted file, which also holds rows from before the range. The appends before the range's
    last replace are planned from their own manifest lists (their files are gone from its end's),
    the ones after it from the end's."""
    table = make_table(catalog, UPSTREAM)
    batches = [batch(table, 10 * n, 10) for n in range(5)]
    before, *in_range = (appended(table, b) for b in batches[:3])
    replaced = compact(table)  # the three appends' files, one from before the range among them
    after = [appended(table, b) for b in batches[3:]]

    with manifest_lists_read(monkeypatch, table) as read:
        rows, positions = read_rows(spark, spec(catalog_props, before, after[-1]))
    assert read == [*in_range, after[-1]]
    assert rows == rows_of(*batches[1:])
    assert (positions["snapshots"], positions["files"], positions["records"]) == (5, 4, 40)
    ending, _ = read_rows(spark, spec(catalog_props, before, replaced))
    assert ending == rows_of(batches[1], batches[2])
    empty = read_input(spark, spec(catalog_props, in_range[-1], replaced))
    assert empty.frame is None and empty.source_positions is not None  # the replace alone added nothing
    last, _ = read_rows(spark, spec(catalog_props, replaced, after[-1]))
    assert last == rows_of(*batches[3:])


def test_appends_a_manifest_merge_moved_to_existing_entries_are_read_with_a_replace_in_the_range(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Planted bug "reading only ADDED entries after the last replace", across a compaction: the
    appends after it merge their manifests (the compacted file's among them), so at the range's
    end all but the last one's files are EXISTING; the appends before it, merged as well, are read
    from their own lists, where their files are ADDED. Every row of the range once, none before it."""
    table = merging(catalog)
    batches = [batch(table, 10 * n, 10) for n in range(7)]
    before, *early = (appended(table, b) for b in batches[:3])
    replaced = compact(table)
    late = [appended(table, b) for b in batches[3:]]
    assert {*late[:-1], replaced} <= existing_at(table, late[-1]), "the appends merged no manifest"
    assert before in existing_at(table, early[-1])

    rows, positions = read_rows(spark, spec(catalog_props, before, late[-1]))
    assert rows == rows_of(*batches[1:])
    assert (positions["snapshots"], positions["files"], positions["records"]) == (7, 6, 60)
    last, _ = read_rows(spark, spec(catalog_props, replaced, late[-1]))
    assert last == rows_of(*batches[3:])


def append_with_deletes(table: Table, rows: pa.Table, deleted: DataFile) -> int:
    """An append that also adds a position-delete file (row 0 of ``deleted``) in a delete manifest:
    a writer that names a row delta an append (Java's ``RowDelta`` names it an overwrite; pyiceberg
    0.12 writes no delete file, so the manifest is written here, by pyiceberg's manifest writer
    saying DELETES as Java's delete-manifest writer does)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    location = f"{table.location()}/data/{uuid.uuid4()}-deletes.parquet"
    local = Path(location.removeprefix("file://"))
    pq.write_table(pa.table({"file_path": [deleted.file_path], "pos": pa.array([0], pa.int64())}), local)
    deletes = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=local.stat().st_size,
    )
    deletes.spec_id = table.spec().spec_id
    with table.transaction() as tx:
        producer = tx.update_snapshot().fast_append()
        for data_file in _dataframe_to_data_files(tx.table_metadata, rows, table.io):
            producer.append_data_file(data_file)

        def with_deletes(written: list[ManifestFile]) -> list[ManifestFile]:
            writer = producer.new_manifest_writer(tx.table_metadata.spec())
            writer.content = lambda: ManifestContent.DELETES  # type: ignore[method-assign]
            with writer:
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, data_file=deletes))
            return [*written, writer.to_manifest_file()]

        producer._process_manifests = with_deletes  # type: ignore[method-assign]
        producer.commit()
    snapshot = table.refresh().current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation is Operation.APPEND
    assert [m.content for m in snapshot.manifests(table.io) if m.added_snapshot_id == snapshot.snapshot_id] == [
        ManifestContent.DATA,
        ManifestContent.DELETES,
    ]
    return snapshot.snapshot_id


def test_an_append_that_adds_delete_files_is_refused_naming_it_with_or_without_a_replace_after_it(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Planted bug "the refusal of delete manifests dropped": a delete file's entries would be read
    as data rows. Planned from the range end's list, and from the append's own one when a
    compaction follows it in the range: refused both ways, naming the snapshot and the manifest."""
    table = make_table(catalog, UPSTREAM)
    first = batch(table, 0, 10)
    before = appended(table, first)
    first_file = next(iter(table.scan().plan_files())).file
    deleting = append_with_deletes(table, batch(table, 10, 10), first_file)
    assert table.scan().to_arrow().num_rows == 19  # a real delete file: pyiceberg's own scan applies it
    ranges = {"no replace": (before, deleting)}
    replaced = compact(table)
    ranges["a replace after it"] = (before, appended(table, batch(table, 30, 10)))
    assert replaced != deleting

    for why, (after, to) in ranges.items():
        with pytest.raises(InputRangeRefused) as refused:
            read_input(spark, spec(catalog_props, after, to))
        message = str(refused.value)
        assert f"snapshot {deleting} of {UPSTREAM}, in the range" in message, why
        assert "added delete files" in message and "start_after_snapshot_id" in message, why


def test_frame_schema_follows_the_iceberg_schema(spark: Any, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    table = make_table(catalog, UPSTREAM)
    to = appended(table, batch(table, 0, 5))
    read = read_input(spark, spec(catalog_props, None, to))
    assert read.frame is not None
    assert read.frame.schema == st.StructType(
        [
            # Required upstream, but Spark's Parquet reader reads every column as nullable (a sink's
            # required columns are checked for nulls as the write aligns the frame).
            # Each column is read by its field id, which it carries.
            st.StructField("id", st.LongType(), nullable=True, metadata={FIELD_ID: 1}),
            st.StructField("name", st.StringType(), metadata={FIELD_ID: 2}),
            st.StructField("ts", st.TimestampType(), metadata={FIELD_ID: 3}),  # timestamptz
            st.StructField("amount", st.DoubleType(), metadata={FIELD_ID: 4}),
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


EVOLVING = "ns.evolving_upstream"


def evolved_upstream(catalog: Catalog) -> tuple[Table, int]:
    """An upstream whose schema changed between two appends, partitioned by a column renamed since:
    a column and a struct's field renamed, a column dropped and another added under its name, one
    added, an int promoted to long. Returns the table and its last snapshot."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "score", IntegerType()),
        NestedField(4, "seen", TimestampType()),  # without zone: Spark's TIMESTAMP_NTZ
        NestedField(5, "info", StructType(NestedField(6, "a", StringType()), NestedField(7, "b", LongType()))),
        NestedField(8, "gone", StringType()),
    )
    by_name = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))
    table = catalog.create_table(EVOLVING, schema, partition_spec=by_name)

    def rows(first: int, evolved: bool) -> pa.Table:
        ids = range(first, first + 20)
        columns: dict[str, Any] = {
            "id": list(ids),
            "label" if evolved else "name": [f"n{i % 3}" if i % 5 else None for i in ids],
            "score": [i * 3 for i in ids],
            "seen": [dt.datetime(2024, 3, 1) + dt.timedelta(minutes=17 * i) if i % 4 else None for i in ids],
            "info": [{"alpha" if evolved else "a": f"a{i}", "b": i * 10} if i % 6 else None for i in ids],
            "gone": [f"{'new' if evolved else 'old'}-{i}" for i in ids],
        }
        if evolved:
            columns["extra"] = [i * 0.25 for i in ids]
        return pa.Table.from_pydict(columns, schema=table.schema().as_arrow())

    table.append(rows(0, evolved=False))
    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.rename_column("info.a", "alpha")
        update.update_column("score", LongType())
        update.delete_column("gone")
    with table.update_schema() as update:
        update.add_column("gone", StringType())  # a new column (a new id) under a dropped one's name
        update.add_column("extra", DoubleType())
    return table, appended(table, rows(20, evolved=True))


def check_evolved_read(spark: Any, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    """The range over both appends reads what pyiceberg's own scan and DuckDB read: each column by
    its field id, so the renamed ones hold their old files' values, the dropped column's values are
    not read as the new one's, and the added ones are null in the old file."""
    table, to = evolved_upstream(catalog)
    read = read_input(spark, spec(catalog_props, None, to, table=EVOLVING))
    assert read.frame is not None
    assert read.frame.columns == ["id", "label", "score", "seen", "info", "gone", "extra"]
    assert read.frame.schema["seen"].dataType == st.TimestampNTZType()
    assert read.frame.schema["score"].dataType == st.LongType()
    rows = sorted(read.frame.toArrow().to_pylist(), key=lambda r: r["id"])
    assert rows == sorted(table.scan(snapshot_id=to).to_arrow().to_pylist(), key=lambda r: r["id"])
    assert len(rows) == 40
    old, new = rows[7], rows[27]
    assert old["label"] == "n1" and old["info"] == {"alpha": "a7", "b": 70} and old["score"] == 21
    assert old["gone"] is None and old["extra"] is None  # the dropped column's values are not the new one's
    assert new["gone"] == "new-27" and new["extra"] == 6.75
    independent = read_rows_independently(table, "id, label, score, seen, gone, extra")
    assert [tuple(r[c] for c in ("id", "label", "score", "seen", "gone", "extra")) for r in rows] == independent


def test_a_range_across_schema_changes_reads_each_column_by_its_field_id(
    spark: Any, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    check_evolved_read(spark, catalog, catalog_props)
