"""A first persist's row: the Pending row of a write, inserted without reading the epoch first
(``SqlSinkStateStore.insert_pending``; its metadata is ``rows.insert_metadata``'s).

Persist is on the path of every epoch, before its commit, and issue 18 holds the whole
exactly-once path to within 10% of a bare Iceberg append. The database's part of a first persist
on PostgreSQL is about half a millisecond (two small inserts, one small select and a durable
commit); what SQLAlchemy did around it cost several: statements built anew per call
(``insert(...).values(...)``), the ORM's bulk-insert machinery for a plain insert, and an ORM object
rebuilt from the row the insert read back. The statement here is a Core statement on the table,
built once with parameters, and the record is mapped from the columns ``RETURNING`` reads back
with the insert itself, by the same mapping every read uses.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import cast

from sqlalchemy import Insert, Table, bindparam, insert
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.store import rows
from airflow_provider_exactly_once.store.models import PendingSinkState, db_now

_STATE = cast(Table, PendingSinkState.__table__)


def insert_row(
    session: Session, pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None
) -> EpochRecord:
    """Insert the Pending row of ``pre_commit``'s write; the primary key refuses a second row of the
    epoch (``IntegrityError``). The record is the row as a read of it maps it (a test holds the two
    equal)."""
    found = session.execute(
        _row_insert(),
        {
            "i_sink_id": pre_commit.sink_id,
            "i_epoch": pre_commit.epoch,
            "i_write_id": pre_commit.write_id,
            "i_run_id": run_id,
            "i_try_number": try_number,
            "i_dag_id": dag_id,
        },
    ).one()
    # The row as every read maps it (``rows.record``), from its columns: no ORM object is built.
    return rows.record(session, cast(PendingSinkState, SimpleNamespace(**found._mapping)), pre_commit=pre_commit)


@functools.cache
def _row_insert() -> Insert:
    now = db_now()
    return (
        insert(_STATE)
        .values(
            sink_id=bindparam("i_sink_id"),
            epoch=bindparam("i_epoch"),
            status=EpochStatus.PENDING.value,
            write_id=bindparam("i_write_id"),
            run_id=bindparam("i_run_id"),
            try_number=bindparam("i_try_number"),
            dag_id=bindparam("i_dag_id"),
            created_at=now,
            updated_at=now,
        )
        .returning(*_STATE.columns)
    )
