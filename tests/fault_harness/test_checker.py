"""The fault harness's checker (``fault_harness/checker.py``) on tables built by hand with pyiceberg.

No cluster and no product code commits here: each test lands input, commits marked snapshots the
way a correct or a broken committer would (an append, a replacing overwrite, a second append of a
replaced hour, a write committed twice, a wrong revision number, a replaced file deleted too early)
and asserts what the checker calls it. The harness's own runs only ever show the checker passing.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from airflow_provider_exactly_once.sinks.iceberg.markers import audit_branch_name, marker_properties
from demo.world import hour_dir, land_hour, mark_hour
from fault_harness.checker import CheckResult, check, check_fan_out
from fault_harness.harness import EVENT_SCHEMA, reland_hour
from fault_harness.landed import epoch_of, read_input
from fault_harness.table_reads import FanOutReader, marked_writes

SINK = "faults-unit"
H0 = dt.datetime(2025, 1, 1, 0, tzinfo=dt.UTC)
H1 = dt.datetime(2025, 1, 1, 1, tzinfo=dt.UTC)


class World:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.landing = root / "landing"
        self.history = root / "history"
        catalog = SqlCatalog("unit", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'wh'}")
        catalog.create_namespace("faults")
        self.table: Table = catalog.create_table("faults.unit", EVENT_SCHEMA)
        for n, hour in enumerate((H0, H1)):
            land_hour(self.landing, hour, 12, files=2, seed=n)
            mark_hour(self.landing, hour, completed=True)

    def write(self, hour: dt.datetime, write_id: str | None = None) -> tuple[str, list[DataFile]]:
        """The hour's current input as one Parquet file in a write's own folder (nothing committed)."""
        write_id = write_id or str(uuid.uuid4())
        folder = Path(self.table.location().removeprefix("file://")) / "data" / "_eo" / write_id
        folder.mkdir(parents=True)
        rows = [
            {
                "event_id": r[0],
                "user_id": r[1],
                "event_type": r[2],
                "event_time": None
                if r[3] is None
                else dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=r[3]),
                "amount": r[4],
            }
            for r in read_input(hour_dir(self.landing, hour))
        ]
        path = folder / "part-00000.parquet"
        schema = schema_to_pyarrow(self.table.schema(), include_field_ids=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return write_id, [parquet_file_to_data_file(self.table.io, self.table.metadata, f"file://{path}")]

    def commit(
        self,
        hour: dt.datetime,
        write: tuple[str, list[DataFile]],
        *,
        revision: int = 0,
        replaces: list[DataFile] | None = None,
    ) -> None:
        write_id, files = write
        marker = marker_properties(SINK, epoch_of(hour), write_id, revision)
        gone = {f.file_path for f in replaces or []}
        # the table's own entries of the replaced files (a DataFile read back knows its spec)
        old = [t.file for t in self.table.scan().plan_files() if t.file.file_path in gone]
        with self.table.transaction() as tx:
            update = tx.update_snapshot(snapshot_properties=marker)
            producer = update.fast_append() if replaces is None else update.overwrite()
            with producer as snapshot:
                for data_file in old:
                    snapshot.delete_data_file(data_file)
                for data_file in files:
                    snapshot.append_data_file(data_file)

    def check(self, **commits: tuple[int, int]) -> list[tuple[str, int | None]]:
        return sorted({(a.kind, a.epoch) for a in self.result(**commits).anomalies}, key=str)

    def result(self, **commits: tuple[int, int]) -> CheckResult:
        by_epoch = {epoch_of(H0 if name == "h0" else H1): value for name, value in commits.items()}
        result = check(
            self.table,
            self.landing,
            SINK,
            orphan_grace_s=0,
            now=time.time() + 5,
            history=self.history,
            commits=by_epoch,
        )
        assert result.reader == "duckdb and pyiceberg"
        return result


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_first_commits_and_a_revision_with_new_input_pass(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)
    world.commit(H1, world.write(H1))
    assert world.check() == []
    reland_hour(world.landing, world.history, H0, key="unit")
    world.commit(H0, world.write(H0), revision=1, replaces=first[1])
    assert world.check(h0=(2, 2)) == []
    # the replaced write's files are still referenced by the first snapshot: not orphans, and there
    assert all(os.path.exists(f.file_path.removeprefix("file://")) for f in first[1])


def test_a_revision_with_the_same_input_passes(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)
    world.commit(H1, world.write(H1))
    reland_hour(world.landing, world.history, H0, key="unit", change=False)
    world.commit(H0, world.write(H0), revision=1, replaces=first[1])
    assert world.check(h0=(2, 2)) == []
    assert world.check() == [("snapshots", epoch_of(H0))]  # one commit expected, two found


def test_old_and_new_rows_visible_together(world: World) -> None:
    world.commit(H0, world.write(H0))
    world.commit(H1, world.write(H1))
    reland_hour(world.landing, world.history, H0, key="unit")
    world.commit(H0, world.write(H0), revision=1)  # added, the old write not removed
    found = world.check(h0=(2, 2))
    e0 = epoch_of(H0)
    assert ("duplicated", e0) in found and ("stale", e0) in found and ("history", e0) in found


def test_new_input_not_reprocessed_is_stale(world: World) -> None:
    world.commit(H0, world.write(H0))
    world.commit(H1, world.write(H1))
    reland_hour(world.landing, world.history, H0, key="unit")
    e0 = epoch_of(H0)
    assert world.check() == [("missing", e0), ("stale", e0)]


def test_a_write_committed_twice_and_wrong_revision_numbers(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)
    world.commit(H1, world.write(H1))
    world.commit(H0, first, revision=1, replaces=first[1])  # the same write again
    assert ("revisions", epoch_of(H0)) in world.check(h0=(2, 2))


def test_revision_numbers_must_count_up_from_zero(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)
    world.commit(H1, world.write(H1))
    reland_hour(world.landing, world.history, H0, key="unit")
    world.commit(H0, world.write(H0), revision=2, replaces=first[1])
    assert world.check(h0=(2, 2)) == [("revisions", epoch_of(H0))]


def test_a_replaced_file_deleted_before_expiry_is_lost(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)
    world.commit(H1, world.write(H1))
    reland_hour(world.landing, world.history, H0, key="unit")
    world.commit(H0, world.write(H0), revision=1, replaces=first[1])
    os.unlink(first[1][0].file_path.removeprefix("file://"))
    found = world.check(h0=(2, 2))
    assert ("lost", epoch_of(H0)) in found and ("history", None) in found


def test_a_failed_hour_with_a_marker_and_an_orphan(world: World) -> None:
    (hour_dir(world.landing, H1) / "_FAILED").write_text("", encoding="utf-8")
    world.commit(H0, world.write(H0))
    world.commit(H1, world.write(H1))
    world.write(H0)  # never committed: an orphan once older than the grace
    found = world.check()
    e1 = epoch_of(H1)
    assert ("snapshots", e1) in found and ("visible_failed", e1) in found and ("orphan", None) in found


def test_a_fan_out_judged_table_by_table_and_across_its_tables(tmp_path: Path) -> None:
    """Two tables of one sink (one per world: the same input, one catalog each): an epoch committed
    to both with the same write passes; an epoch in the first only is torn (and missing from the
    second table's own judgement, named by table); the same epoch by different writes is torn too."""
    first, second = World(tmp_path / "first"), World(tmp_path / "second")
    both = str(uuid.uuid4())
    first.commit(H0, first.write(H0, both))
    second.commit(H0, second.write(H0, both))
    first.commit(H1, first.write(H1))

    def fan_out() -> set[tuple[str, int | None, str]]:
        tables = {"faults.first": first.table, "faults.second": second.table}
        results = {"faults.first": first.result(), "faults.second": second.result()}
        anomalies = check_fan_out(tables, results, SINK).anomalies
        return {(a.kind, a.epoch, a.detail.split(":", 1)[0]) for a in anomalies}

    h1 = epoch_of(H1)
    torn = ("torn", h1, "(write id, revision) of its marked snapshots")
    in_second = "table faults.second"
    assert fan_out() == {("missing", h1, in_second), ("snapshots", h1, in_second), torn}
    second.commit(H1, second.write(H1))  # the same rows, but another write than the first table's
    assert fan_out() == {torn}


def test_a_fan_out_readers_torn_states_are_counted_at_every_marked_snapshot_and_judged_where_atomic(
    tmp_path: Path,
) -> None:
    """What a ``FanOutReader`` saw: the same two tables read while the second lacked H1's write (the
    first read first) and once both had it; judged, the marked snapshot seen torn is one ``torn``
    anomaly naming both tables; not judged (a REST catalog), the reads are only counted."""
    first, second = World(tmp_path / "first"), World(tmp_path / "second")
    both = str(uuid.uuid4())
    first.commit(H0, first.write(H0, both))
    second.commit(H0, second.write(H0, both))
    h1 = str(uuid.uuid4())
    first.commit(H1, first.write(H1, h1))
    tables = {"faults.first": first.table, "faults.second": second.table}
    reader = FanOutReader(lambda: first.table.catalog, list(tables), SINK)
    for _ in range(2):
        reader._count([(name, marked_writes(table.refresh(), SINK)) for name, table in tables.items()])
    second.commit(H1, second.write(H1, h1))
    reader._count([(name, marked_writes(table.refresh(), SINK)) for name, table in reversed(tables.items())])

    for judged in (True, False):
        results = {"faults.first": first.result(), "faults.second": second.result()}
        result = check_fan_out(tables, results, SINK, reader.reads, judge_reads=judged)
        assert result.fan_out_reads == {
            "reads": 3,
            "failed_reads": 0,
            "marked_snapshots_read": 4,
            "torn_reads": 2,
            "torn_marked_snapshots": 1,
            "judged": judged,
        }
        torn = [a for a in result.anomalies if a.kind == "torn"]
        if judged:
            assert [(a.epoch, a.detail) for a in torn] == [
                (
                    epoch_of(H1),
                    f"a reader saw write {h1} (revision 0) in table faults.first and not in table faults.second, "
                    "loaded after it, in 2 of the 3 reads that showed it",
                )
            ]
        else:
            assert torn == []


def test_a_metadata_file_no_commit_took_is_an_orphan_once_older_than_the_grace(world: World) -> None:
    """A copy of the current metadata under another name, of the current version (a commit killed
    after writing it, whose retry made that version current): an orphan. The same of the next
    version (a commit perhaps still in flight) is not judged."""
    world.commit(H0, world.write(H0))
    world.commit(H1, world.write(H1))
    assert world.check() == []
    current = Path(world.table.metadata_location.removeprefix("file://"))
    version = int(current.name.split("-", 1)[0])
    ahead = current.with_name(f"{version + 1:05d}-{uuid.uuid4()}.metadata.json")
    ahead.write_bytes(current.read_bytes())
    assert world.check() == []
    left = current.with_name(f"{version:05d}-{uuid.uuid4()}.metadata.json")
    left.write_bytes(current.read_bytes())
    found = world.result().anomalies
    assert [(a.kind, a.detail.split(" ", 1)[0]) for a in found] == [("orphan", f"metadata/{left.name}")]


# -- an audited sink (write, audit, publish, design.md D23) ----------------------------------------------


def audit(world: World, hour: dt.datetime, write: tuple[str, list[DataFile]]) -> int:
    """The write committed to the epoch's audit branch made at main's head, as ``commit_audit`` does;
    the audit snapshot's id."""
    branch = audit_branch_name(SINK, epoch_of(hour))
    head = world.table.metadata.current_snapshot_id
    assert head is not None
    world.table.manage_snapshots().create_branch(head, branch).commit()
    write_id, files = write
    marker = marker_properties(SINK, epoch_of(hour), write_id, branch=branch)
    with (
        world.table.transaction() as tx,
        tx.update_snapshot(snapshot_properties=marker, branch=branch).fast_append() as snapshot,
    ):
        for data_file in files:
            snapshot.append_data_file(data_file)
    world.table.refresh()
    return world.table.metadata.refs[branch].snapshot_id


def audited(world: World, *bad: dt.datetime) -> CheckResult:
    return check(
        world.table,
        world.landing,
        SINK,
        orphan_grace_s=0,
        now=time.time() + 5,
        history=world.history,
        audit_failed=frozenset(epoch_of(h) for h in bad),
    )


def kinds(result: CheckResult) -> list[tuple[str, int | None]]:
    return sorted({(a.kind, a.epoch) for a in result.anomalies}, key=str)


def test_a_published_epoch_and_a_failed_audit_held_on_its_branch_pass(world: World) -> None:
    first = world.write(H0)
    world.commit(H0, first)  # its audit passed and was published, its branch removed
    audit(world, H1, world.write(H1))  # its audit failed: held on its branch, main untouched
    result = audited(world, H1)
    assert kinds(result) == []
    assert result.hours == {"completed": 1, "audit_failed": 1}
    assert result.marked_snapshots == 1  # the audit snapshot is no commit to main
    assert (result.audit["published"], result.audit["held"], result.audit["audit_snapshots"]) == (1, 1, 1)
    assert result.audit["branches_left"] == []


def test_a_failed_audit_on_main_is_an_anomaly(world: World) -> None:
    world.commit(H0, world.write(H0))
    write = world.write(H1)
    audit(world, H1, write)
    world.commit(H1, write)  # published although its audit failed
    assert kinds(audited(world, H1)) == [("snapshots", epoch_of(H1)), ("visible_audit_failed", epoch_of(H1))]


def test_a_failed_audit_without_its_branch_and_a_branch_left_by_a_publish(world: World) -> None:
    world.commit(H0, world.write(H0))
    write = world.write(H1)
    audit(world, H1, write)
    world.commit(H1, write)  # published; its audit branch left behind: a warning, not an anomaly
    result = audited(world)
    assert kinds(result) == []
    assert result.audit["branches_left"] == [audit_branch_name(SINK, epoch_of(H1))]
    assert len(result.audit["snapshots_left"]) == 1
    # judged as a failed audit instead: not on main, but no audit branch holding it either
    world.table.manage_snapshots().remove_branch(audit_branch_name(SINK, epoch_of(H1))).commit()
    assert ("audit", epoch_of(H1)) in kinds(audited(world, H1))
