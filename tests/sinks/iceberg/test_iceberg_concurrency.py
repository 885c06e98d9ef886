"""Racing writers, lost responses and pyiceberg's own retry loop, on real catalogs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException

from airflow_provider_exactly_once.core.errors import CommitConflictExhausted, CommitOutcomeUnknown
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.markers import WRITE_ID_KEY

from .iceberg_helpers import create_table, ids_in, local_path, now, rows, simple_write, snapshot_count


class _Faults:
    """Counts fault points and runs an action at a chosen one."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.actions: dict[str, Callable[[int], None]] = {}

    def __call__(self, point: str) -> None:
        self.seen[point] += 1
        action = self.actions.get(point)
        if action is not None:
            action(self.seen[point])


@pytest.mark.parametrize("pyiceberg_retries", [None, "25"])
def test_concurrent_append_makes_our_loop_retry_once(
    catalog: SqlCatalog,
    catalog_url: str,
    warehouse: Path,
    sink_id: str,
    pyiceberg_retries: str | None,
    branch: str,
) -> None:
    properties = {"commit.retry.num-retries": pyiceberg_retries} if pyiceberg_retries else {}
    table = create_table(catalog, "t", properties=properties)
    table.append(rows(500, 1))  # the branch exists before the race, so the other writer can append to it
    if branch != "main":
        table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, branch).commit()
    other = SqlCatalog(catalog.name, uri=catalog_url, warehouse=f"file://{warehouse}")
    pc = simple_write(table, sink_id, count=3)
    faults = _Faults()

    def other_writer_appends(n: int) -> None:
        if n == 1:  # only between our first load and our first catalog update
            other.load_table("ns.t").append(rows(1000, 2), branch=branch)

    faults.actions["iceberg.before_catalog_update"] = other_writer_appends
    committer = IcebergSinkCommitter(catalog, fault=faults, backoff_initial_s=0.001, backoff_max_s=0.01, branch=branch)

    result = committer.commit(CommitPlan(pc), now())

    # The conflict came back to our loop (not pyiceberg's rebase): a second fresh load, marker re-checked.
    assert faults.seen["iceberg.loaded"] == 2
    assert faults.seen["iceberg.before_catalog_update"] == 2
    assert faults.seen["iceberg.after_catalog_update"] == 1
    table = table.refresh()
    assert len(table.metadata.snapshots) == 3
    ours = [s for s in table.metadata.snapshots if s.summary is not None and s.summary.get(WRITE_ID_KEY) == pc.write_id]
    assert [str(s.snapshot_id) for s in ours] == [result["ns.t"]]
    assert ids_in(table, branch) == [0, 1, 2, 500, 1000, 1001]
    assert committer.commit(CommitPlan(pc), now()) == result  # the retry after it finds the marker on the branch
    assert len(table.refresh().metadata.snapshots) == 3
    other.engine.dispose()


def test_failed_attempt_leaves_no_manifests(
    catalog: SqlCatalog, catalog_url: str, warehouse: Path, sink_id: str
) -> None:
    table = create_table(catalog, "t")
    other = SqlCatalog(catalog.name, uri=catalog_url, warehouse=f"file://{warehouse}")
    pc = simple_write(table, sink_id, count=3)
    faults = _Faults()
    faults.actions["iceberg.before_catalog_update"] = lambda n: other.load_table("ns.t").append(rows(1000, 1))

    committer = IcebergSinkCommitter(catalog, fault=faults, max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.01)
    with pytest.raises(CommitConflictExhausted, match="3 commit attempts"):
        committer.commit(CommitPlan(pc), now())

    assert faults.seen["iceberg.loaded"] == 3
    table = table.refresh()
    assert all(
        s.summary is None or WRITE_ID_KEY not in s.summary.additional_properties for s in table.metadata.snapshots
    )
    # Every manifest and manifest list under metadata/ belongs to a snapshot the table has.
    referenced: set[str] = set()
    for snapshot in table.metadata.snapshots:
        referenced.add(str(local_path(snapshot.manifest_list)))
        referenced.update(str(local_path(m.manifest_path)) for m in snapshot.manifests(table.io))
    avro = {str(p) for p in (local_path(table.location()) / "metadata").rglob("*.avro")}
    assert len(table.metadata.snapshots) == 3  # the other writer won all three races
    assert len(referenced) == 6  # its manifest lists and manifests, and nothing of ours
    assert avro == referenced
    # Our data files are untouched: a refused commit is retried later, not cleaned up.
    assert all(local_path(d.path).exists() for d in pc.tables[0].data_files)
    other.engine.dispose()


def test_lost_response_is_an_unknown_outcome_and_the_next_attempt_finds_the_marker(
    catalog: SqlCatalog, sink_id: str, branch: str
) -> None:
    """A commit that lands while its response is lost.

    This simulates a network fault between pyiceberg and a remote catalog, which cannot be produced
    locally: the SQL catalog's ``commit_table`` is wrapped so that it commits and then raises.
    """
    table = create_table(catalog, "t")
    pc = simple_write(table, sink_id, files=2)
    real_commit_table = catalog.commit_table
    calls: list[int] = []

    def commit_then_lose_the_response(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        real_commit_table(*args, **kwargs)
        raise CommitStateUnknownException("connection reset after the request was sent")

    catalog.commit_table = commit_then_lose_the_response  # type: ignore[method-assign]
    committer = IcebergSinkCommitter(catalog, branch=branch)
    since = now()
    files_before = {p for p in Path(local_path(table.location())).rglob("*") if p.is_file()}

    with pytest.raises(CommitOutcomeUnknown, match="unknown outcome") as caught:
        committer.commit(CommitPlan(pc), since)
    assert caught.value.retryable
    assert len(calls) == 1  # neither pyiceberg nor we retried an unknown outcome
    files_after = {p for p in Path(local_path(table.location())).rglob("*") if p.is_file()}
    assert files_before <= files_after  # nothing was deleted

    catalog.commit_table = real_commit_table  # type: ignore[method-assign]
    result = committer.commit(CommitPlan(pc), since)
    assert snapshot_count(table) == 1
    assert result == {"ns.t": str(table.refresh().metadata.snapshots[0].snapshot_id)}
    assert ids_in(table, branch) == list(range(10))
