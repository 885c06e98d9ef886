"""A fan-out on a pyiceberg SQL catalog is one database transaction (design.md D18): every table's
new metadata file is written, then one transaction swaps every table's ``iceberg_tables`` row on the
condition that it still names the metadata the table was staged on.

On SQLite and PostgreSQL (the ``backend`` fixture), with the real catalog, meta store and files: a
reader loading the tables one after the other never sees an epoch in one and not the other, with
crashes at every step of the commit (``EO_TORN_EPOCHS`` epochs, 30 here; 200 is the long run,
docs/faults.md); a crash before the transaction commits leaves no table changed and its metadata
files to ``eo-sink gc``, one after it every table changed; a connection lost at the commit is
settled by the markers, all or none; a foreign writer between the staging and the transaction makes
the whole transaction conflict and retry; two sinks sharing a table each commit once. And the
pyiceberg internals this stands on are asserted as pyiceberg 0.12 has them.
"""

from __future__ import annotations

import inspect
import os
import posixpath
import random
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyiceberg
import pytest
import sqlalchemy as sa
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from sqlalchemy import event
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.cleanups import remove_orphans
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.delivery import Delivery
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import CommitOutcomeUnknown
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, SinkRecoveryReport
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    FAULT_AFTER_CATALOG_UPDATE,
    FAULT_BEFORE_CATALOG_UPDATE,
    FAULT_IN_CATALOG_TRANSACTION,
    FAULT_METADATA_WRITTEN,
)
from airflow_provider_exactly_once.sinks.write_locations import IcebergWriteFolders
from tests.sinks.iceberg.test_table_transactions import Sampler
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import ARROW_SCHEMA, Pipeline, expected_rows, local_path
from tests.support.upsert_writer import KEYED, write_upsert

COMPLETED = CheckpointStatus.COMPLETED
TABLES = ["facts", "dims"]
EPOCHS = int(os.environ.get("EO_TORN_EPOCHS", "30"))
#: The steps of a fan-out's commit on a SQL catalog, in order (``transaction.SqlPointerMoves``).
STEPS = [FAULT_BEFORE_CATALOG_UPDATE, FAULT_METADATA_WRITTEN, FAULT_IN_CATALOG_TRANSACTION, FAULT_AFTER_CATALOG_UPDATE]
#: Generations: every epoch's first write, and its revision (a newer run of the epoch).
FIRST, REVISED = "2024-06-01T01:00:00.000000Z/0000000000", "2024-06-02T09:30:00.000000Z/0000000001"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def faults() -> FaultSwitch:
    return FaultSwitch()


@pytest.fixture
def pipeline(meta_url: str, catalog_url: str, warehouse: Path, faults: FaultSwitch) -> Iterator[Pipeline]:
    p = Pipeline(
        meta_url=meta_url,
        catalog_url=catalog_url,
        warehouse=warehouse,
        catalog_name=f"cat_{uuid.uuid4().hex[:8]}",
        namespace=f"ns_{uuid.uuid4().hex[:8]}",
        fault=faults,
    )
    for name in TABLES:
        p.create_table(name)
    yield p
    p.dispose()


def beside(pipeline: Pipeline, **changes: Any) -> Pipeline:
    """Another process on the same meta store, catalog and warehouse (no faults unless given)."""
    return Pipeline(
        meta_url=pipeline.meta_url,
        catalog_url=pipeline.catalog_url,
        warehouse=pipeline.warehouse,
        catalog_name=pipeline.catalog_name,
        namespace=changes.pop("namespace", pipeline.namespace),
        **changes,
    )


def qualified(pipeline: Pipeline, names: list[str] = TABLES) -> list[str]:
    return [f"{pipeline.namespace}.{name}" for name in names]


def persisted(
    pipeline: Pipeline, coordinator: TwoPhaseCommitCoordinator, sink_id: str, epoch: int, **kw: Any
) -> PreCommit:
    generation = kw.pop("generation", FIRST)
    pre = pipeline.write_iceberg(sink_id, epoch, kw.pop("tables", TABLES), **kw).model_copy(
        update={"generation": generation}
    )
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, epoch, COMPLETED)
    return pre


def recovered(pipeline: Pipeline, sink_id: str) -> None:
    """Recovery as the recovery DAG runs it: a new process, no faults."""
    fresh = beside(pipeline)
    try:
        report = fresh.coordinator(sink_id, fresh.iceberg_committer(), on_reprocess={sink_id: "replace"}).recover(
            sink_id
        )
        assert report.ok, report.failed
    finally:
        fresh.dispose()


