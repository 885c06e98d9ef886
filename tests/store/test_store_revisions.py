"""Revisions of an epoch in the meta store: opened from Committed, committed or aborted, kept on record."""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000
G1 = "2024-06-01T01:00:00.000000Z/0000000000"
G2 = "2024-06-02T09:30:00.000000Z/0000000001"


def _write(sink_id: str, generation: str | None) -> PreCommit:
    return make_pre_commit(sink_id, EPOCH).model_copy(update={"generation": generation})


def _committed(store: SqlSinkStateStore, sink_id: str) -> PreCommit:
    first = _write(sink_id, G1)
    store.insert_pending(first, run_id="scheduled__1", try_number=1, dag_id="d")
    store.mark_committed(sink_id, EPOCH, write_id=first.write_id, committed={"db.events": "101"})
    return first


def test_a_revision_keeps_the_committed_write_until_it_commits(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second = _write(sink_id, G2)
    opened = store.revisions.open_revision(
        second, expected_write_id=first.write_id, run_id="scheduled__1", try_number=3, dag_id="d"
    )
    assert (opened.status, opened.write_id, opened.revision) == (EpochStatus.PENDING, second.write_id, 1)
    assert opened.replaces is not None and opened.replaces.write_id == first.write_id
    assert opened.replaces.committed == {"db.events": "101"} and opened.replaces.pre_commit == first
    assert [(r.revision, r.status) for r in store.revisions.revisions(sink_id, EPOCH)] == [
        (0, "Committed"),
        (1, "Pending"),
    ]

    done = store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "202"})
    assert (done.status, done.write_id, done.revision, done.replaces) == (
        EpochStatus.COMMITTED,
        second.write_id,
        1,
        None,
    )
    history = store.revisions.revisions(sink_id, EPOCH)
    assert [(r.revision, r.write_id, r.status) for r in history] == [
        (0, first.write_id, "Replaced"),
        (1, second.write_id, "Committed"),
    ]
    assert history[1].generation == G2 and history[1].committed == {"db.events": "202"} and history[1].try_number == 3
    [cleanup] = store.cleanups(sink_id, EPOCH)
    assert cleanup.write_id == first.write_id and cleanup.removed_by == {"db.events": "202"}


def test_an_aborted_revision_restores_the_committed_write(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second = _write(sink_id, G2)
    store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=1)
    with pytest.raises(StateConflict, match="abort_revision"):
        store.mark_aborted(sink_id, EPOCH, write_id=second.write_id, reason="not like this")
    restored = store.revisions.abort_revision(sink_id, EPOCH, write_id=second.write_id, reason="checkpoint FAILED")
    assert (restored.status, restored.write_id, restored.revision, restored.replaces) == (
        EpochStatus.COMMITTED,
        first.write_id,
        0,
        None,
    )
    assert restored.committed == {"db.events": "101"} and restored.pre_commit == first
    assert "checkpoint FAILED" in (restored.warning or "")
    assert [(r.write_id, r.status) for r in store.revisions.revisions(sink_id, EPOCH)] == [
        (first.write_id, "Committed"),
        (second.write_id, "Aborted"),
    ]
    [cleanup] = store.cleanups(sink_id, EPOCH)
    assert cleanup.write_id == second.write_id and cleanup.removed_by is None
    assert store.write_discarded(sink_id, EPOCH, second.write_id)


def test_revision_transitions_are_compare_and_swap(store: SqlSinkStateStore, sink_id: str) -> None:
    first = _committed(store, sink_id)
    second, third = _write(sink_id, G2), _write(sink_id, G2)
    store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=1)
    with pytest.raises(StateConflict, match="open a revision"):  # a racing persist saw the same Committed row
        store.revisions.open_revision(third, expected_write_id=first.write_id, run_id="r", try_number=1)
    store.decide_commit(sink_id, EPOCH, write_id=second.write_id)
    with pytest.raises(StateConflict, match="while no commit is decided"):
        store.revisions.abort_revision(sink_id, EPOCH, write_id=second.write_id, reason="late")
    # a retry inside the revision replaces its write and keeps what it replaces
    other = store.get(sink_id, EPOCH)
    assert other is not None and other.replaces is not None and other.replaces.write_id == first.write_id
