"""Recovery's transitions of many epochs of a sink in one transaction (``core/backlog.py``, design.md D15).

Each epoch still changes by its own compare-and-swap, with the refusals of the single
``decide_commit`` and ``mark_committed`` (``sql.py``); only the transaction is shared, so that a backlog
of a hundred epochs waits for the disk twice instead of two hundred times.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_exactly_once.core.history import EpochEvent
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_write_id
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import cas, epoch_history, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import PendingSinkState, db_now


class SqlBatchTransitions:
    """The batch transitions of ``SqlSinkStateStore``, which sets ``_db``."""

    _db: MetaStoreDatabase

    def decide_commits(self, sink_id: str, writes: Sequence[tuple[int, str]]) -> Sequence[int]:
        decided: list[int] = []
        action = f"deciding the commits of {len(writes)} epochs of sink {sink_id!r}"
        statement = cas.guarded(EpochStatus.PENDING, undecided=True).values(
            commit_decided_at=db_now(), updated_at=db_now()
        )
        with self._db.transaction(action, write=True) as session:
            for epoch, write_id in writes:
                epoch, write_id = check_epoch(epoch), check_write_id(write_id)
                if rows.rowcount(session, statement, cas.key(sink_id, epoch, write_id)) != 1:
                    row = rows.load(session, sink_id, epoch)
                    if row is None or (row.status, row.write_id) != (EpochStatus.PENDING, write_id):
                        break
                    if row.commit_decided_at is None:
                        break  # as decide_commit, a decision already taken for this write counts
                else:
                    epoch_history.record(
                        session, sink_id, epoch, EpochEvent.COMMIT_DECIDED, write_id, status=EpochStatus.PENDING.value
                    )
                decided.append(epoch)
        return decided

    def mark_committed_batch(self, sink_id: str, marks: Sequence[CommitMark]) -> Sequence[int]:
        marked: list[int] = []
        with self._db.transaction(f"marking {len(marks)} epochs of sink {sink_id!r} committed", write=True) as session:
            for mark in marks:
                epoch, write_id = check_epoch(mark.epoch), check_write_id(mark.write_id)
                statement = (
                    cas.guarded(EpochStatus.PENDING, decided=True)
                    .where(PendingSinkState.replaces.is_(None))  # a revision's commit also records the revision
                    .values(
                        status=EpochStatus.COMMITTED.value,
                        committed=rows.committed_json(mark.committed, sink_id, epoch),
                        table_uuids=rows.identities_json(mark.identities, sink_id, epoch),
                        error=None,
                        updated_at=db_now(),
                    )
                )
                if rows.rowcount(session, statement, cas.key(sink_id, epoch, write_id)) == 1:
                    epoch_history.record(
                        session, sink_id, epoch, EpochEvent.COMMITTED, write_id, status=EpochStatus.COMMITTED.value
                    )
                    marked.append(epoch)
        return marked
