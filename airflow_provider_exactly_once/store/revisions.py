"""Revisions of an epoch: a newer generation's write replacing the committed one (invariant 1).

The epoch's row carries the revision in flight: ``Committed -> Pending`` with the committed write
kept in ``replaces`` (``open_revision``), then either the revision's commit (``mark_committed``
clears ``replaces`` and queues the replaced write's files, ``removed_by`` the new snapshots) or its
abort (``abort_revision``: the replaced write becomes the epoch's again, Committed as it was).
``epoch_revision`` is the record operators read: one row per write that was committed or aborted as a
revision, written in the same transaction as the transition.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, Update, bindparam, insert, select, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.history import EpochEvent
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_write_id
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import arguments, cas, epoch_history, metadata_copies, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import EpochRevision, PendingSinkState, db_now

#: ``epoch_revision.status`` of a committed write a newer revision made invisible.
REPLACED = "Replaced"


@dataclass(frozen=True)
class RevisionRecord:
    """One revision of an epoch as operators see it: its write, who wrote it, what became of it."""

    sink_id: str
    epoch: int
    revision: int
    write_id: str
    generation: str | None
    #: ``Committed`` (visible now), ``Replaced``, ``Aborted``, or ``Pending`` (the revision in flight).
    status: str
    run_id: str | None
    try_number: int | None
    dag_id: str | None
    rows: int
    files: int
    committed: Mapping[str, str] | None
    reason: str | None
    created_at: datetime
    updated_at: datetime


class SqlRevisions:
    """The store's ``revisions`` companion: opening, aborting and listing revisions of an epoch."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlRevisions({self._db.url_for_display!r})"

    def open_revision(
        self,
        pre_commit: PreCommit,
        *,
        expected_write_id: str,
        run_id: str | None,
        try_number: int | None,
        dag_id: str | None = None,
    ) -> EpochRecord:
        """``Committed -> Pending``: ``pre_commit`` becomes revision n+1, the committed write stays visible.

        ``created_at`` starts afresh: the revision's marker can only be in snapshots younger than it.
        """
        pre_commit = PreCommit.parse(pre_commit)
        expected_write_id = check_write_id(expected_write_id)
        arguments.check_run(run_id, try_number)
        dag_id = arguments.dag_id(dag_id)
        sink_id, epoch = pre_commit.sink_id, pre_commit.epoch
        wanted = f"open a revision of Committed write {expected_write_id} with write {pre_commit.write_id}"
        if pre_commit.write_id == expected_write_id:
            raise StateConflict(f"sink {sink_id!r} epoch {epoch}: cannot {wanted}: it needs a new write id")
        with self._db.transaction(f"opening a revision of sink {sink_id!r} epoch {epoch}", write=True) as session:
            replaced = rows.load(session, sink_id, epoch, for_update=True)
            if (
                replaced is None
                or replaced.status is not EpochStatus.COMMITTED
                or replaced.write_id != expected_write_id
            ):
                raise cas.conflict(replaced, sink_id, epoch, wanted)
            now = db_now()
            cas.swap(
                session,
                cas.guarded(EpochStatus.COMMITTED).values(
                    **rows.new_write_values(pre_commit, run_id=run_id, try_number=try_number, dag_id=dag_id, now=now),
                    revision=replaced.revision + 1,
                    replaces=rows.replaces_json(replaced),
                ),
                cas.key(sink_id, epoch, expected_write_id),
                wanted,
            )
            metadata_copies.keep_replaced(session, sink_id, epoch, expected_write_id)
            rows.replace_metadata(session, pre_commit, replaced_write_id=expected_write_id)
            _record(session, replaced, EpochStatus.COMMITTED.value, replaced.committed, None)
            epoch_history.record(
                session,
                sink_id,
                epoch,
                EpochEvent.REVISION_OPENED,
                pre_commit.write_id,
                status=EpochStatus.PENDING.value,
                revision=replaced.revision + 1,
                reason=f"replaces Committed write {expected_write_id}",
                run=(dag_id, run_id, try_number),
            )
            return cas.reloaded(session, sink_id, epoch)

    def abort_revision(
        self, sink_id: str, epoch: int, *, write_id: str, reason: str, decided: bool = False
    ) -> EpochRecord:
        """A Pending revision given up: the write it replaces is the epoch's again, Committed as it was.

        Before its commit decision, or (``decided``) after it when its files are lost, as for
        ``mark_aborted``; the revision's write is queued for clean-up in the same transaction.
        """
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        reason = arguments.text(reason, "abort reason")
        wanted = f"abort Pending revision write {write_id} " + (
            "whose commit is decided" if decided else "while no commit is decided"
        )
        with self._db.transaction(f"aborting a revision of sink {sink_id!r} epoch {epoch}", write=True) as session:
            revision = rows.load(session, sink_id, epoch, for_update=True)
            replaced = None if revision is None else revision.kind.replaces
            if revision is None or replaced is None:
                raise cas.conflict(revision, sink_id, epoch, wanted)
            now = db_now()
            cas.swap(
                session,
                cas.guarded(EpochStatus.PENDING, undecided=not decided, decided=decided).values(
                    status=EpochStatus.COMMITTED.value,
                    write_id=replaced.write_id,
                    committed=rows.committed_json(replaced.committed, sink_id, epoch),
                    table_uuids=rows.identities_json(replaced.table_uuids or {}, sink_id, epoch),
                    revision=replaced.revision,
                    replaces=None,
                    error=None,
                    warning=f"revision {revision.revision} (write {write_id}) aborted: {reason}",
                    updated_at=now,
                ),
                cas.key(sink_id, epoch, write_id),
                wanted,
            )
            metadata_copies.queue_cleanup(session, sink_id, epoch, write_id, reason=f"revision aborted: {reason}")
            metadata_copies.restore_replaced(session, sink_id, epoch, revision_write_id=write_id)
            _record(session, revision, EpochStatus.ABORTED.value, None, reason)
            epoch_history.record(
                session,
                sink_id,
                epoch,
                EpochEvent.REVISION_GIVEN_UP,
                write_id,
                status=EpochStatus.COMMITTED.value,
                revision=revision.revision,
                reason=reason,
            )
            return cas.reloaded(session, sink_id, epoch)

    def was_replaced(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether a revision's commit replaced this write (``commit_revision`` recorded it)."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
            status = session.scalar(
                select(EpochRevision.status).where(
                    EpochRevision.sink_id == sink_id, EpochRevision.epoch == epoch, EpochRevision.write_id == write_id
                )
            )
        return status == REPLACED

    def revisions(self, sink_id: str, epoch: int) -> Sequence[RevisionRecord]:
        """Every recorded revision of the epoch, oldest first; the one in flight is read from its row."""
        epoch = check_epoch(epoch)
        with self._db.transaction(f"reading the revisions of sink {sink_id!r} epoch {epoch}", write=False) as session:
            found = session.scalars(
                select(EpochRevision)
                .where(EpochRevision.sink_id == sink_id, EpochRevision.epoch == epoch)
                .order_by(EpochRevision.revision, EpochRevision.created_at)
            ).all()
            listed = [_revision(r) for r in found]
            pending = rows.load(session, sink_id, epoch)
        if pending is not None and pending.kind.revises:
            listed.append(
                RevisionRecord(
                    sink_id=sink_id,
                    epoch=epoch,
                    revision=pending.revision,
                    write_id=pending.write_id,
                    generation=pending.pre_commit.generation,
                    status=EpochStatus.PENDING.value,
                    run_id=pending.run_id,
                    try_number=pending.try_number,
                    dag_id=pending.dag_id,
                    rows=pending.pre_commit.record_count,
                    files=sum(len(t.data_files) for t in pending.pre_commit.tables),
                    committed=None,
                    reason=pending.error,
                    created_at=pending.created_at,
                    updated_at=pending.updated_at,
                )
            )
        return listed


def commit_revision(session: Session, record: EpochRecord, committed: Mapping[str, str]) -> EpochRecord:
    """Inside ``mark_committed`` of a revision: record it, and queue the replaced write's files; the
    row as it then is.

    Those files stay referenced by the snapshots older than ``committed`` (time travel), so the
    clean-up carries ``removed_by`` and waits until no retained snapshot is older.
    """
    replaced = record.replaces
    assert replaced is not None
    now = db_now()
    metadata_copies.queue_cleanup(
        session,
        record.sink_id,
        record.epoch,
        replaced.write_id,
        reason=f"replaced by revision {record.revision} (write {record.write_id})",
        removed_by=json.dumps(dict(committed), sort_keys=True),
        replaced=True,
    )
    session.execute(
        update(EpochRevision)
        .where(
            EpochRevision.sink_id == record.sink_id,
            EpochRevision.epoch == record.epoch,
            EpochRevision.write_id == replaced.write_id,
        )
        .values(status=REPLACED, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    _record(session, record, EpochStatus.COMMITTED.value, committed, None)
    done = rows.updated(session, _replaced_statement(), {"r_sink_id": record.sink_id, "r_epoch": record.epoch})
    assert done is not None  # the row the mark just swapped, in this transaction
    return done


@functools.cache
def _replaced_statement() -> Update:
    """The revision no longer replaces anything, the row read back in the same statement."""
    table = cast(Table, PendingSinkState.__table__)
    return rows.returning_row(
        update(table)
        .where(table.c.sink_id == bindparam("r_sink_id"), table.c.epoch == bindparam("r_epoch"))
        .values(replaces=None)
    )


def _record(
    session: Session, record: EpochRecord, status: str, committed: Mapping[str, str] | None, reason: str | None
) -> None:
    """Insert the write's revision row, or bring it up to date when it is there already."""
    now = db_now()
    values = {
        "revision": record.revision,
        "generation": record.pre_commit.generation,
        "status": status,
        "run_id": record.run_id,
        "try_number": record.try_number,
        "dag_id": record.dag_id,
        "rows": record.pre_commit.record_count,
        "files": sum(len(t.data_files) for t in record.pre_commit.tables),
        "committed": None if committed is None else json.dumps(dict(committed), sort_keys=True),
        "reason": reason,
        "updated_at": now,
    }
    key = (
        EpochRevision.sink_id == record.sink_id,
        EpochRevision.epoch == record.epoch,
        EpochRevision.write_id == record.write_id,
    )
    if session.scalar(select(EpochRevision.write_id).where(*key)) is None:
        session.execute(
            insert(EpochRevision).values(
                sink_id=record.sink_id, epoch=record.epoch, write_id=record.write_id, created_at=now, **values
            )
        )
    else:
        session.execute(update(EpochRevision).where(*key).values(**values).execution_options(synchronize_session=False))


def _revision(row: EpochRevision) -> RevisionRecord:
    return RevisionRecord(
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        revision=int(row.revision),
        write_id=row.write_id,
        generation=row.generation,
        status=row.status,
        run_id=row.run_id,
        try_number=row.try_number,
        dag_id=row.dag_id,
        rows=int(row.rows),
        files=int(row.files),
        committed=None if row.committed is None else json.loads(row.committed),
        reason=row.reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
