"""IcebergSinkCommitter.commit on real tables: what lands, what is refused, what is idempotent."""

from __future__ import annotations

import datetime as dt
import uuid
from datetime import timedelta

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

from airflow_provider_exactly_once.core.errors import (
    CommitRefused,
    ForeignWriteVisible,
    InvalidSinkConfig,
    MarkerHorizonExceeded,
    MissingDataFiles,
    SchemaMismatch,
    UnknownTable,
)
from airflow_provider_exactly_once.core.faults import SimulatedCrash, no_faults
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan, FileCheck, SinkCommitter
from airflow_provider_exactly_once.core.precommit import PartitionValue, PreCommit, WrittenColumn
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import EpochSnapshot, commit_snapshots
from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, SINK_ID_KEY, WRITE_ID_KEY
from airflow_provider_exactly_once.sinks.iceberg.table_transactions import SETTING
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    FAULT_AFTER_CATALOG_UPDATE,
    FAULT_BEFORE_CATALOG_UPDATE,
)
from airflow_provider_exactly_once.sinks.iceberg.write_check import ColumnToAdd
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_branch

from .iceberg_helpers import (
    branch_head,
    create_table,
    ids_in,
    local_path,
    now,
    pre_commit,
    rows,
    simple_write,
    snapshot_count,
    table_write,
    write_location,
    write_parquet,
)


def test_is_a_sink_committer(catalog: SqlCatalog) -> None:
    assert isinstance(IcebergSinkCommitter(catalog), SinkCommitter)


def test_happy_path_one_table(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, epoch=1234, count=7, files=2)

    result = IcebergSinkCommitter(catalog, branch=branch).commit(CommitPlan(pc), now())

    table = table.refresh()
    assert len(table.metadata.snapshots) == 1
    head = branch_head(table, branch)
    snapshot = table.snapshot_by_id(head) if head is not None else None
    assert snapshot is not None
    assert result == {"ns.t": str(snapshot.snapshot_id)}
    assert snapshot.summary is not None
    assert snapshot.summary[SINK_ID_KEY] == sink_id
    assert snapshot.summary[EPOCH_KEY] == "1234"
    assert snapshot.summary[WRITE_ID_KEY] == pc.write_id
    assert ids_in(table, branch) == list(range(14))
    assert [r[0] for r in read_branch(table, branch, "id")] == list(range(14))
    if branch != "main":
        assert "main" not in table.metadata.refs  # the first commit created the branch, not main
    read = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().sort_by("id")
    assert read["name"].to_pylist() == [f"n{i}" for i in range(14)]
    assert read["score"].to_pylist() == [i / 2 for i in range(14)]
    # Spark-like Parquet has no field ids: the commit gave the table a name mapping.
    assert table.metadata.name_mapping() is not None


