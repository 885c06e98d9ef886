"""The batch commit (``IcebergSinkCommitter.commit_batch`` of several plans) held to what the single commit promises, case by case:
rows of manifests that hold only existing files carried into every stacked snapshot, the retention
horizon refused, another write's marker refused, and the refusal naming the table as it is configured;
and what only a commit of several epochs refuses, a schema change stacked with other epochs.

Each table is judged by DuckDB's iceberg reader (``tests.support.independent_reader``), not only by
pyiceberg, whose scan shares our manifest code.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from airflow_provider_exactly_once.core.errors import CommitRefused, ForeignWriteVisible, MarkerHorizonExceeded
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from tests.support.independent_reader import read_rows

from .iceberg_helpers import create_table, now, simple_write, snapshot_count
from .test_iceberg_commit import _write_with_new_column


def _plans(committer: IcebergSinkCommitter, writes: list[PreCommit]) -> list[CommitPlan]:
    plans = committer.prepare_batch(writes)
    assert all(plan is not None for plan in plans)
    return [plan for plan in plans if plan is not None]


def test_a_manifest_of_only_existing_files_is_carried_into_every_snapshot_of_the_batch(
    catalog: SqlCatalog, sink_id: str
) -> None:
    """``table.delete`` rewrites the first write's manifest so that it lists its surviving file as
    EXISTING (and nothing as ADDED); each stacked append must list that manifest again."""
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    committer.commit(CommitPlan(simple_write(table, sink_id, 1, start=0, files=2)), now())  # ids 0-9 in 2 files
    table = table.refresh()
    table.delete("id < 5")
    table = table.refresh()
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (2, 3, 4)]

    committer.commit_batch(_plans(committer, writes), [now()] * 3)

    table = table.refresh()
    assert read_rows(table, "id") == [(i,) for i in [*range(5, 10), *range(20, 25), *range(30, 35), *range(40, 45)]]


def test_a_batch_beyond_the_retention_horizon_is_refused_as_a_single_commit_is(
    catalog: SqlCatalog, sink_id: str
) -> None:
    table = create_table(catalog, "t", properties={"history.expire.max-snapshot-age-ms": "3600000"})
    committer = IcebergSinkCommitter(catalog)
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (1, 2)]
    two_hours_ago = now() - timedelta(hours=2)

    with pytest.raises(MarkerHorizonExceeded, match="may have expired"):
        committer.commit(CommitPlan(writes[0]), two_hours_ago)
    with pytest.raises(MarkerHorizonExceeded, match="may have expired"):
        committer.commit_batch(_plans(committer, writes), [two_hours_ago] * 2)

    assert snapshot_count(table) == 0


def test_another_writes_marker_for_an_epoch_of_the_batch_is_refused_and_nothing_is_added(
    catalog: SqlCatalog, sink_id: str
) -> None:
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    write_a = simple_write(table, sink_id, 2, start=100)
    committer.commit(CommitPlan(write_a), now())
    writes = [simple_write(table, sink_id, epoch, start=epoch * 10) for epoch in (1, 2)]

    with pytest.raises(ForeignWriteVisible, match=f"committed by write '{write_a.write_id}'"):
        committer.commit_batch(_plans(committer, writes), [now()] * 2)

    assert snapshot_count(table) == 1
    assert read_rows(table.refresh(), "id") == [(i,) for i in range(100, 105)]


def test_another_writes_marker_names_the_table_by_its_dotted_name(catalog: SqlCatalog, sink_id: str) -> None:
    """Single commit and batch alike: ``table 'ns.t'``, as the sink names it, not pyiceberg's tuple."""
    table = create_table(catalog, "t")
    committer = IcebergSinkCommitter(catalog)
    committer.commit(CommitPlan(simple_write(table, sink_id, 1)), now())
    other = simple_write(table, sink_id, 1, start=50)

    with pytest.raises(ForeignWriteVisible) as single:
        committer.commit(CommitPlan(other), now())
    with pytest.raises(ForeignWriteVisible) as batch:
        committer.commit_batch([CommitPlan(other)], [now()])

    for refusal in (single.value, batch.value):
        assert "table 'ns.t' already shows this epoch" in str(refusal)


def test_a_write_that_adds_columns_is_not_stacked_with_other_epochs(catalog: SqlCatalog, sink_id: str) -> None:
    """``prepare_batch`` leaves it to commit alone; a plan that did not show it (unprepared, or stale
    and checked again) is refused before anything is committed, and commits alone after all."""
    table, adds_a_column = _write_with_new_column("t", catalog, sink_id)  # epoch 9
    before = simple_write(table, sink_id, 8, start=100)
    committer = IcebergSinkCommitter(catalog, allow_schema_evolution=True)
    assert committer.prepare_batch([before, adds_a_column])[1] is None

    with pytest.raises(CommitRefused, match=r"adds columns to table 'ns\.t'"):
        committer.commit_batch([CommitPlan(before), CommitPlan(adds_a_column)], [now()] * 2)
    assert snapshot_count(table) == 0

    committer.commit_batch([CommitPlan(before)], [now()])
    committer.commit_batch([CommitPlan(adds_a_column)], [now()])
    assert snapshot_count(table) == 2
    assert table.refresh().schema().find_field("country").doc == "ISO code"
