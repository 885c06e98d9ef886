"""A branch that does not exist yet, a partition spec that changed after the write: every epoch ends
committed exactly once on the configured branch, or is refused before its commit is decided, with one
message saying what to do, and can still be aborted.

The table is judged by DuckDB's Iceberg reader (``tests.support.independent_reader``), not by the
pyiceberg that committed it.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import CommitRefused, InvalidPreCommit
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from tests.support.independent_reader import read_branch
from tests.support.pipeline import Pipeline, expected_rows, write_location_exists

COMPLETED = CheckpointStatus.COMPLETED


def _table(pipeline: Pipeline, name: str) -> Table:
    return pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")


def _visible(pipeline: Pipeline, name: str, branch: str) -> list[tuple[Any, ...]]:
    """(id, epoch, write_id) of every row the head of ``branch`` shows, as DuckDB reads it."""
    return read_branch(_table(pipeline, name), branch, "id, epoch, write_id")


def _only_on(pipeline: Pipeline, name: str, branch: str) -> None:
    """A commit to a named branch leaves main as it was: absent on a table created empty."""
    if branch != "main":
        assert "main" not in _table(pipeline, name).metadata.refs


def _add_epoch_partition(pipeline: Pipeline, name: str) -> None:
    with _table(pipeline, name).update_spec() as update:
        update.add_field("epoch", IdentityTransform(), "sink")


def test_the_first_commit_to_a_branch_of_a_table_without_snapshots_creates_it(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    first = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)
    coordinator.persist(first)
    pipeline.checkpoint(sink_id, 1, COMPLETED)

    result = coordinator.commit(sink_id, 1)

    assert result.outcome is CommitOutcome.COMMITTED
    name = f"{pipeline.namespace}.orders"
    head = _table(pipeline, "orders").metadata.refs[branch].snapshot_id
    assert result.record.committed == {name: str(head)}
    walk = pipeline.iceberg_committer(branch=branch).find_committed(first, result.record.created_at)
    assert walk.tables == {name: str(head)}  # what a retry after a crash would find on the branch
    assert _visible(pipeline, "orders", branch) == expected_rows([first], name)
    _only_on(pipeline, "orders", branch)

    # A retry from a fresh process, and the next epoch on top: the walk reads the branch it appends to.
    fresh = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    assert fresh.commit(sink_id, 1).outcome is CommitOutcome.ALREADY_COMMITTED
    second = pipeline.write_iceberg(sink_id, 2, ["orders"], rows=3)
    fresh.persist(second)
    pipeline.checkpoint(sink_id, 2, COMPLETED)
    assert fresh.commit(sink_id, 2).outcome is CommitOutcome.COMMITTED
    assert pipeline.marker_snapshots("orders", sink_id) == {1: [first.write_id], 2: [second.write_id]}
    assert _visible(pipeline, "orders", branch) == expected_rows([first, second], name)
    _only_on(pipeline, "orders", branch)


def test_a_commit_decided_on_a_new_table_is_finished_by_recovery_on_the_branch(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    """The row as the issue found it: decided, on a table with no snapshots; recovery commits it once."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = pipeline.write_iceberg(sink_id, 5, ["orders"], rows=3)
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 5, COMPLETED)
    pipeline.store.decide_commit(sink_id, 5, write_id=pre.write_id)

    report = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch)).recover(sink_id)

    assert report.committed == [5] and report.ok, report.failed
    assert pipeline.store.get(sink_id, 5).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    assert pipeline.marker_snapshots("orders", sink_id) == {5: [pre.write_id]}
    assert _visible(pipeline, "orders", branch) == expected_rows([pre], f"{pipeline.namespace}.orders")


def test_a_tag_where_the_branch_should_be_is_refused_before_the_decision(pipeline: Pipeline, sink_id: str) -> None:
    """Named branch only: on ``main`` a table with snapshots always has the branch."""
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch="audit"))
    pre = pipeline.write_iceberg(sink_id, 3, ["orders"], rows=3)
    coordinator.persist(pre)
    other = pipeline.write_iceberg("another-sink", 9, ["orders"], rows=1)
    IcebergSinkCommitter(pipeline.catalog).commit(CommitPlan(other), pipeline.store.now())  # main gets a snapshot
    table = _table(pipeline, "orders")
    table.manage_snapshots().create_tag(table.metadata.current_snapshot_id, "audit").commit()
    pipeline.checkpoint(sink_id, 3, COMPLETED)

    with pytest.raises(CommitRefused, match=r"epoch 3 .*'audit' is a tag, not a branch") as caught:
        coordinator.commit(sink_id, 3)

    assert not caught.value.retryable
    row = pipeline.store.get(sink_id, 3)
    assert row is not None and row.commit_decided_at is None and row.status is EpochStatus.PENDING
    assert pipeline.marker_snapshots("orders", sink_id) == {}
    aborted = coordinator.abort(sink_id, 3, reason="branch is a tag", force=True)
    assert aborted.outcome is AbortOutcome.ABORTED and not write_location_exists(pre)


