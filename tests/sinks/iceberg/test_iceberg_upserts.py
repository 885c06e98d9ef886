"""The commit side of upsert writes (``sinks/iceberg/overwrites.py``) against real tables of a SQL
catalog: which files may hold the epoch's keys, and when the table moved so that the write must
not be committed. The Spark half is in ``tests/spark/test_upsert.py``."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import to_bytes
from pyiceberg.types import LongType, StringType

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, UpsertConflict
from airflow_provider_exactly_once.core.ports import FileCheck, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RevisedWrite, RewrittenFile
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, marker_properties
from airflow_provider_exactly_once.sinks.iceberg.overwrites import (
    files_to_rewrite,
    may_hold_keys,
    snapshots_since,
    upsert_files_to_replace,
)
from airflow_provider_exactly_once.sinks.iceberg.transaction import FAULT_BEFORE_CATALOG_UPDATE
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.upsert_writer import ARROW, KEYED, write_upsert

from .iceberg_helpers import NAMESPACE, create_table, rows


def key_range(low: int, high: int) -> dict[str, dict[str, str]]:
    encode = lambda v: base64.b64encode(to_bytes(LongType(), v)).decode()  # noqa: E731
    return {"key_lower_bounds": {"id": encode(low)}, "key_upper_bounds": {"id": encode(high)}}


def upsert(table_name: str, read: int | None, rewritten: list[str], low: int, high: int) -> PreCommit:
    write_id = str(uuid.uuid4())
    return PreCommit(
        sink_id="s",
        epoch=1,
        write_id=write_id,
        tables=[
            TableWrite(
                table=f"{NAMESPACE}.{table_name}",
                location=f"file:///nowhere/_eo/{write_id}",
                rewritten=[RewrittenFile(path=p, record_count=1) for p in rewritten],
                read_snapshot_id=read,
                changes=ChangeCounts(updated=1),
                **key_range(low, high),  # type: ignore[arg-type]
            )
        ],
    )


def data_files(table: object) -> list[str]:
    return sorted(t.file.file_path for t in table.scan().plan_files())  # type: ignore[attr-defined]


def test_a_file_may_hold_the_keys_only_when_its_key_statistics_overlap_the_epochs_range(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "ranges")
    table.append(rows(0, 10))  # ids 0..9
    (entry,) = list(table.scan().plan_files())
    pre = upsert("ranges", None, [], 20, 30)
    assert not may_hold_keys(table.metadata, entry.file, pre.tables[0])
    assert may_hold_keys(table.metadata, entry.file, upsert("ranges", None, [], 9, 30).tables[0])
    assert may_hold_keys(table.metadata, entry.file, upsert("ranges", None, [], -5, 0).tables[0])
    empty = pre.tables[0].model_copy(update={"key_lower_bounds": {}, "key_upper_bounds": {}})
    assert not may_hold_keys(table.metadata, entry.file, empty)  # no changes: no keys to collide with


def test_string_keys_compare_as_iceberg_orders_them_by_utf8_bytes(catalog: SqlCatalog) -> None:
    assert "é".encode() > b"z" and "é" > "z"  # and the same for code points above U+FFFF
    table = create_table(catalog, "strings")
    table.append(pa.table({"id": [1], "name": ["\uffff"], "score": [0.0]}, schema=table.schema().as_arrow()))
    (entry,) = list(table.scan().plan_files())
    encode = lambda v: base64.b64encode(to_bytes(StringType(), v)).decode()  # noqa: E731
    write = upsert("strings", None, [], 0, 0).tables[0]
    field = {"key_lower_bounds": {"name": encode("\U0001f600")}, "key_upper_bounds": {"name": encode("\U0001f600")}}
    # U+1F600 sorts after U+FFFF in UTF-8 bytes but before it in UTF-16 code units (what Java compares).
    assert not may_hold_keys(table.metadata, entry.file, write.model_copy(update=field))


def test_snapshots_since_the_read_are_the_heads_ancestors_newer_than_it(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "history")
    for n in range(3):
        table.append(rows(n * 10, 2))
    ids = [s.snapshot_id for s in table.metadata.snapshots]
    head = ids[-1]
    assert snapshots_since(table.metadata, head, ids[0]) == {ids[1], ids[2]}
    assert snapshots_since(table.metadata, head, None) == set(ids)
    assert snapshots_since(table.metadata, head, 12345) is None  # not an ancestor: rolled back or expired


def test_the_files_it_rewrote_are_found_and_a_file_gone_or_added_in_range_conflicts(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "moved")
    table.append(rows(0, 10))
    read = table.metadata.current_snapshot_id
    (path,) = data_files(table)
    found = files_to_rewrite(table, "main", (pre := upsert("moved", read, [path], 3, 4)), pre.tables[0])
    assert [f.file_path for f in found] == [path]

    table.append(rows(100, 5))  # ids 100..104: outside the epoch's range
    table = catalog.load_table(f"{NAMESPACE}.moved")
    assert [f.file_path for f in files_to_rewrite(table, "main", pre, pre.tables[0])] == [path]

    table.append(rows(4, 1))  # id 4: inside it
    table = catalog.load_table(f"{NAMESPACE}.moved")
    with pytest.raises(
        UpsertConflict, match=r"1 data file\(s\) added since its read may hold the epoch's keys"
    ) as caught:
        files_to_rewrite(table, "main", pre, pre.tables[0])
    assert caught.value.conflicting and caught.value.conflicting[0] not in (path,)

    table.overwrite(table.scan().to_arrow())  # a compaction: every file replaced by one with the same rows
    table = catalog.load_table(f"{NAMESPACE}.moved")
    with pytest.raises(UpsertConflict, match=r"1 file\(s\) it rewrote are no longer in the table") as gone:
        files_to_rewrite(table, "main", pre, pre.tables[0])
    assert gone.value.conflicting == (path,)
    assert "clear the run" in str(gone.value) and "Nothing was committed and nothing deleted" in str(gone.value)


def test_a_revision_removes_the_revised_writes_files_and_only_when_planned_against_it(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "revised")
    table.append(rows(0, 10))  # P
    base = table.metadata.current_snapshot_id
    (before,) = data_files(table)
    committed = upsert("revised", base, [before], 3, 4)
    # The revised write E, committed with the epoch's marker: it rewrote P's file into one of its own.
    table.overwrite(rows(0, 10), snapshot_properties=marker_properties("s", 1, committed.write_id))
    table = catalog.load_table(f"{NAMESPACE}.revised")
    (written,) = data_files(table)
    revised = RevisedWrite(
        write_id=committed.write_id,
        added=[written],
        rewritten=[before],
        **key_range(3, 4),  # type: ignore[arg-type]
    )
    pre = upsert("revised", base, [before], 5, 6)
    revision = pre.tables[0].model_copy(update={"revises": revised})
    pre = pre.model_copy(update={"tables": [revision]})

    found = upsert_files_to_replace(table, "main", pre, revision, None)

    assert [f.file_path for f in found] == [written]  # E's own file; P's is gone since E
    replaces = ReplacedWrite(committed.write_id, committed, {revision.table: "1"}, None, 0, datetime.now(UTC))
    with pytest.raises(InvalidPreCommit, match="planned against write"):  # E as committed lists other files
        upsert_files_to_replace(table, "main", pre, revision, replaces)
    unplanned = revision.model_copy(update={"revises": None})
    with pytest.raises(UpsertConflict, match="planned against the table as it was when it ran"):
        upsert_files_to_replace(table, "main", pre, unplanned, replaces)


@pytest.mark.parametrize("staged", [False, True], ids=["own-manifests", "prepared-manifests"])
def test_a_foreign_write_of_a_key_between_prepare_and_commit_is_refused_on_the_conflict_retry(
    catalog: SqlCatalog, sink_id: str, staged: bool
) -> None:
    """Scenario (issue 54): an upsert's conflict retry must check the other writer's changes against
    the table as reloaded, not as loaded at prepare. Another writer appends one of the epoch's keys
    between prepare and commit: the first attempt, on the table prepare loaded, loses the catalog's
    compare-and-swap; its retry reloads and refuses (``UpsertConflict``). Checked against the table
    of prepare, it would commit the key a second time. With the manifests persist writes
    (``staged``) and without."""
    name = f"{NAMESPACE}.keyed"
    catalog.create_table(name, schema=KEYED)
    committer = IcebergSinkCommitter(catalog)
    first = write_upsert(catalog, name, sink_id, 0, {k: f"v{k}" for k in range(8)}, str(uuid.uuid4()))
    committer.commit(committer.prepare(first), datetime.now(UTC))
    pre = write_upsert(catalog, name, sink_id, 1, {1: "one", 2: None, 5: "five", 20: "new"}, str(uuid.uuid4()))
    if staged:
        pre = committer.stage(committer.prepare(pre))
        assert pre.tables[0].prepared is not None
    faults = FaultSwitch()
    committer = IcebergSinkCommitter(catalog, fault=faults)
    plan = committer.prepare(pre, check_files=FileCheck.OWN_MANIFESTS)  # as the commit task does before its decision

    catalog.load_table(name).append(pa.Table.from_pylist([{"id": 5, "value": "theirs"}], schema=ARROW))

    with pytest.raises(UpsertConflict, match=r"1 data file\(s\) added since its read may hold the epoch's keys"):
        committer.commit(plan, datetime.now(UTC))
    assert faults.seen[FAULT_BEFORE_CATALOG_UPDATE] == 1  # the first attempt lost the swap; the retry refused
    table = catalog.load_table(name)
    assert read_rows(table, "id, value") == sorted([*((k, f"v{k}") for k in range(8)), (5, "theirs")])
    epochs = [s.summary.additional_properties.get(EPOCH_KEY) for s in table.snapshots() if s.summary is not None]
    assert epochs == ["0", None]  # epoch 0, the foreign append; epoch 1 nowhere