def stray(pipeline: Pipeline, name: str) -> set[str]:
    """The table's metadata files neither current nor in its metadata log."""
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    listed = {posixpath.basename(entry.metadata_file) for entry in table.metadata.metadata_log}
    listed.add(posixpath.basename(table.metadata_location))
    folder = Path(local_path(posixpath.dirname(table.metadata_location)))
    return {path.name for path in folder.glob("*.metadata.json")} - listed


def gc(pipeline: Pipeline, sink_id: str, grace: timedelta) -> SinkRecoveryReport:
    """What ``eo-sink gc`` runs for the sink (``SinkOperations.gc``), on its committer and listing."""
    return remove_orphans(
        pipeline.store,
        pipeline.store.registry,
        pipeline.iceberg_committer(),
        IcebergWriteFolders(pipeline.catalog, qualified(pipeline)),
        sink_id,
        holder="gc-test",
        grace=grace,
        lock_ttl=timedelta(minutes=5),
    )


def assert_committed_once(pipeline: Pipeline, sink_id: str, writes: list[PreCommit]) -> None:
    """Every table shows each write's marker once, and DuckDB reads the epochs' latest writes."""
    latest = {pre.epoch: pre for pre in writes}
    for name in qualified(pipeline):
        markers = pipeline.marker_snapshots(name.rsplit(".", 1)[1], sink_id)
        assert markers == {e: [p.write_id for p in writes if p.epoch == e] for e in latest}, name
        expected = sorted(r for pre in latest.values() for r in _rows_of(pre, name))
        assert sorted(read_rows(pipeline.catalog.load_table(name), "id, epoch, write_id")) == expected, name


def _rows_of(pre: PreCommit, table: str) -> list[tuple[int, int, str]]:
    return expected_rows([pre], table)


# -- pyiceberg's internals --------------------------------------------------------------------------


def test_the_sql_catalog_internals_the_transaction_stands_on_are_as_pyiceberg_0_12_has_them() -> None:
    """``SqlPointerMoves`` (``transaction.py``, item 8) makes each table's metadata with pyiceberg's
    private helpers and mirrors ``commit_table``'s compare-and-swap on the ``IcebergTables`` model: an
    upgrade that changes any of them fails here, naming the version, before a commit meets it."""
    version = pyiceberg.__version__
    changed: list[str] = []

    def expect(holds: bool, what: str) -> None:
        if not holds:
            changed.append(what)

    def parameters(function: Callable[..., Any]) -> list[str]:
        return list(inspect.signature(function).parameters)

    expect(
        parameters(SqlCatalog._update_and_stage_table)
        == ["self", "current_table", "table_identifier", "requirements", "updates"],
        "SqlCatalog._update_and_stage_table(current_table, table_identifier, requirements, updates)",
    )
    expect(
        parameters(SqlCatalog._write_metadata) == ["metadata", "io", "metadata_path"],
        "SqlCatalog._write_metadata(metadata, io, metadata_path)",
    )
    expect(
        parameters(SqlCatalog._delete_old_metadata) == ["io", "base", "metadata"],
        "SqlCatalog._delete_old_metadata(io, base, metadata)",
    )
    columns = {column.name for column in IcebergTables.__table__.columns}
    expect(
        IcebergTables.__tablename__ == "iceberg_tables"
        and {"catalog_name", "table_namespace", "table_name", "metadata_location", "previous_metadata_location"}
        <= columns,
        f"the IcebergTables model of iceberg_tables (columns {sorted(columns)})",
    )
    source = inspect.getsource(SqlCatalog.commit_table)
    for line in (
        "self._update_and_stage_table(current_table, table.name(), requirements, updates)",
        "self._write_metadata(",
        "IcebergTables.metadata_location == current_table.metadata_location",
        "previous_metadata_location=current_table.metadata_location",
        "if self.engine.dialect.supports_sane_rowcount:",
        "if result.rowcount < 1:",
        ".with_for_update(of=IcebergTables)",
    ):
        expect(line in source, f"SqlCatalog.commit_table's compare-and-swap ({line!r} is gone)")
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    expect(
        any(d.startswith("pyiceberg[") and d.endswith(">=0.12,<0.13") for d in pinned) and version.startswith("0.12."),
        f"the pin pyiceberg>=0.12,<0.13 (installed: {version})",
    )
    assert not changed, (
        f"pyiceberg {version} changed what sinks/iceberg/transaction.py (SqlPointerMoves) stands on: "
        + "; ".join(changed)
        + ". Check the SQL catalog's one-transaction fan-out again before widening the pin (design.md D18)."
    )


