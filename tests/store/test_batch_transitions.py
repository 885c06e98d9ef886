"""``decide_commits`` counts an earlier decision only for the write it was asked about: a decided
row of another write is a row that moved, never a decision of this one (invariant 5)."""

from __future__ import annotations

from airflow_provider_exactly_once.core.epochs import EpochEvent
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


def test_a_decided_row_of_another_write_is_not_decided_for_this_one(store: SqlSinkStateStore, sink_id: str) -> None:
    held = make_pre_commit(sink_id, EPOCH)
    store.insert_pending(held, run_id="scheduled__1", try_number=1)
    store.decide_commit(sink_id, EPOCH, write_id=held.write_id)
    before = store.get(sink_id, EPOCH)
    other = make_pre_commit(sink_id, EPOCH)
    assert other.write_id != held.write_id

    assert list(store.decide_commits(sink_id, [(EPOCH, other.write_id)])) == []

    after = store.get(sink_id, EPOCH)
    assert before is not None and after is not None
    assert (after.write_id, after.commit_decided_at) == (held.write_id, before.commit_decided_at)


def test_a_batch_decision_of_a_row_already_decided_appends_no_second_commit_decided_event(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    """Planted bug "a batch appends 'commit decided' for a row already decided" (history noise):
    recovery's batch counts an earlier decision of the same write as its own, and the epoch's
    history keeps the one event of the decision taken, whether singly or by an earlier batch; the
    batch mark then appends its one COMMITTED event."""
    singly, batched = make_pre_commit(sink_id, EPOCH), make_pre_commit(sink_id, EPOCH + 1)
    for pre in (singly, batched):
        store.insert_pending(pre, run_id="scheduled__1", try_number=1)
    store.decide_commit(sink_id, EPOCH, write_id=singly.write_id)
    assert list(store.decide_commits(sink_id, [(EPOCH + 1, batched.write_id)])) == [EPOCH + 1]
    writes = [(pre.epoch, pre.write_id) for pre in (singly, batched)]
    decided_at = [store.get(sink_id, pre.epoch).commit_decided_at for pre in (singly, batched)]  # type: ignore[union-attr]

    assert list(store.decide_commits(sink_id, writes)) == [EPOCH, EPOCH + 1]
    assert [store.get(sink_id, pre.epoch).commit_decided_at for pre in (singly, batched)] == decided_at  # type: ignore[union-attr]
    marks = [CommitMark(pre.epoch, pre.write_id, {"db.events": "1"}, {}) for pre in (singly, batched)]
    assert list(store.mark_committed_batch(sink_id, marks)) == [EPOCH, EPOCH + 1]

    for pre in (singly, batched):
        history = [(e.event, e.write_id) for e in store.history.events(sink_id, pre.epoch)]
        assert history == [
            (EpochEvent.PERSISTED, pre.write_id),
            (EpochEvent.COMMIT_DECIDED, pre.write_id),
            (EpochEvent.COMMITTED, pre.write_id),
        ]
