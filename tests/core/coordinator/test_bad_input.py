"""Bad input and unreachable dependencies: a clear error that names the thing at fault, and nothing lost.

Each refusal leaves the epoch finishable: no row half-written, nothing visible, files kept for a retry.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    InputRangeRefused,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    MissingDataFiles,
    SchemaMismatch,
    UnknownTable,
)
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.ports import CommitPlan, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite, WrittenColumn
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.pipeline import Pipeline, as_tuples, expected_rows, local_path, write_location_exists


def test_malformed_metadata_is_refused_before_any_row(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    good = pipeline.write_iceberg(sink_id, 1, ["orders"]).model_dump(mode="json")
    del good["tables"][0]["data_files"][0]["record_count"]
    with pytest.raises(InvalidPreCommit, match=r"record_count: Field required"):
        coordinator.persist(good)
    assert pipeline.store.get(sink_id, 1) is None


def test_paths_outside_the_table_location_are_refused(pipeline: Pipeline, sink_id: str, tmp_path: Path) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    elsewhere = f"file://{tmp_path}/elsewhere"
    moved = pre.tables[0].model_copy(
        update={
            "location": elsewhere,
            "data_files": DataFiles(
                [f.model_copy(update={"path": f"{elsewhere}/x.parquet"}) for f in pre.tables[0].data_files]
            ),
        }
    )
    with pytest.raises(InvalidPreCommit, match="elsewhere"):
        coordinator.persist(pre.model_copy(update={"tables": [moved]}))
    assert pipeline.store.get(sink_id, 1) is None


#: An incremental input's consumed range that starts after a snapshot and ends nowhere.
ENDLESS_RANGE = {"kind": "iceberg_snapshots", "table": "up.events", "after_snapshot_id": 5}


def test_a_consumed_range_that_does_not_parse_is_refused_before_any_row(pipeline: Pipeline, sink_id: str) -> None:
    """Stored, it would break every listing of the sink and the commit's fence: refused at persist,
    naming the field, whether the write comes as a dict (XCom) or as a model built by ``model_copy``,
    which skips the model's validators."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    for given in (
        {**pre.model_dump(mode="json"), "source_positions": ENDLESS_RANGE},
        pre.model_copy(update={"source_positions": ENDLESS_RANGE}),
        {**pre.model_dump(mode="json"), "source_positions": {**ENDLESS_RANGE, "to_snapshot_id": 2**70}},
    ):
        with pytest.raises(InvalidPreCommit, match=r"source_positions: kind 'iceberg_snapshots' but no snapshot range"):
            coordinator.persist(given)
        assert pipeline.store.get(sink_id, 1) is None
        assert sink_id not in pipeline.store.sink_ids()
    assert write_location_exists(pre)  # nothing was deleted either: a corrected write can be persisted


def test_a_stored_unparsable_range_refuses_the_commit_by_name_and_can_be_aborted(
    pipeline: Pipeline, sink_id: str
) -> None:
    """A row stored before persist refused such positions (put in here through the store itself)
    is still read; its commit is refused naming the field and the way out, and its abort works."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    pipeline.store.insert_pending(
        pre.model_copy(update={"source_positions": ENDLESS_RANGE}), run_id=None, try_number=None
    )
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    pipeline.store.forget_parsed()  # read back from the row, as another process would
    with pytest.raises(
        InputRangeRefused, match=rf"source_positions: .*ends nowhere.*eo-sink abort {sink_id} 1 --reason ... --force"
    ):
        coordinator.commit(sink_id, 1)
    assert "source_positions" in coordinator.recover(sink_id).failed[1]
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
    assert pipeline.rows("orders") == []
    coordinator.abort(sink_id, 1, reason="its consumed range cannot be read", force=True)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not write_location_exists(pre)


def test_unknown_table_and_unknown_sink_are_named(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    ghost = pre.tables[0].model_copy(update={"table": f"{pipeline.namespace}.ghost"})
    with pytest.raises(UnknownTable, match="ghost"):
        coordinator.persist(pre.model_copy(update={"tables": [ghost]}))
    with pytest.raises(InvalidSinkConfig, match="no committer is configured for sink 'other'"):
        coordinator.commit("other", 1)


def test_incompatible_schema_is_refused_before_anything_is_committed(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    wrong = pre.tables[0].model_copy(
        update={"schema_written": [WrittenColumn(name="id", type="string", required=True)]}
    )
    with pytest.raises(SchemaMismatch, match="id"):
        coordinator.persist(pre.model_copy(update={"tables": [wrong]}))
    added = pre.tables[0].model_copy(update={"added_columns": [WrittenColumn(name="country", type="string")]})
    with pytest.raises(SchemaMismatch, match="country"):
        coordinator.persist(pre.model_copy(update={"tables": [added]}))  # evolution not enabled for this sink
    assert pipeline.store.get(sink_id, 1) is None
    assert pipeline.rows("orders") == []


def _persisted_ago(pipeline: Pipeline, sink_id: str, epoch: int, age: timedelta) -> None:
    """The epoch's row as if persisted ``age`` ago and left Pending since."""
    with pipeline.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE pending_sink_state SET created_at = :t WHERE sink_id = :s AND epoch = :e"),
            {"t": (pipeline.store.now() - age).replace(tzinfo=None), "s": sink_id, "e": epoch},
        )