# -- one transaction ---------------------------------------------------------------------------------


def test_appends_a_revision_and_a_recovery_batch_each_commit_every_table_in_one_transaction(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    committer = pipeline.iceberg_committer()
    assert committer.transactions.delivery(2).how is Delivery.ONE_TRANSACTION
    coordinator = pipeline.coordinator(sink_id, committer, on_reprocess={sink_id: "replace"})
    first = persisted(pipeline, coordinator, sink_id, 1, rows=3)
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    assert (faults.seen[FAULT_METADATA_WRITTEN], faults.seen[FAULT_AFTER_CATALOG_UPDATE]) == (1, 1)

    revision = persisted(pipeline, coordinator, sink_id, 1, rows=5, generation=REVISED)
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    assert faults.seen[FAULT_AFTER_CATALOG_UPDATE] == 2  # one overwrite snapshot per table, one transaction

    backlog = [persisted(pipeline, coordinator, sink_id, epoch, rows=2) for epoch in (2, 3, 4)]
    report = coordinator.recover(sink_id)
    assert report.ok and sorted(report.committed) == [2, 3, 4], report
    assert faults.seen[FAULT_AFTER_CATALOG_UPDATE] == 3  # the batch: three epochs, two tables, one transaction
    for name in TABLES:
        assert len(pipeline.catalog.load_table(f"{pipeline.namespace}.{name}").metadata.snapshots) == 5
        assert stray(pipeline, name) == set()
    assert_committed_once(pipeline, sink_id, [first, revision, *backlog])


def test_upsert_epochs_into_two_tables_each_commit_in_one_transaction(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    names = [f"{pipeline.namespace}.keyed_{name}" for name in TABLES]
    for name in names:
        pipeline.catalog.create_table(name, schema=KEYED)
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    rng = random.Random(57)
    models: dict[str, dict[int, str]] = {name: {} for name in names}
    for epoch in range(1, 5):
        write_id = str(uuid.uuid4())
        writes = []
        for name in names:
            changes: dict[int, str | None] = {rng.randrange(30): f"e{epoch}"}
            for key in rng.sample(range(30), 4):
                changes.setdefault(key, None if rng.random() < 0.3 else f"e{epoch}-{key}")
            writes.extend(write_upsert(pipeline.catalog, name, sink_id, epoch, changes, write_id).tables)
            for key, value in changes.items():
                if value is None:
                    models[name].pop(key, None)
                else:
                    models[name][key] = value
        coordinator.persist(PreCommit(sink_id=sink_id, epoch=epoch, write_id=write_id, tables=writes))
        pipeline.checkpoint(sink_id, epoch, COMPLETED)
        assert coordinator.commit(sink_id, epoch).outcome is CommitOutcome.COMMITTED
        assert faults.seen[FAULT_AFTER_CATALOG_UPDATE] == epoch
    for name in names:
        assert sorted(pipeline.marker_snapshots(name.rsplit(".", 1)[1], sink_id)) == [1, 2, 3, 4]
        assert read_rows(pipeline.catalog.load_table(name), "id, value") == sorted(models[name].items())


# -- crashes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", STEPS)
def test_a_crash_at_every_step_changes_every_table_or_none_and_gc_collects_the_metadata_left(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str
) -> None:
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = persisted(pipeline, coordinator, sink_id, 5, rows=3)
    before = {name: pipeline.catalog.load_table(name).metadata_location for name in qualified(pipeline)}
    faults.crash_at(point)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 5)
    shown = [bool(pipeline.marker_snapshots(name, sink_id)) for name in TABLES]
    committed = point == FAULT_AFTER_CATALOG_UPDATE
    assert shown == [committed] * 2
    if not committed:
        assert {name: pipeline.catalog.load_table(name).metadata_location for name in before} == before
    written = point in (FAULT_METADATA_WRITTEN, FAULT_IN_CATALOG_TRANSACTION)  # and not taken by the catalog
    left = {name: stray(pipeline, name) for name in TABLES}
    assert [len(files) for files in left.values()] == ([1, 1] if written else [0, 0])
    # A metadata file newer than the table's current one may be a commit still in flight: kept.
    assert gc(pipeline, sink_id, timedelta(0)).stray_removed == []

    recovered(pipeline, sink_id)
    row = pipeline.store.get(sink_id, 5)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert_committed_once(pipeline, sink_id, [pre])
    assert {name: stray(pipeline, name) for name in TABLES} == left  # recovery leaves them to gc

    assert gc(pipeline, sink_id, timedelta(hours=1)).stray_removed == []  # younger than the grace
    report = gc(pipeline, sink_id, timedelta(0))
    assert report.ok and sorted(posixpath.basename(p) for p in report.stray_removed) == sorted(
        name for files in left.values() for name in files
    )
    assert report.files_deleted == sum(len(files) for files in left.values())
    assert {name: stray(pipeline, name) for name in TABLES} == {name: set() for name in TABLES}
    assert_committed_once(pipeline, sink_id, [pre])  # everything the tables list is still there


def _lose_the_connection_at_commit(pipeline: Pipeline, backend: str, applied: bool) -> Callable[[], None]:
    """Arm a connection lost at the commit of the catalog's next transaction; returns the disarm.

    Applied: the database committed, and the answer is lost (SQLAlchemy's ``after_commit`` raises:
    a mock, since no connection can be cut between a commit and its answer here). Not applied: on
    PostgreSQL the session's connection is terminated by the server inside the transaction (real);
    SQLite has no connection to lose, so its commit fails before it starts (``before_commit``
    raises: a mock)."""
    engine = pipeline.catalog.engine
    armed = [True]

    def lose(session: Session) -> None:
        if armed[0] and session.bind is engine:
            armed[0] = False
            raise ConnectionResetError("connection reset by peer at COMMIT")

    if applied or backend == "sqlite":
        name = "after_commit" if applied else "before_commit"
        event.listen(Session, name, lose)
        return lambda: event.remove(Session, name, lose)

    def terminate() -> None:
        admin = sa.create_engine(pipeline.catalog_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                ended = conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                        "AND query LIKE '%iceberg_tables%' AND query LIKE :catalog"
                    ),
                    {"catalog": f"%{pipeline.catalog_name}%"},
                ).all()
            assert [row[0] for row in ended] == [True], ended
        finally:
            admin.dispose()

    assert isinstance(pipeline.fault, FaultSwitch)
    pipeline.fault.then(FAULT_IN_CATALOG_TRANSACTION, terminate)
    return lambda: None


