"""Reserving an incremental epoch's range (``runtime.run_epochs``) in a real meta store
(SQLite and PostgreSQL), against a real upstream table in a pyiceberg SQL catalog; and the range as
the epoch's checkpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from airflow_provider_exactly_once.checkpoints.config import SnapshotRangeCheckpoint, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.epochs import AbortCause, CheckpointStatus
from airflow_provider_exactly_once.core.errors import EarlierEpochUndecided, InputRangeRefused
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.runtime.run_epochs import current_snapshot_of, reserved_range
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.builders import make_pre_commit

TABLE = "bronze.events"
E1, E2, E3, E4 = (1_717_200_000_000 + n * 3_600_000 for n in range(4))


@pytest.fixture
def store(meta_url: str) -> Iterator[SqlSinkStateStore]:
    opened = SqlSinkStateStore(meta_url)
    yield opened
    opened.dispose()


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[dict[str, str], Table]:
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/upstream.db", "warehouse": f"file://{tmp_path}"}
    catalog = SqlCatalog("upstream", **{k: v for k, v in properties.items() if k != "type"})
    catalog.create_namespace("bronze")
    table = catalog.create_table(TABLE, pa.schema([pa.field("id", pa.int64())]))
    return properties, table


def append(table: Table, *ids: int) -> int:
    table.append(pa.table({"id": pa.array(ids, pa.int64())}))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def reserve(store: SqlSinkStateStore, sink_id: str, epoch: int, properties: dict[str, str]) -> SnapshotRange:
    return reserved_range(store, sink_id, epoch, TABLE, current_snapshot_of("upstream", properties, TABLE), run_id="r")


def commit(store: SqlSinkStateStore, sink_id: str, epoch: int) -> None:
    pre = make_pre_commit(sink_id, epoch)
    store.insert_pending(pre, run_id="r", try_number=1, dag_id="d")
    store.decide_commit(sink_id, epoch, write_id=pre.write_id)
    store.mark_committed(sink_id, epoch, write_id=pre.write_id, committed={"db.events": "1"})


def abort(store: SqlSinkStateStore, sink_id: str, epoch: int) -> None:
    pre = make_pre_commit(sink_id, epoch)
    store.insert_pending(pre, run_id="r", try_number=1, dag_id="d")
    store.mark_aborted(sink_id, epoch, write_id=pre.write_id, reason="failed", cause=AbortCause.CHECKPOINT_FAILED)


def test_each_epoch_reads_on_from_the_last_committed_one_and_a_retry_reads_the_same(
    store: SqlSinkStateStore, sink_id: str, upstream: tuple[dict[str, str], Table]
) -> None:
    properties, table = upstream
    empty = reserve(store, sink_id, E1, properties)  # nothing appended yet: an empty epoch
    assert empty == SnapshotRange(table=TABLE) and empty.empty
    commit(store, sink_id, E1)

    s1 = append(table, 1, 2)
    first = reserve(store, sink_id, E2, properties)
    assert (first.after_snapshot_id, first.to_snapshot_id) == (None, s1)
    s2 = append(table, 3)
    assert reserve(store, sink_id, E2, properties) == first  # a retry: the same range, not up to s2
    commit(store, sink_id, E2)

    second = reserve(store, sink_id, E3, properties)
    assert (second.after_snapshot_id, second.to_snapshot_id) == (s1, s2)
    abort(store, sink_id, E3)
    s3 = append(table, 4)
    third = reserve(store, sink_id, E4, properties)  # epoch 3's range is read here, not skipped
    assert (third.after_snapshot_id, third.to_snapshot_id) == (s1, s3)
    with pytest.raises(InputRangeRefused, match=f"read again by epoch {E4}"):
        reserve(store, sink_id, E3, properties)
    assert [link.epoch for link in store.input_ranges.chain(sink_id).links] == [E1, E2, E3, E4]


def test_a_new_range_waits_for_the_epoch_before_it_and_an_old_interval_is_refused(
    store: SqlSinkStateStore, sink_id: str, upstream: tuple[dict[str, str], Table]
) -> None:
    properties, table = upstream
    append(table, 1)
    reserve(store, sink_id, E2, properties)
    with pytest.raises(EarlierEpochUndecided, match=f"epoch {E2} .* is not committed or aborted yet"):
        reserve(store, sink_id, E3, properties)
    with pytest.raises(InputRangeRefused, match="reads forward only"):
        reserve(store, sink_id, E1, properties)


def test_two_epochs_reserving_at_once_never_share_a_start(
    store: SqlSinkStateStore, sink_id: str, upstream: tuple[dict[str, str], Table]
) -> None:
    """Both see epoch 1 committed and decide on position 1; the store takes one link there, and the
    other epoch decides again on the new chain (and waits for the first, or is behind it)."""
    properties, table = upstream
    append(table, 1)
    reserve(store, sink_id, E1, properties)
    commit(store, sink_id, E1)
    append(table, 2)
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def current() -> int | None:
        barrier.wait(timeout=10)  # both decided before either inserts
        return table.refresh().metadata.current_snapshot_id

    def run(epoch: int) -> None:
        try:
            outcomes[epoch] = reserved_range(store, sink_id, epoch, TABLE, current)
        except Exception as exc:
            outcomes[epoch] = exc

    threads = [threading.Thread(target=run, args=(epoch,)) for epoch in (E2, E3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    ranges = [v for v in outcomes.values() if isinstance(v, SnapshotRange)]
    refused = [v for v in outcomes.values() if isinstance(v, EarlierEpochUndecided | InputRangeRefused)]
    assert len(ranges) == 1 and len(refused) == 1, outcomes
    links = store.input_ranges.chain(sink_id).links
    assert [link.position for link in links] == [0, 1]


def test_the_range_is_the_epochs_checkpoint_complete_once_reserved(
    store: SqlSinkStateStore, sink_id: str, upstream: tuple[dict[str, str], Table]
) -> None:
    properties, table = upstream
    config = checkpoint_config_from_dict(SnapshotRangeCheckpoint().model_dump(mode="json"))
    assert isinstance(config, SnapshotRangeCheckpoint)
    source = config.source(store.checkpoints)
    assert source.status(sink_id, E1) is CheckpointStatus.PENDING
    append(table, 1)
    reserve(store, sink_id, E1, properties)
    assert source.status(sink_id, E1) is CheckpointStatus.COMPLETED
    assert source.status(sink_id, E2) is CheckpointStatus.PENDING
