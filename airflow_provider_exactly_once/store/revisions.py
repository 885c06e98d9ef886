"""Revisions of an epoch: a newer generation's write replacing the committed one (invariant 1).

The epoch's row carries the revision in flight: ``Committed -> Pending`` with the committed write
kept in ``replaces`` (``open_revision``), then either the revision's commit (``mark_committed``
clears ``replaces`` and queues the replaced write's files, ``removed_by`` the new snapshots) or its
abort (``abort_revision``: the replaced write becomes the epoch's again, Committed as it was).
The revision records operators read are a reading of the epoch's history (design.md D11): each of
these transitions keeps, on its event, the record it makes or changes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import cast

from sqlalchemy import Table, Update, bindparam, select, update
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.history import EpochEvent, RevisionWrite
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_write_id
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import arguments, cas, epoch_history, metadata_copies, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import EpochHistory, PendingSinkState, db_now

#: The status of a committed write a newer revision made invisible.
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

    @classmethod
    def of(
        cls, sink_id: str, epoch: int, write: RevisionWrite, reason: str | None, since: datetime, at: datetime
    ) -> RevisionRecord:
        fields = {**asdict(write), "status": write.status.value}
        return cls(sink_id=sink_id, epoch=epoch, reason=reason, created_at=since, updated_at=at, **fields)


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
                revised=_written(replaced, EpochStatus.COMMITTED, replaced.committed),
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
            epoch_history.record(
                session,
                sink_id,
                epoch,
                EpochEvent.REVISION_GIVEN_UP,
                write_id,
                status=EpochStatus.COMMITTED.value,
                revision=revision.revision,
                reason=reason,
                revised=_written(revision, EpochStatus.ABORTED),
            )
            return cas.reloaded(session, sink_id, epoch)

    def was_replaced(self, sink_id: str, epoch: int, write_id: str) -> bool:
        """Whether a revision's commit replaced this write (``commit_revision`` recorded it); the
        events that say so are never expired, so the answer holds forever."""
        epoch, write_id = check_epoch(epoch), check_write_id(write_id)
        with self._db.transaction(f"looking up write {write_id} of sink {sink_id!r}", write=False) as session:
            found = session.scalar(
                select(EpochHistory.id)
                .where(
                    EpochHistory.sink_id == sink_id,
                    EpochHistory.epoch == epoch,
                    EpochHistory.replaced_write_id == write_id,
                )
                .limit(1)
            )
        return found is not None

    def revisions(self, sink_id: str, epoch: int) -> Sequence[RevisionRecord]:
        """Every recorded revision of the epoch, oldest first, as its events left it: a record is as
        its newest event says, since its first; the one in flight is read from its row."""
        epoch = check_epoch(epoch)
        with self._db.transaction(f"reading the revisions of sink {sink_id!r} epoch {epoch}", write=False) as session:
            events = epoch_history.read(session, sink_id, epoch, epoch_history.KEPT)
            pending = rows.load(session, sink_id, epoch)
        kept: dict[str, RevisionRecord] = {}
        for e in events:
            if e.revised is not None:
                since = kept[e.revised.write_id].created_at if e.revised.write_id in kept else e.at
                reason = e.reason if e.revised.status is EpochStatus.ABORTED else None
                kept[e.revised.write_id] = RevisionRecord.of(sink_id, epoch, e.revised, reason, since, e.at)
            if e.replaced_write_id in kept:
                kept[e.replaced_write_id] = replace(kept[e.replaced_write_id], status=REPLACED, updated_at=e.at)
        listed = sorted(kept.values(), key=lambda r: (r.revision, r.created_at))
        if pending is not None and pending.kind.revises:
            written = _written(pending, EpochStatus.PENDING)
            listed.append(
                RevisionRecord.of(sink_id, epoch, written, pending.error, pending.created_at, pending.updated_at)
            )
        return listed


def commit_revision(session: Session, record: EpochRecord, committed: Mapping[str, str]) -> EpochRecord:
    """Inside ``mark_committed`` of a revision: queue the replaced write's files, and record the
    commit; the row as it then is.

    Those files stay referenced by the snapshots older than ``committed`` (time travel), so the
    clean-up carries ``removed_by`` and waits until no retained snapshot is older.
    """
    replaced = record.replaces
    assert replaced is not None
    metadata_copies.queue_cleanup(
        session,
        record.sink_id,
        record.epoch,
        replaced.write_id,
        reason=f"replaced by revision {record.revision} (write {record.write_id})",
        removed_by=json.dumps(dict(committed), sort_keys=True),
        replaced=True,
    )
    done = rows.updated(session, _replaced_statement(), {"r_sink_id": record.sink_id, "r_epoch": record.epoch})
    assert done is not None  # the row the mark just swapped, in this transaction
    revised = _written(record, EpochStatus.COMMITTED, committed)
    return epoch_history.recorded(session, done, EpochEvent.COMMITTED, revised=revised, replaced=replaced.write_id)


@functools.cache
def _replaced_statement() -> Update:
    """The revision no longer replaces anything, the row read back in the same statement."""
    table = cast(Table, PendingSinkState.__table__)
    return rows.returning_row(
        update(table)
        .where(table.c.sink_id == bindparam("r_sink_id"), table.c.epoch == bindparam("r_epoch"))
        .values(replaces=None)
    )


def _written(record: EpochRecord, status: EpochStatus, committed: Mapping[str, str] | None = None) -> RevisionWrite:
    """The row's write as its revision record shows it."""
    return RevisionWrite(
        write_id=record.write_id,
        revision=record.revision,
        status=status,
        generation=record.pre_commit.generation,
        dag_id=record.dag_id,
        run_id=record.run_id,
        try_number=record.try_number,
        rows=record.pre_commit.record_count,
        files=sum(len(t.data_files) for t in record.pre_commit.tables),
        committed=None if committed is None else dict(committed),
    )