@pytest.mark.parametrize("applied", [True, False], ids=["committed", "not_committed"])
def test_a_connection_lost_at_the_commit_is_settled_by_every_tables_marker(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, backend: str, applied: bool
) -> None:
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = persisted(pipeline, coordinator, sink_id, 3, rows=4)
    disarm = _lose_the_connection_at_commit(pipeline, backend, applied)
    try:
        with pytest.raises(CommitOutcomeUnknown, match="in one transaction has an unknown outcome"):
            coordinator.commit(sink_id, 3)
    finally:
        disarm()
    assert [bool(pipeline.marker_snapshots(name, sink_id)) for name in TABLES] == [applied, applied]
    left = {name: stray(pipeline, name) for name in TABLES}
    assert [len(files) for files in left.values()] == ([0, 0] if applied else [1, 1])  # nothing deleted
    row = pipeline.store.get(sink_id, 3)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None

    assert coordinator.commit(sink_id, 3).outcome is CommitOutcome.COMMITTED
    assert faults.seen[FAULT_METADATA_WRITTEN] == (1 if applied else 2)  # applied: settled by the markers alone
    assert_committed_once(pipeline, sink_id, [pre])
    assert sorted(posixpath.basename(p) for p in gc(pipeline, sink_id, timedelta(0)).stray_removed) == sorted(
        name for files in left.values() for name in files
    )


