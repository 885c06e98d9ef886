"""Several epochs' appends in one catalog commit (``IcebergSinkCommitter.commit_batch``): each epoch its own marked
snapshot, parented on the one before, with manifest lists as pyiceberg itself would have written them;
idempotent, and retried on a conflict with the markers read again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from airflow_provider_exactly_once.core.errors import CommitRefused
from airflow_provider_exactly_once.core.ports import CommitPlan, ReplacedWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, WRITE_ID_KEY
from tests.support.faults import FaultSwitch

from .iceberg_helpers import create_table, ids_in, now, simple_write, snapshot_count


def _plans(committer: IcebergSinkCommitter, writes: list) -> list[CommitPlan]:  # type: ignore[type-arg]
    plans = committer.prepare_batch(writes)
    assert all(plan is not None for plan in plans)
    return [plan for plan in plans if plan is not None]


def test_each_epoch_gets_its_own_snapshot_listing_every_manifest_with_its_sequence_number(
    catalog: SqlCatalog, sink_id: str, branch: str
) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog, branch=branch)
    first = simple_write(table, sink_id, 1, start=0)
    committer.commit(CommitPlan(first), now())  # an earlier snapshot, read back from storage by the batch
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (2, 3, 4)]

    result = committer.commit_batch(_plans(committer, writes), [now()] * 3)

    table = table.refresh()
    head = table.metadata.refs[branch].snapshot_id
    assert result[-1] == {"ns.t": str(head)}
    chain = []
    snapshot = table.snapshot_by_id(head)
    while snapshot is not None:
        chain.append(snapshot)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    chain.reverse()
    assert [s.summary[EPOCH_KEY] for s in chain] == ["1", "2", "3", "4"]  # type: ignore[index]
    assert [s.summary[WRITE_ID_KEY] for s in chain[1:]] == [w.write_id for w in writes]  # type: ignore[index]
    assert [str(s.snapshot_id) for s in chain[1:]] == [r["ns.t"] for r in result]
    sequence_of = {s.snapshot_id: s.sequence_number for s in chain}
    for position, snapshot in enumerate(chain):
        manifests = snapshot.manifests(table.io)
        assert len(manifests) == position + 1
        for manifest in manifests:
            assert manifest.added_snapshot_id is not None
            assert manifest.sequence_number == sequence_of[manifest.added_snapshot_id]
            assert manifest.min_sequence_number == sequence_of[manifest.added_snapshot_id]
        ids = sorted(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["id"].to_pylist())
        assert ids == [*range(5), *(i for epoch in range(2, position + 2) for i in range(epoch * 10, epoch * 10 + 5))]


def test_committing_the_batch_again_finds_every_marker_and_adds_nothing(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (1, 2, 3)]
    since = [now() - timedelta(seconds=1)] * 3
    first = committer.commit_batch(_plans(committer, writes), since)

    again = committer.commit_batch([CommitPlan(w) for w in writes], since)

    assert again == first
    assert len(table.refresh().metadata.snapshots) == 3


def test_a_conflict_is_retried_with_the_markers_read_again(catalog: SqlCatalog, sink_id: str) -> None:
    """Another writer appends, and another committer commits epoch 2 of the batch, just before the
    catalog commit: the retry leaves epoch 2 out and stacks 1 and 3 on the new head."""
    table = create_table(catalog, "t")
    faults = FaultSwitch()
    committer = IcebergSinkCommitter(catalog, fault=faults, backoff_initial_s=0, backoff_max_s=0)
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (1, 2, 3)]
    other = simple_write(table, "another-sink", 7, start=100)

    def meanwhile() -> None:
        IcebergSinkCommitter(catalog).commit(CommitPlan(writes[1]), now())
        fresh = catalog.load_table("ns.t")
        data_files = build_data_files(
            other.tables[0].data_files,
            schema=fresh.schema(),
            spec=fresh.spec(),
            spec_id=fresh.spec().spec_id,
            table="ns.t",
        )
        with fresh.transaction() as tx, tx.update_snapshot().fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)

    faults.then("iceberg.before_catalog_update", meanwhile)
    result = committer.commit_batch(_plans(committer, writes), [now() - timedelta(seconds=1)] * 3)

    table = table.refresh()
    by_epoch = {s.summary.additional_properties.get(EPOCH_KEY): s.snapshot_id for s in table.snapshots()}  # type: ignore[union-attr]
    assert list(by_epoch) == ["2", None, "1", "3"]  # in the order the snapshots were made
    assert result == [{"ns.t": str(by_epoch[epoch])} for epoch in ("1", "2", "3")]
    assert ids_in(table) == sorted([*range(10, 15), *range(20, 25), *range(30, 35), *range(100, 105)])


def test_only_appends_are_committed_together_and_a_batch_of_one_is_a_commit(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    committed = simple_write(table, sink_id, 1)
    first = committer.commit(CommitPlan(committed), now())
    replaces = ReplacedWrite(committed.write_id, committed, first, None, 0, now())
    revision = CommitPlan(simple_write(table, sink_id, 1, start=50), replaces)
    append = CommitPlan(simple_write(table, sink_id, 2, start=60))
    with pytest.raises(CommitRefused, match="only appends"):
        committer.commit_batch([revision, append], [now(), now()])
    assert snapshot_count(table) == 1

    [revised] = committer.commit_batch([revision], [now()])  # alone, as its own commit would

    assert revised != first
    assert ids_in(table.refresh()) == list(range(50, 55))