def test_recommit_is_idempotent(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer = IcebergSinkCommitter(catalog, branch=branch)
    since = now()

    first = committer.commit(CommitPlan(pc), since)
    second = committer.commit(CommitPlan(pc), since)
    third = IcebergSinkCommitter(catalog, branch=branch).commit(CommitPlan(pc), since)  # a fresh process's retry

    assert first == second == third
    assert snapshot_count(table) == 1
    assert ids_in(table, branch) == list(range(5))
    assert committer.find_committed(pc, since).tables == first
    assert committer.find_committed(pc, since).write_ids == {"ns.t": pc.write_id}


def test_fan_out_over_three_tables(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    tables = [create_table(catalog, f"t{i}") for i in range(3)]
    write_id = str(uuid.uuid4())
    writes = []
    for i, table in enumerate(tables):
        location = write_location(table, write_id)
        writes.append(table_write(table, location, [write_parquet(table, location, rows(100 * i, 3))]))
    pc = pre_commit(sink_id, 7, writes, write_id=write_id)
    committer = IcebergSinkCommitter(catalog, branch=branch)

    result = committer.commit(CommitPlan(pc), now())

    assert list(result) == ["ns.t0", "ns.t1", "ns.t2"]
    for i, table in enumerate(tables):
        table = table.refresh()
        head = branch_head(table, branch)
        snapshot = table.snapshot_by_id(head) if head is not None else None
        assert snapshot is not None and snapshot.summary is not None
        assert result[f"ns.t{i}"] == str(snapshot.snapshot_id)
        assert snapshot.summary[WRITE_ID_KEY] == write_id
        assert ids_in(table, branch) == [100 * i, 100 * i + 1, 100 * i + 2]
    assert committer.commit(CommitPlan(pc), now()) == result
    assert [snapshot_count(t) for t in tables] == [1, 1, 1]


def _middle_empty(tables: list[Table], sink_id: str, epoch: int) -> PreCommit:
    """One write of 3 rows into the first and last of ``tables`` and of nothing into the middle one."""
    write_id = str(uuid.uuid4())
    writes = []
    for i, table in enumerate(tables):
        location = write_location(table, write_id)
        files = [] if i == 1 else [write_parquet(table, location, rows(1000 * epoch + 100 * i, 3))]
        writes.append(table_write(table, location, files))
    return pre_commit(sink_id, epoch, writes, write_id=write_id)


def test_a_fan_out_of_three_tables_with_the_middle_one_empty_commits_and_so_do_its_retries(
    catalog: SqlCatalog, sink_id: str, branch: str
) -> None:
    """Scenario (issue 54): a fan-out of three tables, the middle one empty in the epoch, so fewer
    tables take a snapshot than were checked: an indexing slip between the two leaves a decided
    epoch stuck, an ``IndexError`` on every retry. The epoch commits as prepared; and decided, after
    a crash between the tables, a new process commits the rest with nothing prepared, through a
    conflict retry on the last table. DuckDB reads every table right."""
    tables = [create_table(catalog, f"t{i}") for i in range(3)]
    names = [".".join(table.name()) for table in tables]
    first = _middle_empty(tables, sink_id, 7)
    committer = IcebergSinkCommitter(catalog, branch=branch)

    result = committer.commit(committer.prepare(first, check_files=FileCheck.EVERY_FILE), now())
    assert result["ns.t1"] == EMPTY and result["ns.t0"] != EMPTY and result["ns.t2"] != EMPTY
    assert [snapshot_count(t) for t in tables] == [1, 0, 1]

    second = _middle_empty(tables, sink_id, 8)
    faults = FaultSwitch()
    faults.crash_at(FAULT_AFTER_CATALOG_UPDATE)  # t0 committed, then the process dies
    # Table by table (Glue, or a catalog switched to it), where a crash can fall between the tables.
    table_by_table = SqlCatalog(catalog.name, **{**catalog.properties, SETTING: "false"})
    crashing = IcebergSinkCommitter(table_by_table, branch=branch, fault=faults)
    with pytest.raises(SimulatedCrash):
        crashing.commit(crashing.prepare(second, check_files=FileCheck.EVERY_FILE), now())
    table_by_table.engine.dispose()
    assert [snapshot_count(t) for t in tables] == [2, 0, 1]

    faults = FaultSwitch()  # another writer appends to t2's branch under the new process's first attempt
    faults.then(FAULT_BEFORE_CATALOG_UPDATE, lambda: catalog.load_table("ns.t2").append(rows(-5, 1), branch=branch))
    resumed = IcebergSinkCommitter(catalog, branch=branch, fault=faults)
    decided = CommitPlan(second)  # a decided epoch is committed with nothing prepared
    committed = resumed.commit(decided, now())
    assert faults.seen[FAULT_BEFORE_CATALOG_UPDATE] == 2  # t2 refused once, then committed
    assert committed["ns.t1"] == EMPTY and committed["ns.t0"] != EMPTY and committed["ns.t2"] != EMPTY
    assert IcebergSinkCommitter(catalog, branch=branch).commit(decided, now()) == committed  # and again: nothing
    assert [snapshot_count(t) for t in tables] == [2, 0, 3]  # one marked snapshot per write, the foreign one

    for i, (table, name) in enumerate(zip(tables, names, strict=True)):
        expected = [1000 * epoch + 100 * i + n for epoch in (7, 8) for n in range(3)] if i != 1 else []
        foreign = [-5] if i == 2 else []
        assert [r[0] for r in read_branch(table.refresh(), branch, "id")] == sorted(foreign + expected), name


def test_fan_out_refusal_on_one_table_commits_none(catalog: SqlCatalog, sink_id: str) -> None:
    good, bad = create_table(catalog, "good"), create_table(catalog, "bad")
    write_id = str(uuid.uuid4())
    loc_good, loc_bad = write_location(good, write_id), write_location(bad, write_id)
    pc = pre_commit(
        sink_id,
        7,
        [
            table_write(good, loc_good, [write_parquet(good, loc_good, rows(0, 3))]),
            table_write(
                bad,
                loc_bad,
                [write_parquet(bad, loc_bad, rows(0, 3))],
                schema_written=[WrittenColumn(name="id", type="string")],
            ),
        ],
        write_id=write_id,
    )
    with pytest.raises(SchemaMismatch, match=r"'ns.bad'.*id"):
        IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now())
    assert snapshot_count(good) == 0 and snapshot_count(bad) == 0


def test_empty_epoch_makes_no_snapshot(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = pre_commit(sink_id, 5, [table_write(table, write_location(table, "w"), [])])

    assert IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now()) == {"ns.t": EMPTY}
    assert snapshot_count(table) == 0


def test_missing_data_files_are_named_and_nothing_committed(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, files=3)
    gone = pc.tables[0].data_files[1].path
    local_path(gone).unlink()

    with pytest.raises(MissingDataFiles) as caught:
        IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now())

    assert caught.value.paths == [gone]
    assert gone in str(caught.value)
    assert snapshot_count(table) == 0