# -- concurrency ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", [FAULT_BEFORE_CATALOG_UPDATE, FAULT_METADATA_WRITTEN])
def test_a_foreign_commit_to_one_table_before_the_transaction_is_a_conflict_for_every_table(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str
) -> None:
    """Another writer appends to the second table after the commit staged both (before their metadata
    is written, or after): the transaction swaps neither, and the retry commits both."""
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = persisted(pipeline, coordinator, sink_id, 1, rows=3)
    other = beside(pipeline)
    facts, dims = qualified(pipeline)
    between: list[dict[int, list[str]]] = []

    def another_writer_appends_to_dims() -> None:
        other.catalog.load_table(dims).append(
            pa.Table.from_pylist([{"id": -1, "epoch": -1, "write_id": "other"}], schema=ARROW_SCHEMA)
        )
        faults.then(FAULT_BEFORE_CATALOG_UPDATE, lambda: between.append(other.marker_snapshots("facts", sink_id)))

    faults.then(point, another_writer_appends_to_dims)
    try:
        assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    finally:
        other.dispose()
    assert between == [{}]  # the refused transaction left facts as it was
    assert faults.seen[FAULT_BEFORE_CATALOG_UPDATE] == 2 and faults.seen[FAULT_AFTER_CATALOG_UPDATE] == 1
    assert faults.seen[FAULT_METADATA_WRITTEN] == 2
    for name in TABLES:
        assert pipeline.marker_snapshots(name, sink_id) == {1: [pre.write_id]}
        assert stray(pipeline, name) == set()  # the refused transaction's metadata files were deleted
    assert sorted(read_rows(pipeline.catalog.load_table(facts), "id, epoch, write_id")) == _rows_of(pre, facts)
    assert sorted(read_rows(pipeline.catalog.load_table(dims), "id, epoch, write_id")) == sorted(
        [*_rows_of(pre, dims), (-1, -1, "other")]
    )


