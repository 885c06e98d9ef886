"""The store's batch transitions (recovery's commit of a backlog): a compare-and-swap per epoch, in one
transaction, with the same refusals as the single ``decide_commit`` and ``mark_committed`` (invariant 5);
and the reads of a commit's steps, which fetch an epoch's metadata only when the process lacks it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.store.store_helpers import another_process
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


def _pending(store: SqlSinkStateStore, sink_id: str, count: int) -> list[tuple[int, str]]:
    writes = []
    for n in range(count):
        pre = make_pre_commit(sink_id, EPOCH + n)
        store.insert_pending(pre, run_id="scheduled__1", try_number=1)
        writes.append((pre.epoch, pre.write_id))
    return writes


def _mark(epoch: int, write_id: str) -> CommitMark:
    return CommitMark(epoch, write_id, {"db.events": "42"}, {"db.events": "uuid-1"})


def test_decide_commits_decides_each_epoch_and_counts_an_earlier_decision(
    store: SqlSinkStateStore, sink_id: str
) -> None:
    writes = _pending(store, sink_id, 3)
    store.decide_commit(sink_id, writes[1][0], write_id=writes[1][1])

    assert list(store.decide_commits(sink_id, writes)) == [e for e, _ in writes]
    for epoch, write_id in writes:
        row = store.get(sink_id, epoch)
        assert row is not None and row.status is EpochStatus.PENDING and row.write_id == write_id
        assert row.commit_decided_at is not None


def test_decide_commits_stops_at_the_first_row_that_moved(store: SqlSinkStateStore, sink_id: str) -> None:
    writes = _pending(store, sink_id, 4)
    store.mark_aborted(sink_id, writes[2][0], write_id=writes[2][1], reason="checkpoint failed")
    stale = (writes[1][0], "00000000-0000-4000-8000-000000000000")  # another write holds epoch 1

    decided = store.decide_commits(sink_id, [writes[0], stale, writes[2], writes[3]])

    assert list(decided) == [writes[0][0]]
    later = [store.get(sink_id, epoch) for epoch, _ in writes[1:]]
    assert [row.commit_decided_at for row in later if row is not None] == [None, None, None]


def test_mark_committed_batch_marks_decided_rows_and_leaves_the_others(store: SqlSinkStateStore, sink_id: str) -> None:
    writes = _pending(store, sink_id, 3)
    store.decide_commits(sink_id, [writes[0], writes[2]])  # epoch 1 undecided: no commit of it may be marked

    marked = store.mark_committed_batch(sink_id, [_mark(*w) for w in writes])

    assert list(marked) == [writes[0][0], writes[2][0]]
    first, undecided, last = (store.get(sink_id, epoch) for epoch, _ in writes)
    assert first is not None and first.status is EpochStatus.COMMITTED
    assert first.committed == {"db.events": "42"} and first.table_uuids == {"db.events": "uuid-1"}
    assert undecided is not None and undecided.status is EpochStatus.PENDING
    assert last is not None and last.status is EpochStatus.COMMITTED
    assert list(store.mark_committed_batch(sink_id, [_mark(*writes[0])])) == []  # no second transition


def test_mark_committed_batch_leaves_a_revision_to_its_own_commit(store: SqlSinkStateStore, sink_id: str) -> None:
    """A revision's commit also records the revision it replaces, which only ``mark_committed`` does."""
    ((epoch, write_id),) = _pending(store, sink_id, 1)
    store.decide_commit(sink_id, epoch, write_id=write_id)
    store.mark_committed(sink_id, epoch, write_id=write_id, committed={"db.events": "41"})
    newer = make_pre_commit(sink_id, epoch)
    store.revisions.open_revision(newer, expected_write_id=write_id, run_id="r", try_number=1)
    store.decide_commit(sink_id, epoch, write_id=newer.write_id)

    assert list(store.mark_committed_batch(sink_id, [_mark(epoch, newer.write_id)])) == []
    row = store.get(sink_id, epoch)
    assert row is not None and row.status is EpochStatus.PENDING and row.replaces is not None


def _selected_metadata(store: SqlSinkStateStore, action: Callable[[], object]) -> bool:
    """Whether ``action`` made the store select the metadata column itself (not only its size)."""
    statements: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", before)
    try:
        action()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", before)
    column = re.compile(r"epoch_metadata\.metadata(?![_\w])")  # the text, not its size
    return any(s.lstrip().upper().startswith("SELECT") and column.search(s) for s in statements)


@pytest.mark.parametrize("writer", ["task-0", "tâche-0"])
def test_a_write_this_process_stored_is_read_back_without_its_metadata(
    store: SqlSinkStateStore, sink_id: str, writer: str
) -> None:
    """Megabytes of metadata are fetched again only when the process has not parsed them; the size in
    bytes names them, also for text that is not ASCII."""
    pre = make_pre_commit(sink_id, EPOCH)
    files = [f.model_copy(update={"writer": writer}) for f in pre.tables[0].data_files]
    pre = pre.model_copy(update={"tables": [pre.tables[0].model_copy(update={"data_files": DataFiles(files)})]})
    store.insert_pending(pre, run_id="scheduled__1", try_number=1)

    assert not _selected_metadata(store, lambda: store.get(sink_id, EPOCH))
    assert not _selected_metadata(store, lambda: store.decide_commit(sink_id, EPOCH, write_id=pre.write_id))
    row = store.get(sink_id, EPOCH)
    assert row is not None and row.pre_commit is pre


def test_a_write_this_process_never_parsed_is_read_whole(store: SqlSinkStateStore, meta_url: str, sink_id: str) -> None:
    pre = make_pre_commit(sink_id, EPOCH)
    store.insert_pending(pre, run_id="scheduled__1", try_number=1)

    with another_process(meta_url) as committing:  # the commit task after the persist task
        assert _selected_metadata(committing, lambda: committing.get(sink_id, EPOCH))
        assert not _selected_metadata(committing, lambda: committing.get(sink_id, EPOCH))  # parsed once
        row = committing.get(sink_id, EPOCH)
    assert row is not None and row.pre_commit == pre and row.pre_commit is not pre