def test_incompatible_schema_is_refused_before_anything_is_committed(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, schema_written=[WrittenColumn(name="score", type="string")])

    with pytest.raises(SchemaMismatch, match=r"'ns.t'.*score.*string.*double"):
        IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now())
    assert snapshot_count(table) == 0


def _write_with_new_column(table_name: str, catalog: SqlCatalog, sink_id: str):  # type: ignore[no-untyped-def]
    table = create_table(catalog, table_name)
    write_id = str(uuid.uuid4())
    location = write_location(table, write_id)
    data = rows(0, 4).append_column("country", pa.array(["fr", "de", None, "it"]))
    descriptor = write_parquet(table, location, data)
    assert "country" in descriptor.value_counts  # keyed by name although the table lacks the column
    new = WrittenColumn(name="country", type="string", doc="ISO code")
    written = [
        WrittenColumn(name="id", type="long"),
        WrittenColumn(name="name", type="string"),
        WrittenColumn(name="score", type="double"),
        new,
    ]
    tw = table_write(table, location, [descriptor], schema_written=written, added_columns=[new])
    return table, pre_commit(sink_id, 9, [tw], write_id=write_id)


def test_added_columns_are_added_in_the_same_commit(catalog: SqlCatalog, sink_id: str) -> None:
    table, pc = _write_with_new_column("t", catalog, sink_id)

    result = IcebergSinkCommitter(catalog, allow_schema_evolution=True).commit(CommitPlan(pc), now())

    table = table.refresh()
    field = table.schema().find_field("country")
    assert not field.required and field.doc == "ISO code"
    assert len(table.metadata.snapshots) == 1
    snapshot = table.current_snapshot()
    assert snapshot is not None and result == {"ns.t": str(snapshot.snapshot_id)}
    # The snapshot was written against the evolved schema, and the name mapping knows the column.
    assert snapshot.schema_id == table.schema().schema_id
    mapping = table.metadata.name_mapping()
    assert mapping is not None and "country" in {name for f in mapping for name in f.names}
    read = table.scan().to_arrow().sort_by("id")
    assert read["country"].to_pylist() == ["fr", "de", None, "it"]
    # Stats of the new column were translated to its new field id.
    entries = list(table.scan().plan_files())
    assert field.field_id in entries[0].file.value_counts
    assert table.scan(row_filter="country == 'it'").to_arrow()["id"].to_pylist() == [3]


