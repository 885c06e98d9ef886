"""``decide_commits`` counts an earlier decision only for the write it was asked about: a decided
row of another write is a row that moved, never a decision of this one (invariant 5)."""

from __future__ import annotations

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