def test_two_sinks_sharing_a_table_each_commit_every_epoch_exactly_once(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """Sinks A (facts, dims) and B (facts, notes), each in a process of its own. First B commits
    while A's transaction is between its metadata files and the database (A's swap of facts
    conflicts, dims is rolled back with it, A retries); then both commit epochs side by side."""
    pipeline.create_table("notes")
    sink_a, sink_b = f"{sink_id}-a", f"{sink_id}-b"
    faults_b = FaultSwitch()
    b = beside(pipeline, fault=faults_b)
    try:
        coordinator_a = pipeline.coordinator(sink_a, pipeline.iceberg_committer())
        coordinator_b = b.coordinator(sink_b, b.iceberg_committer())
        writes: dict[str, list[PreCommit]] = {sink_a: [], sink_b: []}
        writes[sink_a].append(persisted(pipeline, coordinator_a, sink_a, 1, rows=2))
        writes[sink_b].append(persisted(b, coordinator_b, sink_b, 1, rows=2, tables=["facts", "notes"]))
        faults.then(FAULT_METADATA_WRITTEN, lambda: coordinator_b.commit(sink_b, 1))
        assert coordinator_a.commit(sink_a, 1).outcome is CommitOutcome.COMMITTED
        assert faults.seen[FAULT_METADATA_WRITTEN] == 2 and faults_b.seen[FAULT_AFTER_CATALOG_UPDATE] == 1

        errors: list[BaseException] = []

        def run(p: Pipeline, coordinator: TwoPhaseCommitCoordinator, sink: str, tables: list[str]) -> None:
            try:
                for epoch in range(2, 7):
                    writes[sink].append(persisted(p, coordinator, sink, epoch, rows=2, tables=tables))
                    assert coordinator.commit(sink, epoch).outcome is CommitOutcome.COMMITTED
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(pipeline, coordinator_a, sink_a, TABLES)),
            threading.Thread(target=run, args=(b, coordinator_b, sink_b, ["facts", "notes"])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors
    finally:
        b.dispose()
    for sink, tables in ((sink_a, TABLES), (sink_b, ["facts", "notes"])):
        for name in tables:
            assert pipeline.marker_snapshots(name, sink) == {p.epoch: [p.write_id] for p in writes[sink]}, (sink, name)
    facts = f"{pipeline.namespace}.facts"
    expected = sorted(r for sink in writes for pre in writes[sink] for r in _rows_of(pre, facts))
    assert sorted(read_rows(pipeline.catalog.load_table(facts), "id, epoch, write_id")) == expected
    for name in ("facts", "dims", "notes"):
        assert stray(pipeline, name) == set()


# -- what a reader sees ------------------------------------------------------------------------------


def test_a_reader_never_sees_a_fan_out_epoch_in_one_table_only_with_a_crash_every_tenth_epoch(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """``EO_TORN_EPOCHS`` fan-out epochs (and every fourth, a revision of the epoch two before),
    while a reader loads the two tables one after the other through a catalog of its own. Every
    tenth epoch's commit crashes at another step of the transaction (its metadata written, inside
    it, after it), and the reader reads on before recovery commits it in a new process. A table
    committed on its own, as table by table would, is a torn read."""
    reader = SqlCatalog(pipeline.catalog_name, uri=pipeline.catalog_url, warehouse=f"file://{pipeline.warehouse}")
    sampler = Sampler(reader, qualified(pipeline), sink_id)
    crash_points = STEPS[1:]
    crashes: list[str] = []
    writes: list[PreCommit] = []

    def coordinator() -> TwoPhaseCommitCoordinator:
        return pipeline.coordinator(sink_id, pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"})

    current = coordinator()
    sampler.start()
    try:
        for epoch in range(1, EPOCHS + 1):
            for written, generation in [(epoch, FIRST)] + ([(epoch - 2, REVISED)] if epoch % 4 == 0 else []):
                writes.append(persisted(pipeline, current, sink_id, written, rows=2, generation=generation))
                if epoch % 10 == 0 and generation == FIRST:
                    point = crash_points[(epoch // 10 - 1) % len(crash_points)]
                    faults.crash_at(point)
                    try:
                        current.commit(sink_id, written)
                    except SimulatedCrash:
                        crashes.append(point)
                    faults.disarm()
                    seen = sampler.samples
                    deadline = time.monotonic() + 30
                    while sampler.samples < seen + 3 and time.monotonic() < deadline:
                        time.sleep(0.01)  # the reader reads what the crash left
                    recovered(pipeline, sink_id)
                    current = coordinator()  # the process that crashed is gone
                else:
                    assert current.commit(sink_id, written).outcome is CommitOutcome.COMMITTED
    finally:
        sampler.stop.set()
        sampler.join(timeout=30)
        reader.engine.dispose()
    # The figures of a long run (docs/faults.md), shown with -s.
    print(f"{len(sampler.torn)} torn reads in {sampler.samples} over {EPOCHS} epochs, {len(crashes)} crashes")
    assert sampler.torn == [], f"{len(sampler.torn)} torn reads in {sampler.samples}: {sampler.torn[:5]}"
    assert sampler.samples > EPOCHS
    assert crashes == [crash_points[n % len(crash_points)] for n in range(EPOCHS // 10)]
    assert_committed_once(pipeline, sink_id, writes)


def test_gc_removes_only_metadata_files_no_commit_can_ever_reference(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch
) -> None:
    """Beside a fan-out's metadata files left by a crash inside its transaction (removed): the
    history a table's metadata log no longer lists (``write.metadata.previous-versions-max``), and the
    files of a table dropped and created again at the same location, are no commit's leftovers and stay."""
    facts, dims = qualified(pipeline)
    dims_table = pipeline.catalog.load_table(dims)
    dims_table.transaction().set_properties({"write.metadata.previous-versions-max": "2"}).commit_transaction()
    for n in range(4):  # history trimmed from dims' log
        pipeline.catalog.load_table(dims).append(
            pa.Table.from_pylist([{"id": -n - 1, "epoch": -1, "write_id": "other"}], schema=ARROW_SCHEMA)
        )
    trimmed = stray(pipeline, "dims")
    assert len(trimmed) == 3, trimmed
    for create in (False, True, False, False):
        if create:  # pyiceberg's drop leaves the old table's files, and the new table takes its location
            pipeline.catalog.drop_table(facts)
            pipeline.create_table("facts")
        pipeline.catalog.load_table(facts).append(
            pa.Table.from_pylist([{"id": -1, "epoch": -1, "write_id": "other"}], schema=ARROW_SCHEMA)
        )
    dropped = stray(pipeline, "facts")
    assert len(dropped) == 2, dropped  # the old table's versions 0 and 1, within the new one's 0 to 3

    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = persisted(pipeline, coordinator, sink_id, 1, rows=2)
    faults.crash_at(FAULT_IN_CATALOG_TRANSACTION)
    with pytest.raises(SimulatedCrash):
        coordinator.commit(sink_id, 1)
    left = {name: stray(pipeline, name) for name in TABLES}
    recovered(pipeline, sink_id)
    report = gc(pipeline, sink_id, timedelta(0))
    removed = {posixpath.basename(p) for p in report.stray_removed}
    assert removed == (left["facts"] - dropped) | (left["dims"] - trimmed) and len(removed) == 2
    assert stray(pipeline, "facts") == dropped and trimmed < stray(pipeline, "dims")  # the commit trimmed one more
    assert_committed_once_in(pipeline, sink_id, pre)


def assert_committed_once_in(pipeline: Pipeline, sink_id: str, pre: PreCommit) -> None:
    for name in qualified(pipeline):
        assert pipeline.marker_snapshots(name.rsplit(".", 1)[1], sink_id) == {pre.epoch: [pre.write_id]}
        rows = read_rows(pipeline.catalog.load_table(name), "id, epoch, write_id")
        assert sorted(r for r in rows if r[2] != "other") == _rows_of(pre, name)