def test_added_columns_refused_without_schema_evolution(catalog: SqlCatalog, sink_id: str) -> None:
    table, pc = _write_with_new_column("t", catalog, sink_id)

    with pytest.raises(SchemaMismatch, match=r"country.*allow_schema_evolution"):
        IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now())
    assert snapshot_count(table) == 0
    assert "country" not in table.refresh().schema().column_names


def test_unknown_table(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    renamed = pc.model_copy(update={"tables": [pc.tables[0].model_copy(update={"table": "ns.nope"})]})
    with pytest.raises(UnknownTable, match=r"ns\.nope"):
        IcebergSinkCommitter(catalog).commit(CommitPlan(renamed), now())
    other_ns = pc.model_copy(update={"tables": [pc.tables[0].model_copy(update={"table": "nons.t"})]})
    with pytest.raises(UnknownTable, match=r"nons\.t"):
        IcebergSinkCommitter(catalog).prepare(other_ns)


def test_foreign_marker_is_not_overwritten(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t")
    first = simple_write(table, sink_id, epoch=3)
    committer = IcebergSinkCommitter(catalog, branch=branch)
    committer.commit(CommitPlan(first), now())
    second = simple_write(table, sink_id, epoch=3, start=50)

    with pytest.raises(ForeignWriteVisible, match=first.write_id):
        committer.commit(CommitPlan(second), now())
    assert snapshot_count(table) == 1
    assert committer.find_committed(second, now()).write_ids == {"ns.t": first.write_id}


def test_identity_and_day_partitions(catalog: SqlCatalog, sink_id: str) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "ts", TimestampType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"),
        PartitionField(source_id=3, field_id=1001, transform=DayTransform(), name="ts_day"),
    )
    table = create_table(catalog, "p", schema, spec=spec)
    arrow_schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("ts", pa.timestamp("us"))])
    write_id = str(uuid.uuid4())
    location = write_location(table, write_id)
    descriptors = []
    epoch_day = dt.date(1970, 1, 1)
    for n, (region, day) in enumerate(
        [("eu", dt.date(2024, 3, 1)), ("us", dt.date(2024, 3, 1)), ("eu", dt.date(2024, 3, 2))]
    ):
        ts = dt.datetime.combine(day, dt.time(12, 0))
        data = pa.table({"id": [n * 10, n * 10 + 1], "region": [region] * 2, "ts": [ts, ts]}, schema=arrow_schema)
        partition: dict[str, PartitionValue] = {"region": region, "ts_day": (day - epoch_day).days}
        descriptors.append(write_parquet(table, f"{location}/region={region}", data, partition=partition))
    pc = pre_commit(sink_id, 1, [table_write(table, location, descriptors)], write_id=write_id)

    IcebergSinkCommitter(catalog).commit(CommitPlan(pc), now())

    table = table.refresh()
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [0, 1, 10, 11, 20, 21]
    # Pruning by partition: the filtered scans plan only the matching files.
    eu = list(table.scan(row_filter="region == 'eu'").plan_files())
    assert sorted(task.file.file_path for task in eu) == sorted([descriptors[0].path, descriptors[2].path])
    day2 = list(table.scan(row_filter="ts >= '2024-03-02T00:00:00'").plan_files())
    assert [task.file.file_path for task in day2] == [descriptors[2].path]
    partitions = {task.file.file_path: task.file.partition for task in table.scan().plan_files()}
    assert partitions[descriptors[1].path][0] == "us"
    assert partitions[descriptors[1].path][1] == (dt.date(2024, 3, 1) - epoch_day).days