def test_a_spec_change_between_the_write_and_the_commit_files_the_write_under_its_spec(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    before = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2)  # unpartitioned, spec 0
    coordinator.persist(before)
    _add_epoch_partition(pipeline, "orders")
    pipeline.checkpoint(sink_id, 1, COMPLETED)

    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.COMMITTED

    after = pipeline.write_iceberg(sink_id, 2, ["orders"], rows=3)  # partitioned by the new spec 1
    assert after.tables[0].spec_id == 1 and after.tables[0].data_files[0].partition == {"sink": 2}
    coordinator.persist(after)
    pipeline.checkpoint(sink_id, 2, COMPLETED)
    assert coordinator.commit(sink_id, 2).outcome is CommitOutcome.COMMITTED
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.ALREADY_COMMITTED

    name = f"{pipeline.namespace}.orders"
    assert _visible(pipeline, "orders", branch) == expected_rows([before, after], name)
    assert pipeline.marker_snapshots("orders", sink_id) == {1: [before.write_id], 2: [after.write_id]}
    table = _table(pipeline, "orders")
    head = table.metadata.refs[branch].snapshot_id
    specs = {task.file.file_path: task.file.spec_id for task in table.scan(snapshot_id=head).plan_files()}
    assert specs == {
        **{f.path: 0 for f in before.tables[0].data_files},
        **{f.path: 1 for f in after.tables[0].data_files},
    }
    # Each file keeps its spec's partition (and its statistics): a filter on the epoch plans epoch 2's only.
    pruned = table.scan(snapshot_id=head, row_filter="epoch == 2").plan_files()
    assert {task.file.file_path for task in pruned} == {f.path for f in after.tables[0].data_files}
    _only_on(pipeline, "orders", branch)


def _without_spec(pre: PreCommit) -> PreCommit:
    """The same write as metadata from before the spec id was recorded."""
    return pre.model_copy(update={"tables": [t.model_copy(update={"spec_id": None}) for t in pre.tables]})


def _one_message(message: str, pipeline: Pipeline, pre: PreCommit, wrong: str) -> None:
    """Whose epoch, which table, what is wrong, what to do: all in the one message."""
    assert message.startswith(f"{pre.describe()}: "), message
    assert f"'{pipeline.namespace}.orders'" in message
    assert re.search(wrong, message), message
    assert message.endswith("abort the epoch (with force=True once its checkpoint completed) and write it again")


def test_a_write_without_a_spec_after_a_spec_change_is_refused_before_the_decision_and_abortable(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    pre = _without_spec(pipeline.write_iceberg(sink_id, 4, ["orders"], rows=3))
    coordinator.persist(pre)  # the table has spec 0 only: the default spec is the write's
    _add_epoch_partition(pipeline, "orders")
    pipeline.checkpoint(sink_id, 4, COMPLETED)

    with pytest.raises(InvalidPreCommit) as caught:
        coordinator.commit(sink_id, 4)

    message = str(caught.value)
    _one_message(
        message, pipeline, pre, r"partition keys \[\], but partition spec 1 has \['sink'\] \(the write records no"
    )
    report = coordinator.recover(sink_id)  # recovery says the same, and decides nothing either
    assert report.failed == {4: f"InvalidPreCommit: {message}"}
    row = pipeline.store.get(sink_id, 4)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
    assert row.error == f"InvalidPreCommit: {message}"
    aborted = coordinator.abort(sink_id, 4, reason="spec changed since the write", force=True)
    assert aborted.outcome is AbortOutcome.ABORTED and not write_location_exists(pre)
    assert _visible(pipeline, "orders", branch) == [] and pipeline.marker_snapshots("orders", sink_id) == {}


def test_a_write_for_a_spec_the_table_does_not_have_is_refused_before_it_is_persisted(
    pipeline: Pipeline, sink_id: str, branch: str
) -> None:
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    written = pipeline.write_iceberg(sink_id, 6, ["orders"], rows=3)
    pre = written.model_copy(update={"tables": [written.tables[0].model_copy(update={"spec_id": 7})]})

    with pytest.raises(InvalidPreCommit) as caught:
        coordinator.persist(pre)

    _one_message(str(caught.value), pipeline, pre, r"has no partition spec 7 \(it has \[0\]\)")
    assert pipeline.store.get(sink_id, 6) is None
    aborted = coordinator.abort(sink_id, 6, reason="write refused", write=pre)
    assert aborted.outcome is AbortOutcome.NOT_PERSISTED and not write_location_exists(pre)
    assert _visible(pipeline, "orders", branch) == []


def test_identities_follow_a_table_dropped_and_recreated_under_the_same_name(pipeline: Pipeline, sink_id: str) -> None:
    table = pipeline.create_table("orders")
    name = f"{pipeline.namespace}.orders"
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"])
    committer = pipeline.iceberg_committer()
    assert IcebergSinkCommitter(pipeline.catalog).identities(pre) == {name: str(table.metadata.table_uuid)}
    committer.prepare(pre)
    assert committer.identities(pre) == {name: str(table.metadata.table_uuid)}

    pipeline.catalog.drop_table(name)
    recreated = pipeline.create_table("orders")
    assert recreated.metadata.table_uuid != table.metadata.table_uuid
    assert committer.identities(pre) == {name: str(table.metadata.table_uuid)}  # no I/O: as last seen
    committer.prepare(pre)
    assert committer.identities(pre) == {name: str(recreated.metadata.table_uuid)}
    assert uuid.UUID(committer.identities(pre)[name]) == recreated.metadata.table_uuid