#: Older than the coordinator's ``FULL_FILE_CHECK_AFTER`` (a day): its commit lists every file.
OLD = timedelta(days=2)


def _undecided(pipeline: Pipeline, sink_id: str, epoch: int) -> EpochRecord:
    row = pipeline.store.get(sink_id, epoch)
    assert row is not None and row.status is EpochStatus.PENDING
    assert row.commit_decided_at is None, "refused before the commit decision: the epoch stays abortable"
    return row


def test_missing_data_files_refuse_the_commit_and_keep_the_epoch_pending(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    _persisted_ago(pipeline, sink_id, 1, OLD)
    hidden = Path(local_path(pre.tables[0].data_files[1].path))
    parked = hidden.with_suffix(".parked")
    hidden.rename(parked)
    with pytest.raises(MissingDataFiles, match=hidden.name):
        coordinator.commit(sink_id, 1)
    row = _undecided(pipeline, sink_id, 1)
    assert row.error is not None and hidden.name in row.error
    assert pipeline.rows("orders") == []
    parked.rename(hidden)  # the file comes back (a restore, an eventually consistent store)
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    assert as_tuples(pipeline.rows("orders")) == expected_rows([pre], f"{pipeline.namespace}.orders")


def test_a_file_removed_before_the_commit_is_refused_undecided_so_a_new_write_replaces_it(
    pipeline: Pipeline, sink_id: str
) -> None:
    """A foreign ``remove_orphan_files`` between persist and commit (so the epoch is old): the commit
    is refused before its decision, so the epoch's run written again replaces the write, with no
    operator's ``--files-lost``."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    _persisted_ago(pipeline, sink_id, 1, OLD)
    Path(local_path(pre.tables[0].data_files[0].path)).unlink()
    with pytest.raises(MissingDataFiles):
        coordinator.commit(sink_id, 1)
    assert not coordinator.recover(sink_id).ok  # recovery's batch refuses it before deciding too
    _undecided(pipeline, sink_id, 1)
    again = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=3)
    assert coordinator.persist(again).outcome is PersistOutcome.REPLACED
    assert not write_location_exists(pre)
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    assert as_tuples(pipeline.rows("orders")) == expected_rows([again], f"{pipeline.namespace}.orders")


def test_a_data_file_removed_from_a_fresh_epoch_goes_unseen_and_from_an_older_one_is_refused(
    pipeline: Pipeline, sink_id: str
) -> None:
    """Issue 59: within ``full_file_check_after`` of its persist, the commit task checks only the
    manifest persist wrote below the write location, not every data file, as Flink's committer
    relies on orphan removal's age horizon; a data file deleted alone (by no such removal) goes
    unseen and the snapshot lists it. Older than that, the same epoch is refused before the
    decision."""
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer()
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    pipeline.coordinator(sink_id, committer).persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    assert _undecided(pipeline, sink_id, 1).pre_commit.tables[0].prepared is not None
    gone = pre.tables[0].data_files[1].path
    Path(local_path(gone)).unlink()

    older = pipeline.coordinator(sink_id, committer, full_file_check_after=timedelta(milliseconds=1))
    time.sleep(0.01)
    with pytest.raises(MissingDataFiles, match=Path(gone).name) as refused:
        older.commit(sink_id, 1)
    assert refused.value.paths == [gone]
    _undecided(pipeline, sink_id, 1)

    fresh = pipeline.coordinator(sink_id, committer)  # a day by default
    assert fresh.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    assert gone in table.inspect.files().column("file_path").to_pylist()  # unseen: the snapshot lists it


def test_an_older_epochs_removed_data_file_is_refused_before_the_decision_as_its_dry_run_says(
    pipeline: Pipeline, sink_id: str
) -> None:
    """The check ``coordinator.prepare`` runs for the commit's dry run is the commit's own: it passes
    a fresh epoch whose manifest stands, and refuses the same epoch once persisted a day ago."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    gone = pre.tables[0].data_files[0].path
    Path(local_path(gone)).unlink()
    coordinator.prepare(_undecided(pipeline, sink_id, 1))  # fresh: the dry run would commit, as the commit would

    _persisted_ago(pipeline, sink_id, 1, OLD)
    with pytest.raises(MissingDataFiles) as planned:
        coordinator.prepare(_undecided(pipeline, sink_id, 1))
    with pytest.raises(MissingDataFiles) as refused:
        coordinator.commit(sink_id, 1)
    assert planned.value.paths == refused.value.paths == [gone]
    row = _undecided(pipeline, sink_id, 1)
    assert row.error is not None and Path(gone).name in row.error
    assert pipeline.rows("orders") == []


def test_recovery_lists_every_file_of_a_fresh_epoch(pipeline: Pipeline, sink_id: str) -> None:
    """Recovery is off the hot path: its batch and the epoch it commits alone after the batch
    refused it (``recover_pending``) both list every data file, however young the epoch."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    gone = pre.tables[0].data_files[1].path
    Path(local_path(gone)).unlink()

    report = coordinator.recover(sink_id)

    assert list(report.failed) == [1] and "MissingDataFiles" in report.failed[1] and Path(gone).name in report.failed[1]
    with pytest.raises(MissingDataFiles, match=Path(gone).name):
        coordinator.commit(sink_id, 1, recovery=True)
    _undecided(pipeline, sink_id, 1)
    assert pipeline.rows("orders") == []


def test_unreachable_meta_store_fails_retryably_with_its_address() -> None:
    with pytest.raises(MetaStoreUnavailable, match=r"127\.0\.0\.1:1") as raised:
        SqlSinkStateStore("postgresql+psycopg2://postgres:secret@127.0.0.1:1/meta", connect_timeout_s=2)
    assert raised.value.retryable
    assert "secret" not in str(raised.value)


def test_a_locked_meta_store_fails_the_step_and_a_retry_finishes_it(tmp_path: Path, warehouse: Path) -> None:
    """SQLite locked by another process's write transaction: persist and the Committed mark both fail
    retryably with nothing half-written, and the retried steps finish the epoch exactly once."""
    pipeline = Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=warehouse,
        catalog_name="locked",
        namespace="ns",
    )
    impatient = SqlSinkStateStore(pipeline.meta_url, busy_timeout_s=0.2)
    sink_id = "locked"
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer()
    coordinator = pipeline.coordinator(sink_id, committer)
    impatient_coordinator = type(coordinator)(impatient, {sink_id: committer}, pipeline.checkpoints)
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    blocker = sqlite3.connect(tmp_path / "meta.db", timeout=0)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(MetaStoreUnavailable, match="locked"):
            impatient_coordinator.persist(pre)
        blocker.rollback()
        assert pipeline.store.get(sink_id, 1) is None  # nothing half-written
        assert impatient_coordinator.persist(pre).outcome is PersistOutcome.PERSISTED
        pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
        impatient.decide_commit(sink_id, 1, write_id=pre.write_id)
        committer.commit(CommitPlan(pre), impatient.get(sink_id, 1).created_at)  # type: ignore[union-attr]
        blocker.execute("BEGIN IMMEDIATE")  # the table shows the epoch; the mark cannot be written
        with pytest.raises(MetaStoreUnavailable):
            impatient_coordinator.commit(sink_id, 1)
        blocker.rollback()
        assert impatient_coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED
        assert pipeline.marker_snapshots("orders", sink_id) == {1: [pre.write_id]}
    finally:
        blocker.close()
        impatient.dispose()
        pipeline.dispose()


@pytest.mark.parametrize(
    ("sink_id", "epoch", "named"),
    [("", 1, "sink_id is empty"), ("a/b", 1, "unsafe in a path"), ("ok", -5, "epoch -5 is negative")],
)
def test_bad_keys_on_commit_and_abort_are_named(pipeline: Pipeline, sink_id: str, epoch: int, named: str) -> None:
    coordinator = pipeline.coordinator("ok", pipeline.iceberg_committer())
    if sink_id not in ("", "a/b"):
        sink_id = "ok"
    with pytest.raises(InvalidPreCommit, match=named):
        coordinator.commit(sink_id, epoch)
    with pytest.raises(InvalidPreCommit, match=named):
        coordinator.abort(sink_id, epoch, reason="x")


def test_an_abort_handed_another_epochs_write_is_refused(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    with pytest.raises(InvalidPreCommit, match="was given"):
        coordinator.abort(sink_id, 2, reason="x", write=pre)


def test_file_sink_write_outside_its_staging_is_refused(pipeline: Pipeline, sink_id: str, tmp_path: Path) -> None:
    root = tmp_path / "sink"
    root.mkdir()
    coordinator = pipeline.coordinator(sink_id, pipeline.file_committer(root))
    write_id = str(uuid.uuid4())
    pre = PreCommit(
        sink_id=sink_id,
        epoch=1,
        write_id=write_id,
        tables=[TableWrite(table=str(root), location=f"{tmp_path}/other/{write_id}")],
    )
    with pytest.raises(InvalidPreCommit, match="_staging"):
        coordinator.persist(pre)
    assert pipeline.store.get(sink_id, 1) is None


def test_a_column_added_by_another_writer_since_the_write_is_refused_before_the_decision(
    pipeline: Pipeline, sink_id: str
) -> None:
    """The files of a write that adds a column carry the id the table will assign next. If another
    writer adds a column first, that id belongs to the other column: committing would show our data
    under it. The commit refuses, nothing is decided, and the epoch can still be aborted."""
    from pyiceberg.types import StringType

    table = pipeline.create_table("orders")
    committer = pipeline.iceberg_committer(allow_schema_evolution=True)
    coordinator = pipeline.coordinator(sink_id, committer)
    predicted = table.metadata.last_column_id + 1
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    evolving = pre.tables[0].model_copy(
        update={"added_columns": [WrittenColumn(name="country", type="string", field_id=predicted)]}
    )
    pre = pre.model_copy(update={"tables": [evolving]})
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    with pipeline.catalog.load_table(table.name()).update_schema() as update:
        update.add_column("region", StringType())  # takes the id our files carry for "country"

    with pytest.raises(SchemaMismatch, match=rf"'country' has field id {predicted} in the written files"):
        coordinator.commit(sink_id, 1)
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
    assert "field id" in (row.error or "")
    assert pipeline.marker_snapshots("orders", sink_id) == {}
    assert coordinator.abort(sink_id, 1, reason="schema changed", force=True).files_deleted >= 1


def test_added_column_ids_that_match_the_table_commit(pipeline: Pipeline, sink_id: str) -> None:
    table = pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(allow_schema_evolution=True))
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    column = WrittenColumn(name="country", type="string", field_id=table.metadata.last_column_id + 1)
    pre = pre.model_copy(update={"tables": [pre.tables[0].model_copy(update={"added_columns": [column]})]})
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    coordinator.commit(sink_id, 1)
    schema = pipeline.catalog.load_table(table.name()).schema()
    assert schema.find_field("country").field_id == column.field_id