def test_horizon_refusal_and_override(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t", properties={"history.expire.max-snapshot-age-ms": str(3_600_000)})
    pc = simple_write(table, sink_id)
    long_ago = now() - timedelta(hours=2)
    committer = IcebergSinkCommitter(catalog, clock_skew=timedelta(0), branch=branch)

    with pytest.raises(MarkerHorizonExceeded, match=r"history.expire.max-snapshot-age-ms.*allow_beyond_horizon"):
        committer.commit(CommitPlan(pc), long_ago)
    assert snapshot_count(table) == 0

    result = committer.commit(CommitPlan(pc), long_ago, allow_beyond_horizon=True)
    assert snapshot_count(table) == 1
    # Within the horizon the same call is an idempotent no-op that finds the marker.
    assert committer.commit(CommitPlan(pc), now() - timedelta(minutes=5)) == result
    assert snapshot_count(table) == 1 and ids_in(table, branch) == list(range(5))


def test_default_horizon_is_five_days(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer = IcebergSinkCommitter(catalog)
    with pytest.raises(MarkerHorizonExceeded):
        committer.commit(CommitPlan(pc), now() - timedelta(days=5, hours=1))
    committer.commit(CommitPlan(pc), now() - timedelta(days=4))
    assert snapshot_count(table) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"branch": ""}, "branch"),
        ({"clock_skew": timedelta(seconds=-1)}, "clock_skew"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_initial_s": -1.0}, "backoff_initial_s"),
        ({"backoff_initial_s": 2.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ({"allow_schema_evolution": "yes"}, "allow_schema_evolution"),
    ],
)
def test_constructor_validation(catalog: SqlCatalog, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        IcebergSinkCommitter(catalog, **kwargs)  # type: ignore[arg-type]


def test_constructor_needs_a_catalog() -> None:
    with pytest.raises(InvalidSinkConfig, match="pyiceberg Catalog"):
        IcebergSinkCommitter("sqlite://")  # type: ignore[arg-type]


def test_naive_since_is_refused(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    with pytest.raises(ValueError, match="timezone"):
        IcebergSinkCommitter(catalog).commit(CommitPlan(pc), dt.datetime.now())


def test_files_of_an_older_partitioned_spec_keep_their_partition(
    catalog: SqlCatalog, sink_id: str, branch: str
) -> None:
    table = create_table(catalog, "t")
    with table.update_spec() as update:
        update.add_identity("name")
    table = table.refresh()
    write_id = str(uuid.uuid4())
    location = write_location(table, write_id)
    files = [
        write_parquet(table, f"{location}/name={n}", rows(i, 1), partition={"name": n})
        for i, n in ((0, "n0"), (1, "n1"))
    ]
    pc = pre_commit(sink_id, 3, [table_write(table, location, files)], write_id=write_id)
    assert pc.tables[0].spec_id == 1
    with table.update_spec() as update:  # spec 2 between the write and the commit
        update.add_identity("id")

    result = IcebergSinkCommitter(catalog, branch=branch).commit(CommitPlan(pc), now())

    table = table.refresh()
    assert table.metadata.default_spec_id == 2
    head = int(result["ns.t"])
    assert ids_in(table, branch) == [0, 1] and [r[0] for r in read_branch(table, branch, "id")] == [0, 1]
    planned = {
        t.file.file_path: (t.file.spec_id, t.file.partition[0]) for t in table.scan(snapshot_id=head).plan_files()
    }
    assert planned == {files[0].path: (1, "n0"), files[1].path: (1, "n1")}
    pruned = table.scan(snapshot_id=head, row_filter="name == 'n1'").plan_files()
    assert [t.file.file_path for t in pruned] == [files[1].path]
    summary = table.snapshot_by_id(head).summary  # type: ignore[union-attr]
    assert summary is not None and summary["changed-partition-count"] == "2"


def test_a_refusal_while_staging_is_a_package_error_that_retrying_cannot_heal(
    catalog: SqlCatalog, sink_id: str
) -> None:
    """prepare() checks what pyiceberg is known to refuse; whatever else it refuses while staging the
    append (here: a column to add that the table has) must still come out as this package's error."""
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    clash = [ColumnToAdd("name", StringType(), None)]
    with pytest.raises(CommitRefused, match=r"epoch 1000 .*'ns.t' on branch 'main': ValueError") as caught:
        commit_snapshots(table, [EpochSnapshot(pc, pc.tables[0], clash, None)], branch="main", fault=no_faults)
    assert not caught.value.retryable
    assert snapshot_count(table) == 0
