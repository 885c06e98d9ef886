"""delete_write (invariant 4): delete a write's files only when the table certainly does not use them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from airflow_provider_exactly_once.core.errors import AbortRefused, UnknownTable
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter

from .iceberg_helpers import (
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


def _files_below(location: str) -> set[Path]:
    root = local_path(location)
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def test_refused_while_our_marker_is_visible(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, files=2)
    committer = IcebergSinkCommitter(catalog)
    since = now()
    committer.commit(CommitPlan(pc), since)

    with pytest.raises(AbortRefused, match="shows this write committed"):
        committer.delete_write(pc, since)
    assert len(_files_below(pc.tables[0].location)) == 2
    assert ids_in(table) == list(range(10))


def test_deletes_only_the_write_location_and_is_idempotent(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    committed = simple_write(table, sink_id, epoch=1)
    committer.commit(CommitPlan(committed), now())
    aborted = simple_write(table, sink_id, epoch=2, start=100, files=3)
    stray = local_path(aborted.tables[0].location) / "nested" / "_temporary" / "part-0.tmp"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"half written")
    keep_before = _files_below(committed.tables[0].location)
    metadata_before = _files_below(f"{table.location()}/metadata")

    assert committer.delete_write(aborted, now()) == 4
    assert not local_path(aborted.tables[0].location).exists()
    assert _files_below(committed.tables[0].location) == keep_before
    assert metadata_before <= _files_below(f"{table.location()}/metadata")
    assert ids_in(table) == list(range(5))

    assert committer.delete_write(aborted, now()) == 0  # idempotent


def test_another_writes_marker_does_not_block_but_its_files_do(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    winner = simple_write(table, sink_id, epoch=5)
    committer.commit(CommitPlan(winner), now())
    loser = simple_write(table, sink_id, epoch=5, start=50)

    assert committer.delete_write(loser, now()) == 1
    assert ids_in(table) == list(range(5))

    # A write whose location holds a file the table references (committed by someone else's marker).
    shared_location = winner.tables[0].location
    shared = pre_commit(sink_id, 5, [table_write(table, shared_location, [])])
    with pytest.raises(AbortRefused, match=r"references 1 file\(s\)"):
        committer.delete_write(shared, now())
    assert len(_files_below(shared_location)) == 1


def test_fan_out_refusal_on_one_table_deletes_nothing(catalog: SqlCatalog, sink_id: str) -> None:
    first, second = create_table(catalog, "a"), create_table(catalog, "b")
    write_id = str(uuid.uuid4())
    loc_a, loc_b = write_location(first, write_id), write_location(second, write_id)
    pc = pre_commit(
        sink_id,
        3,
        [
            table_write(first, loc_a, [write_parquet(first, loc_a, rows(0, 2))]),
            table_write(second, loc_b, [write_parquet(second, loc_b, rows(0, 2))]),
        ],
        write_id=write_id,
    )
    # Only table b got the write's files, outside of our committer (a half-finished foreign commit).
    second.refresh().add_files([pc.tables[1].data_files[0].path])
    with pytest.raises(AbortRefused, match=r"'ns\.b'"):
        IcebergSinkCommitter(catalog).delete_write(pc, now())
    assert len(_files_below(loc_a)) == 1 and len(_files_below(loc_b)) == 1


def test_beyond_the_horizon_the_whole_live_table_is_checked(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t", properties={"history.expire.max-snapshot-age-ms": "60000"})
    pc = simple_write(table, sink_id)
    table.refresh().add_files([pc.tables[0].data_files[0].path])  # referenced, without any marker
    committer = IcebergSinkCommitter(catalog, clock_skew=timedelta(0))
    with pytest.raises(AbortRefused, match="references"):
        committer.delete_write(pc, now() - timedelta(hours=1))
    assert snapshot_count(table) == 1 and len(_files_below(pc.tables[0].location)) == 1


def test_unknown_table_deletes_nothing(catalog: SqlCatalog, sink_id: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    renamed = pc.model_copy(update={"tables": [pc.tables[0].model_copy(update={"table": "ns.gone"})]})
    with pytest.raises(UnknownTable):
        IcebergSinkCommitter(catalog).delete_write(renamed, now())
    assert len(_files_below(pc.tables[0].location)) == 1


def test_many_deletes_read_each_snapshots_manifests_once_and_still_see_references(
    catalog: SqlCatalog, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery pass deleting k aborted writes after m commits must not read k times m manifest
    lists (quadratic on one busy table, found by bench/e2e_recovery.py); and remembering what a
    snapshot added must never hide a reference made by a snapshot seen for the first time."""
    from pyiceberg.table.snapshots import Snapshot

    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    since = now()
    aborted = [simple_write(table, sink_id, epoch=100 + n, start=1000 + 10 * n) for n in range(4)]
    for epoch in range(1, 6):
        committer.commit(CommitPlan(simple_write(table, sink_id, epoch=epoch, start=10 * epoch)), now())

    reads: list[int] = []
    original = Snapshot.manifests

    def counting(self: Snapshot, io: object) -> object:
        reads.append(self.snapshot_id)
        return original(self, io)  # type: ignore[arg-type]

    monkeypatch.setattr(Snapshot, "manifests", counting)
    for write in aborted:
        assert committer.delete_write(write, since) == 1
    assert len(reads) == len(set(reads)) == 5  # each of the five commits' manifests, once

    # A snapshot added after the memo was filled, referencing a write's files, is still seen.
    late = simple_write(table, sink_id, epoch=200, start=5000)
    committer.commit(CommitPlan(late), now())
    sneaky = pre_commit(sink_id, 201, late.tables, write_id=str(uuid.uuid4()))
    with pytest.raises(AbortRefused, match="references 1 file"):
        committer.delete_write(sneaky, since)
    assert len(_files_below(late.tables[0].location)) == 1
