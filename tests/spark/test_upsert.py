"""Upsert sinks end to end in-process: epochs of changes (insert, update, delete by key) written
copy-on-write by the real Spark job, persisted and committed by the coordinator, and the table read
back by DuckDB's iceberg extension against a model (a dict keyed by the primary key)."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

from airflow_provider_exactly_once.checkpoints.sources import MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.decisions import revision_basis
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, generation_of
from airflow_provider_exactly_once.core.errors import (
    EarlierEpochUndecided,
    InvalidChanges,
    InvalidSinkConfig,
    ReprocessRefused,
    UpsertConflict,
)
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore
from tests.spark.conftest import INTERVAL_END, INTERVAL_START, run_in_process
from tests.support.independent_reader import read_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "value", StringType(), required=False),
)
BY_REGION = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
REGIONS = ("eu", "us", "ap")
Model = dict[int, tuple[str, str]]


class Upserts:
    """One upsert sink over a real SQL catalog and meta store; each epoch is a Spark write of its
    landed changes, then persist, checkpoint and commit through the coordinator."""

    def __init__(
        self,
        spark: Any,
        tmp_path: Path,
        catalog: Catalog,
        props: dict[str, str],
        table: str,
        target_file_size_bytes: int | None = None,
    ) -> None:
        self.spark, self.tmp_path, self.catalog, self.props, self.table = spark, tmp_path, catalog, props, table
        self.target_file_size_bytes = target_file_size_bytes
        self.store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
        self.committer = IcebergSinkCommitter(catalog)
        self.coordinator = TwoPhaseCommitCoordinator(
            self.store,
            {"up": self.committer},
            MetaStoreCheckpointSource(self.store.checkpoints),
            on_reprocess={"up": "replace"},
        )
        self.epochs = 0

    def write(self, changes: pa.Table | None, *, revising: tuple[int, str] | None = None, **upsert: Any) -> PreCommit:
        """The Spark write of one epoch's changes (nothing persisted); ``None``: an epoch without input.

        ``revising``: (epoch, generation) of a reprocess of a committed epoch, planned as the write
        task plans it (``core.decisions.revision_basis``).
        """
        revision: dict[str, Any] = {}
        if revising is None:
            self.epochs += 1
            epoch = self.epochs
        else:
            epoch, generation = revising
            basis = revision_basis(self.store.get("up", epoch), generation, "replace")
            assert basis is not None, "the epoch is not committed as changes by key"
            revision = {"revision": basis[self.table].model_dump(mode="json")}
        landing = self.tmp_path / f"changes-{epoch}-{uuid.uuid4().hex[:6]}"
        landing.mkdir()
        if changes is not None:
            pq.write_table(changes, landing / "part-0.parquet")
        spec = {
            "sink_id": "up",
            "epoch": epoch,
            "write_id": str(uuid.uuid4()),
            "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_END,
            "input": {"kind": "files", "format": "parquet", "path": str(landing)},
            "target": {
                "kind": "iceberg",
                "catalog_properties": self.props,
                "table": self.table,
                "upsert": {"key": ["id"], "op_column": "op", **upsert},
                **revision,
            },
            "output_path": str(self.tmp_path / f"out-{uuid.uuid4().hex[:6]}.json"),
            "target_file_size_bytes": self.target_file_size_bytes,
        }
        from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

        pre_commit = run_in_process(self.spark, EpochJobSpec.model_validate(spec))
        return pre_commit if revising is None else pre_commit.model_copy(update={"generation": revising[1]})

    def persist(self, pre_commit: PreCommit) -> None:
        self.coordinator.persist(pre_commit)
        self.store.checkpoints.set_checkpoint("up", pre_commit.epoch, CheckpointStatus.COMPLETED)

    def commit(self, pre_commit: PreCommit) -> None:
        assert self.coordinator.commit("up", pre_commit.epoch).outcome is CommitOutcome.COMMITTED

    def apply(self, changes: pa.Table, **upsert: Any) -> PreCommit:
        pre_commit = self.write(changes, **upsert)
        self.persist(pre_commit)
        self.commit(pre_commit)
        return pre_commit

    def rows(self) -> Model:
        """The table as DuckDB reads it, keyed by id; duplicate keys fail here."""
        table = self.catalog.load_table(self.table)
        rows = read_rows(table, "id, region, value")
        model = {r[0]: (r[1], r[2]) for r in rows}
        assert len(model) == len(rows), "a key is visible twice"
        return model


def changes_of(rows: list[tuple[int, str, str | None, str]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "region": pa.array([r[1] for r in rows], pa.string()),
            "value": pa.array([r[2] for r in rows], pa.string()),
            "op": pa.array([r[3] for r in rows], pa.string()),
        }
    )


def random_epoch(rng: random.Random, model: Model, size: int, key_space: int, epoch: int) -> list[Any]:
    """Changes of distinct keys: updates and deletes of present keys (some moving region), inserts
    of absent ones, deletes of absent keys too."""
    rows = []
    for key in rng.sample(range(key_space), size):
        region = rng.choice(REGIONS)
        op = rng.choice(("U", "U", "D")) if key in model else rng.choice(("I", "I", "I", "D"))
        rows.append((key, region, None if op == "D" else f"v{epoch}-{key}", op))
    return rows


def apply_to_model(model: Model, rows: list[Any]) -> None:
    for key, region, value, op in rows:
        if op == "D":
            model.pop(key, None)
        else:
            model[key] = (region, value)


@pytest.mark.parametrize("spec", [PartitionSpec(), BY_REGION], ids=["unpartitioned", "by_region"])
def test_epochs_of_changes_leave_the_table_equal_to_the_model_after_every_epoch(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], spec: PartitionSpec
) -> None:
    catalog.create_table("ns.accounts", SCHEMA, partition_spec=spec)
    # Files of 100 rows (Spark's estimate of a row here: 48 bytes).
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.accounts", target_file_size_bytes=4800)
    rng, model = random.Random(7), {}
    # Epoch 1 inserts 300 keys over several files; later epochs touch keys spread over all of them.
    first = [(k, REGIONS[k % 3], f"v1-{k}", "I") for k in range(300)]
    pre_commit = sink.apply(changes_of(first))
    apply_to_model(model, first)
    assert sink.rows() == model
    assert len(pre_commit.tables[0].data_files) >= 3
    assert pre_commit.tables[0].changes is not None and pre_commit.tables[0].changes.inserted == 300
    for epoch in range(2, 6):
        rows = random_epoch(rng, model, 40, 400, epoch)
        before = dict(model)
        pre_commit = sink.apply(changes_of(rows))
        apply_to_model(model, rows)
        assert sink.rows() == model, f"epoch {epoch}"
        (write,) = pre_commit.tables
        counts = write.changes
        assert counts is not None
        assert counts.updated == sum(1 for k, _, _, op in rows if op == "U" and k in before)
        assert counts.deleted == sum(1 for k, _, _, op in rows if op == "D" and k in before)
        assert counts.inserted == sum(1 for k, _, _, op in rows if op == "I")
        assert counts.deletes_of_absent_keys == sum(1 for k, _, _, op in rows if op == "D" and k not in before)
        table = sink.catalog.load_table("ns.accounts")
        snapshot = table.current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        assert snapshot.summary["exactly-once.epoch"] == str(epoch)  # one marked snapshot per epoch
        assert snapshot.summary.operation.value == "overwrite"
    # pyiceberg agrees with DuckDB.
    arrow = sink.catalog.load_table("ns.accounts").scan().to_arrow()
    assert {r["id"]: (r["region"], r["value"]) for r in arrow.to_pylist()} == model


def test_the_last_change_of_a_key_by_order_by_wins_and_two_without_order_are_refused(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.ordered", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.ordered")
    twice = changes_of([(1, "eu", "first", "I"), (1, "eu", "second", "U"), (2, "us", "x", "I")])
    with pytest.raises(InvalidChanges, match=r"1 key\(s\) change more than once.*'id': 1"):
        sink.write(twice)
    ordered = twice.append_column("seq", pa.array([1, 2, 1], pa.int64()))
    sink.apply(ordered, order_by="seq")
    assert sink.rows() == {1: ("eu", "second"), 2: ("us", "x")}
    tie = changes_of([(3, "eu", "a", "I"), (3, "eu", "b", "I")]).append_column("seq", pa.array([5, 5], pa.int64()))
    with pytest.raises(InvalidChanges, match="same 'seq'"):
        sink.write(tie, order_by="seq")
    # Two changes sharing an order value below the key's last are no tie: the last wins.
    below = changes_of([(4, "eu", "a", "I"), (4, "eu", "b", "U"), (4, "us", "c", "U")])
    sink.apply(below.append_column("seq", pa.array([1, 1, 2], pa.int64())), order_by="seq")
    assert sink.rows()[4] == ("us", "c")


@pytest.mark.parametrize(
    ("rows", "refusal"),
    [
        (
            [(None, "eu", "a", "I")],
            r"sink 'up' epoch 1 table 'ns.bad': 1 change row\(s\) have a null in key column\(s\) \['id'\]",
        ),
        ([(1, "eu", "a", "upsert!")], r"operation in column 'op' that is none of .*\['upsert!'\]"),
    ],
)
def test_bad_changes_are_refused_before_anything_is_written(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str], rows: list[Any], refusal: str
) -> None:
    table = catalog.create_table("ns.bad", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.bad")
    with pytest.raises(InvalidChanges, match=refusal):
        sink.write(changes_of(rows))
    assert not list((tmp_path / "warehouse").rglob("*.parquet"))
    assert table.refresh().current_snapshot() is None


def test_with_order_by_a_bad_change_is_refused_even_when_a_later_change_of_its_key_supersedes_it(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """The checks read columns the last-change pick computes per key: a fault in a change the pick
    drops must still refuse the epoch."""
    table = catalog.create_table("ns.superseded", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.superseded")
    unknown_first = changes_of([(1, "eu", "a", "upsert!"), (1, "eu", "b", "U"), (2, "us", "c", "I")])
    with pytest.raises(InvalidChanges, match=r"1 change row\(s\) have an operation in column 'op'.*\['upsert!'\]"):
        sink.write(unknown_first.append_column("seq", pa.array([1, 2, 1], pa.int64())), order_by="seq")
    null_keys = changes_of([(None, "eu", "a", "I"), (None, "us", "b", "I"), (3, "eu", "c", "I")])  # type: ignore[list-item]
    with pytest.raises(InvalidChanges, match=r"2 change row\(s\) have a null in key column\(s\) \['id'\]"):
        sink.write(null_keys.append_column("seq", pa.array([1, 2, 1], pa.int64())), order_by="seq")
    assert not list((tmp_path / "warehouse").rglob("*.parquet"))
    assert table.refresh().current_snapshot() is None


def test_a_key_the_input_or_the_table_lacks_is_refused_naming_the_column(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.keys", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.keys")
    with pytest.raises(InvalidSinkConfig, match=r"key column\(s\) \['id'\] are not in the epoch's input"):
        sink.write(changes_of([(1, "eu", "a", "I")]).drop_columns(["id"]))
    with catalog.load_table("ns.keys").update_schema() as update:
        update.set_identifier_fields("id")
    with pytest.raises(InvalidSinkConfig, match=r"identifier fields are \['id'\], the sink's key is \['region'\]"):
        sink.write(changes_of([(1, "eu", "a", "I")]), key=["region"])


def test_the_key_becomes_the_tables_identifier_fields_when_it_has_none(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.ident", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.ident")
    sink.apply(changes_of([(1, "eu", "a", "I")]))
    assert catalog.load_table("ns.ident").schema().identifier_field_names() == {"id"}


def test_upsert_epochs_commit_in_epoch_order(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.order", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.order")
    first = sink.write(changes_of([(1, "eu", "a", "I")]))
    sink.persist(first)
    second = sink.write(changes_of([(2, "eu", "b", "I")]))
    sink.persist(second)
    with pytest.raises(
        EarlierEpochUndecided, match=r"1 earlier epoch\(s\) of the sink are still undecided \(Pending\): 1"
    ):
        sink.commit(second)
    sink.commit(first)
    sink.commit(second)  # keys disjoint from the first epoch's range: no conflict
    assert sink.rows() == {1: ("eu", "a"), 2: ("eu", "b")}


def test_a_file_rewritten_by_a_compaction_since_the_read_refuses_the_commit_and_nothing_is_lost(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.compacted", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.compacted")
    sink.apply(changes_of([(k, "eu", "a", "I") for k in range(10)]))
    pre_commit = sink.write(changes_of([(3, "eu", "b", "U"), (4, "eu", None, "D")]))
    sink.persist(pre_commit)
    # Another writer compacts: the file the upsert rewrote is replaced by one with the same rows.
    table = catalog.load_table("ns.compacted")
    rows = table.scan().to_arrow()
    table.overwrite(rows)
    with pytest.raises(UpsertConflict, match=r"file\(s\) it rewrote are no longer in the table"):
        sink.commit(pre_commit)
    assert sink.rows() == {k: ("eu", "a") for k in range(10)}  # nothing resurrected, nothing lost
    row = sink.store.get("up", pre_commit.epoch)
    assert row is not None and row.status.value == "Pending"  # undecided: still abortable and re-writable


def test_a_concurrent_append_of_a_key_in_the_epochs_range_refuses_the_commit(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.appended", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.appended")
    sink.apply(changes_of([(k, "eu", "a", "I") for k in range(0, 10)]))
    pre_commit = sink.write(changes_of([(20, "eu", "new", "I"), (3, "eu", None, "D")]))
    sink.persist(pre_commit)
    table = catalog.load_table("ns.appended")
    table.append(
        pa.table(
            {"id": pa.array([20], pa.int64()), "region": ["us"], "value": ["appender"]},
            schema=table.schema().as_arrow(),
        )
    )
    with pytest.raises(UpsertConflict, match=r"1 data file\(s\) added since its read may hold the epoch's keys"):
        sink.commit(pre_commit)
    # An append outside the epoch's key range does not conflict.
    other = sink.write(changes_of([(50, "eu", "x", "I")]))
    sink.coordinator.abort("up", pre_commit.epoch, reason="conflict", force=True)
    sink.persist(other)
    table = catalog.load_table("ns.appended")
    table.append(
        pa.table({"id": pa.array([60], pa.int64()), "region": ["us"], "value": ["b"]}, schema=table.schema().as_arrow())
    )
    sink.commit(other)
    model = sink.rows()
    assert model[50] == ("eu", "x") and model[20] == ("us", "appender") and model[60] == ("us", "b")


G0 = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 0)
G1 = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 1)
G2 = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 2)


def three_epochs(sink: Upserts, later: list[Any]) -> tuple[Model, PreCommit]:
    """Epoch 1 inserts keys 0..9 (P); epoch 2 (E, generation G0) updates 1, deletes 2, inserts 20;
    epoch 3 applies ``later``. Returns P and E."""
    first = [(k, "eu", "v1", "I") for k in range(10)]
    sink.apply(changes_of(first))
    before = {k: ("eu", "v1") for k in range(10)}
    committed = sink.write(changes_of([(1, "eu", "e", "U"), (2, "eu", None, "D"), (20, "us", "e", "I")]))
    committed = committed.model_copy(update={"generation": G0})
    sink.persist(committed)
    sink.commit(committed)
    sink.apply(changes_of(later))
    return before, committed


def test_a_reprocessed_upsert_epoch_replaces_its_changes_and_keeps_the_later_epochs(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.again", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.again")
    later = [(30, "ap", "f", "I")]  # epoch 3: other keys, outside the files epoch 2 wrote
    model, committed = three_epochs(sink, later)
    shown = {**model, 1: ("eu", "e"), 20: ("us", "e"), 30: ("ap", "f")}
    del shown[2]
    assert sink.rows() == shown

    # The cleared run of epoch 2 sees other changes: it updates 3 and inserts 21, and no longer
    # mentions keys 1, 2 and 20, so epoch 2's update, delete and insert of them are undone.
    revision = sink.write(changes_of([(3, "eu", "r", "U"), (21, "us", "r", "I")]), revising=(2, G1))
    (write,) = revision.tables
    assert write.revises is not None and write.revises.write_id == committed.write_id
    assert write.changes is not None and (write.changes.updated, write.changes.inserted) == (1, 1)  # against P
    assert sink.coordinator.persist(revision).outcome is PersistOutcome.REVISED
    sink.commit(revision)

    apply_to_model(model, [(3, "eu", "r", "U"), (21, "us", "r", "I"), *later])
    assert sink.rows() == model
    row = sink.store.get("up", 2)
    assert row is not None and (row.write_id, row.revision) == (revision.write_id, 1)
    table = catalog.load_table("ns.again")
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.additional_properties["exactly-once.revision"] == "1"

    # Reprocessed once more, with no input at all: the epoch had no changes after all.
    empty = sink.write(None, revising=(2, G2))
    sink.persist(empty)
    sink.commit(empty)
    assert sink.rows() == {**{k: ("eu", "v1") for k in range(10)}, 30: ("ap", "f")}


def test_a_reprocessed_upsert_epoch_whose_keys_a_later_epoch_changed_is_refused(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.refused", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.refused")
    _, committed = three_epochs(sink, [(4, "eu", "f", "U")])  # epoch 3 rewrote the file epoch 2 wrote
    shown = sink.rows()
    head = catalog.load_table("ns.refused").metadata.current_snapshot_id
    revision = sink.write(changes_of([(3, "eu", "r", "U")]), revising=(2, G1))

    with pytest.raises(UpsertConflict) as refused:
        sink.coordinator.persist(revision)

    message = str(refused.value)
    assert f"sink 'up' epoch 2 write {revision.write_id}: revision of write {committed.write_id}" in message
    assert "no longer in the table" in message and "epoch 3 of sink 'up'" in message
    assert "Reprocessing an upsert epoch" in message
    assert catalog.load_table("ns.refused").metadata.current_snapshot_id == head
    assert sink.rows() == shown
    row = sink.store.get("up", 2)
    assert row is not None and (row.status.value, row.write_id) == ("Committed", committed.write_id)


def test_a_reprocessed_upsert_epoch_not_planned_as_a_revision_is_refused_and_its_write_removed(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.unplanned", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.unplanned")
    first = sink.write(changes_of([(1, "eu", "a", "I")]))
    first = first.model_copy(update={"generation": G0})
    sink.persist(first)
    sink.commit(first)
    sink.epochs -= 1  # the same epoch again, from a newer generation, written against the table as it is
    again = sink.write(changes_of([(1, "eu", "b", "U")])).model_copy(update={"generation": G1})
    with pytest.raises(ReprocessRefused, match="planned against the table as it is now"):
        sink.coordinator.persist(again)
    assert sink.rows() == {1: ("eu", "a")}
    assert not (Path(again.tables[0].location.removeprefix("file://"))).exists()


def test_a_conflict_after_the_commit_decision_is_given_up_as_lost_and_the_epoch_written_again(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_table("ns.raced", SCHEMA)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.raced")
    sink.apply(changes_of([(k, "eu", "a", "I") for k in range(5)]))
    changes = changes_of([(1, "eu", "b", "U"), (2, "eu", None, "D")])
    pre_commit = sink.write(changes)
    sink.persist(pre_commit)
    sink.store.decide_commit("up", pre_commit.epoch, write_id=pre_commit.write_id)
    table = catalog.load_table("ns.raced")
    table.overwrite(table.scan().to_arrow())  # the compaction lands between the decision and the commit
    with pytest.raises(UpsertConflict):
        sink.commit(pre_commit)
    aborted = sink.coordinator.abort("up", pre_commit.epoch, reason="upsert conflict: written again", files_lost=True)
    assert aborted.record is not None and aborted.record.status.value == "Aborted"
    sink.epochs -= 1  # the run cleared: the same epoch written again, against the compacted table
    sink.apply(changes)
    assert sink.rows() == {0: ("eu", "a"), 1: ("eu", "b"), 3: ("eu", "a"), 4: ("eu", "a")}


def upsert_across_schema_changes(spark: Any, tmp_path: Path, catalog: Catalog, props: dict[str, str]) -> None:
    """Epoch 1 writes files at the first schema; then a key column and a value column are renamed,
    a column is dropped and one added, and pyiceberg appends a file at the new schema. Epoch 2's
    changes, by the renamed key (with a timestamp without zone), hit rows in both kinds of file:
    found only when the files' key columns are read by field id (by name, the old files have no
    ``account``, and every update would become a second row of its key). The table read by
    pyiceberg and by DuckDB equals the model."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "opened", TimestampType(), required=True),
        NestedField(3, "region", StringType(), required=False),
        NestedField(4, "value", StringType(), required=False),
        NestedField(5, "gone", StringType(), required=False),
        identifier_field_ids=[1, 2],
    )
    name = "ns.evolving"
    catalog.create_table(
        name, schema, partition_spec=PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
    )
    sink = Upserts(spark, tmp_path, catalog, props, name, target_file_size_bytes=4800)
    start = dt.datetime(2024, 5, 1)

    def opened(k: int) -> dt.datetime:
        return start + dt.timedelta(hours=k)

    def changes(rows: list[tuple[int, str, str | None, str | None, str]], key: str, value: str) -> pa.Table:
        columns: dict[str, pa.Array] = {
            key: pa.array([r[0] for r in rows], pa.int64()),
            "opened": pa.array([opened(r[0]) for r in rows], pa.timestamp("us")),
            "region": pa.array([r[1] for r in rows], pa.string()),
            value: pa.array([r[2] for r in rows], pa.string()),
            "op": pa.array([r[4] for r in rows], pa.string()),
        }
        if key == "account":
            columns["note"] = pa.array([r[3] for r in rows], pa.string())
        return pa.table(columns)

    model: dict[int, tuple[str, str | None, str | None]] = {}
    first = [(k, REGIONS[k % 3], f"v1-{k}", None, "I") for k in range(150)]
    sink.apply(changes(first, "id", "value"), key=["id", "opened"])
    model.update({k: (r, v, None) for k, r, v, _, _ in first})

    table = catalog.load_table(name)
    with table.update_schema() as update:
        update.rename_column("id", "account")
        update.rename_column("value", "amount")
        update.delete_column("gone")
    with table.update_schema() as update:
        update.add_column("note", StringType())
    later = [(k, REGIONS[k % 3], f"p-{k}", f"n-{k}", "I") for k in range(150, 200)]
    table.append(
        changes(later, "account", "amount")
        .drop_columns(["op"])
        .select(table.schema().column_names)
        .cast(table.schema().as_arrow())
    )
    model.update({k: (r, v, n) for k, r, v, n, _ in later})

    updates = [
        *[(k, REGIONS[(k + 1) % 3], f"v2-{k}", "moved", "U") for k in range(0, 150, 7)],  # old files, moving region
        *[(k, REGIONS[k % 3], f"v2-{k}", "kept", "U") for k in range(150, 200, 5)],  # the new file
        *[(k, REGIONS[k % 3], f"v2-{k}", None, "I") for k in range(300, 310)],
    ]
    updated = {r[0] for r in updates}
    deletes = [(k, REGIONS[k % 3], None, None, "D") for k in [*range(3, 150, 11), *range(151, 200, 13)]]
    second = [*updates, *[r for r in deletes if r[0] not in updated]]
    before = dict(model)
    pre_commit = sink.apply(changes(second, "account", "amount"), key=["account", "opened"])
    for k, region, value, note, op in second:
        if op == "D":
            model.pop(k, None)
        else:
            model[k] = (region, value, note)
    counts = pre_commit.tables[0].changes
    assert counts is not None
    assert counts.updated == sum(1 for r in second if r[4] == "U" and r[0] in before) > 30
    assert counts.deleted == sum(1 for r in second if r[4] == "D" and r[0] in before) > 10
    assert counts.inserted == 10

    table = catalog.load_table(name)
    scanned = table.scan().to_arrow().to_pylist()
    assert {r["account"]: (r["region"], r["amount"], r["note"]) for r in scanned} == model
    assert len(scanned) == len(model), "a key is visible twice"
    assert all(r["opened"] == opened(r["account"]) for r in scanned)
    independent = read_rows(table, "account, region, amount, note")
    assert {r[0]: tuple(r[1:]) for r in independent} == model and len(independent) == len(model)


def test_an_upsert_finds_its_keys_in_files_written_before_the_key_was_renamed(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    upsert_across_schema_changes(spark, tmp_path, catalog, catalog_props)
