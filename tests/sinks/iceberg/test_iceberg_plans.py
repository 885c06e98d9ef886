"""IcebergSinkCommitter.prepare and the CommitPlan it returns: what a plan saves, and why a stale one is safe."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from airflow_provider_exactly_once.core.errors import MarkerHorizonExceeded, ReplacedFilesMissing
from airflow_provider_exactly_once.core.ports import CommitPlan, ReplacedWrite
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.committer import FAULT_LOADED
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import PREPARED_FRESH_S, TablePlan

from .iceberg_helpers import create_table, ids_in, now, rows, simple_write, snapshot_count

BEFORE_UPDATE = "iceberg.before_catalog_update"


def _counting(catalog: SqlCatalog, **options: Any) -> tuple[IcebergSinkCommitter, Counter[str]]:
    seen: Counter[str] = Counter()
    committer = IcebergSinkCommitter(
        catalog, fault=lambda point: seen.update([point]), backoff_initial_s=0.001, backoff_max_s=0.01, **options
    )
    return committer, seen


def test_a_fresh_prepared_plan_commits_without_loading_again(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer, seen = _counting(catalog, branch=branch)

    plan = committer.prepare(pc)
    assert seen[FAULT_LOADED] == 1
    assert plan.pre_commit == pc and plan.replaces is None and set(plan.prepared) == {"ns.t"}
    result = committer.commit(plan, now())

    assert seen[FAULT_LOADED] == 1  # the table prepare loaded was the one committed into
    assert committer.identities(pc) == {"ns.t": str(table.metadata.table_uuid)}
    assert ids_in(table, branch) == list(range(5))
    assert committer.find_committed(pc, now()).tables == result


@pytest.mark.parametrize("plan_kind", ["unprepared", "stale", "prepared by another committer"])
def test_a_plan_without_fresh_state_of_this_committer_loads_the_table_again(
    catalog: SqlCatalog, sink_id: str, plan_kind: str
) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer, seen = _counting(catalog)
    if plan_kind == "unprepared":
        plan = CommitPlan(pc)
    elif plan_kind == "stale":
        prepared = committer.prepare(pc)
        assert prepared.prepared_at is not None
        plan = dataclasses.replace(prepared, prepared_at=prepared.prepared_at - PREPARED_FRESH_S - 1)
    else:
        plan = IcebergSinkCommitter(catalog).prepare(pc)

    before = seen[FAULT_LOADED]
    result = committer.commit(plan, now())

    assert seen[FAULT_LOADED] - before == 1
    assert snapshot_count(table) == 1
    assert committer.find_committed(pc, now()).tables == result


def test_a_fresh_plan_outrun_by_another_writer_conflicts_and_commits_once(
    catalog: SqlCatalog, catalog_url: str, warehouse: Path, sink_id: str, branch: str
) -> None:
    table = create_table(catalog, "t")
    table.append(rows(500, 1))
    if branch != "main":
        table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, branch).commit()
    other = SqlCatalog(catalog.name, uri=catalog_url, warehouse=f"file://{warehouse}")
    pc = simple_write(table, sink_id, count=3)
    committer, seen = _counting(catalog, branch=branch)

    plan = committer.prepare(pc)
    other.load_table("ns.t").append(rows(1000, 2), branch=branch)  # after prepare, within the freshness window
    committer.commit(plan, now())

    # The plan's table no longer showed the branch head: the append asserted the head it saw, lost,
    # and the retry loaded the table again.
    assert seen[FAULT_LOADED] == 2
    assert seen[BEFORE_UPDATE] == 2
    assert ids_in(table, branch) == [0, 1, 2, 500, 1000, 1001]
    other.engine.dispose()


def test_a_prepared_plan_committed_again_or_after_another_attempt_lands_once(
    catalog: SqlCatalog, sink_id: str, branch: str
) -> None:
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer, seen = _counting(catalog, branch=branch)
    since = now()

    plan = committer.prepare(pc)
    first = committer.commit(CommitPlan(pc), since)  # another attempt commits the write first
    # The plan's table predates that commit, so no marker shows there: the append asserts the old
    # head, conflicts, and the retry's fresh load finds the marker.
    assert committer.commit(plan, since) == first
    assert seen[BEFORE_UPDATE] == 2
    assert committer.commit(plan, since) == first  # and the same plan once more
    assert snapshot_count(table) == 1
    assert ids_in(table, branch) == list(range(5))


def test_a_revision_plan_carries_the_files_it_replaces(catalog: SqlCatalog, sink_id: str, branch: str) -> None:
    table = create_table(catalog, "t")
    first = simple_write(table, sink_id, epoch=3)
    committer, seen = _counting(catalog, branch=branch)
    since = now()
    committed = committer.commit(CommitPlan(first), since)
    replaced = ReplacedWrite(first.write_id, first, committed, None, 0, since)
    second = simple_write(table, sink_id, epoch=3, start=50)

    plan = committer.prepare(second, replaces=replaced)
    [prepared] = plan.prepared.values()
    assert isinstance(prepared, TablePlan)
    assert [f.file_path for f in prepared.to_replace] == [d.path for d in first.tables[0].data_files]
    loads = seen[FAULT_LOADED]
    committer.commit(plan, since)

    assert seen[FAULT_LOADED] == loads
    assert ids_in(table, branch) == list(range(50, 55))
    assert committer.find_committed(second, since).write_ids == {"ns.t": second.write_id}


def test_prepare_refuses_a_revision_whose_replaced_files_are_not_in_the_table(
    catalog: SqlCatalog, sink_id: str
) -> None:
    table = create_table(catalog, "t")
    never_committed = simple_write(table, sink_id, epoch=3)
    replaced = ReplacedWrite(never_committed.write_id, never_committed, {"ns.t": "1"}, None, 0, now())
    with pytest.raises(ReplacedFilesMissing, match="no longer in the table"):
        IcebergSinkCommitter(catalog).prepare(simple_write(table, sink_id, epoch=3, start=50), replaces=replaced)
    assert snapshot_count(table) == 0


def test_a_revision_older_than_the_horizon_is_refused_unless_allowed(catalog: SqlCatalog, sink_id: str) -> None:
    """The horizon rule of commits holds for revisions too: a revision persisted longer ago than the
    table keeps snapshots may have committed already, its marker expired since."""
    table = create_table(catalog, "t", properties={"history.expire.max-snapshot-age-ms": str(3_600_000)})
    first = simple_write(table, sink_id, epoch=3)
    committer = IcebergSinkCommitter(catalog, clock_skew=timedelta(0))
    committed = committer.commit(CommitPlan(first), now())
    replaced = ReplacedWrite(first.write_id, first, committed, None, 0, now())
    second = simple_write(table, sink_id, epoch=3, start=50)
    long_ago = now() - timedelta(hours=2)

    with pytest.raises(MarkerHorizonExceeded, match="allow_beyond_horizon"):
        committer.commit(CommitPlan(second, replaced), long_ago)
    assert snapshot_count(table) == 1 and ids_in(table, "main") == list(range(5))

    committer.commit(CommitPlan(second, replaced), long_ago, allow_beyond_horizon=True)
    assert snapshot_count(table) == 2 and ids_in(table, "main") == list(range(50, 55))


def test_a_revision_replaces_by_files_even_after_the_replaced_marker_expired(catalog: SqlCatalog, sink_id: str) -> None:
    """The replaced write is found by its data files, not by its marker: expiring the snapshot that
    committed it (a table with a short history) does not keep its rows from being replaced once."""
    table = create_table(catalog, "t")
    first = simple_write(table, sink_id, epoch=3)
    committer = IcebergSinkCommitter(catalog)
    committed = committer.commit(CommitPlan(first), now())
    other = simple_write(table, sink_id, epoch=4, start=20)
    committer.commit(CommitPlan(other), now())
    table = catalog.load_table("ns.t")
    marker_snapshot = int(committed["ns.t"])
    table.maintenance.expire_snapshots().by_id(marker_snapshot).commit()
    assert catalog.load_table("ns.t").snapshot_by_id(marker_snapshot) is None

    replaced = ReplacedWrite(first.write_id, first, committed, None, 0, now())
    second = simple_write(table, sink_id, epoch=3, start=50)
    committer.commit(committer.prepare(second, replaces=replaced), now())
    assert ids_in(catalog.load_table("ns.t"), "main") == [*range(20, 25), *range(50, 55)]


def test_a_fresh_prepared_plan_commits_to_its_audit_branch_without_loading_again(
    catalog: SqlCatalog, sink_id: str
) -> None:
    # Write, audit, publish (design.md D23): the audit commit opens its branch on the table the plan
    # loaded and commits through it, as a plain commit does; main is untouched.
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id)
    committer, seen = _counting(catalog)

    plan = committer.prepare(pc)
    result = committer.commit_audit(plan, now())

    assert seen[FAULT_LOADED] == 1
    branch = committer.audit_branch(pc)
    table = catalog.load_table("ns.t")
    assert ids_in(table, branch) == list(range(5)) and table.metadata.current_snapshot_id is None
    assert str(table.metadata.snapshot_by_name(branch).snapshot_id) == result["ns.t"]  # type: ignore[union-attr]
    assert committer.commit_audit(plan, now()) == result  # again: the marker on the branch, nothing added


def test_a_prepared_plan_outrun_on_main_opens_its_audit_branch_at_the_head_it_checked(
    catalog: SqlCatalog, catalog_url: str, warehouse: Path, sink_id: str
) -> None:
    table = create_table(catalog, "t")
    table.append(rows(500, 1))
    other = SqlCatalog(catalog.name, uri=catalog_url, warehouse=f"file://{warehouse}")
    pc = simple_write(table, sink_id, count=3)
    committer, seen = _counting(catalog)

    plan = committer.prepare(pc)
    other.load_table("ns.t").append(rows(1000, 2))  # after prepare, within the freshness window
    committer.commit_audit(plan, now())

    # The branch is made at the head the plan's table showed (the catalog applies a ref change to its
    # current metadata): the audit reads main as the plan checked it, plus the write; main is
    # untouched, and a publish adds the write on top of main as it is then.
    assert seen[FAULT_LOADED] == 1
    table = catalog.load_table("ns.t")
    assert ids_in(table, committer.audit_branch(pc)) == [0, 1, 2, 500]
    assert ids_in(table, "main") == [500, 1000, 1001]
    other.engine.dispose()
