"""The DAG runs that persisted writes, with their logical date and data interval: the store's ``runs``
companion.

An epoch names a data interval by its start; an operator who wants to reprocess a day selects an
Airflow run by its *logical date*, which is the interval's start for a scheduled or backfilled run
and its end for a ``dags test DAG DATE`` run. The persist task records what its run has, and the
operations views show it beside every epoch and revision, so the run of the intended day can be
picked by what is shown. Airflow's own record cannot serve alone: ``eo-sink`` reads the meta store
without Airflow, and a ``dags test`` of the same date deletes the earlier run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.store import arguments
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import RunRecord, db_now

#: (dag_id, run_id) pairs asked about per query by ``lookup`` (bind-parameter limits of the databases).
_LOOKUP_CHUNK = 400


@dataclass(frozen=True)
class RunDates:
    """What Airflow gave one run: its logical date and data interval (each ``None`` when it had none)."""

    logical_date: datetime | None
    interval_start: datetime | None
    interval_end: datetime | None


class SqlRunRecords:
    """The meta store's ``dag_run_record`` table, keyed by (DAG id, run id)."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlRunRecords({self._db.url_for_display!r})"

    def record(self, dag_id: str, run_id: str, dates: RunDates) -> None:
        """Keep ``dates`` for the run; idempotent, and an unchanged record writes nothing.

        A run id Airflow gives again (a run deleted and created anew) takes the new run's dates.
        """
        dag_id = _required_dag_id(dag_id)
        run_id = arguments.run_id(run_id)
        for name, value in vars(dates).items():
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise InvalidPreCommit(f"run {run_id!r}: {name} must be a timezone-aware datetime, got {value!r}")
        action = f"recording DAG {dag_id!r} run {run_id!r}"
        with self._db.transaction(action, write=False) as session:
            found = session.get(RunRecord, (dag_id, run_id))
            if found is not None and _dates(found) == dates:
                return
        values = {**vars(dates), "recorded_at": db_now()}
        key = (RunRecord.dag_id == dag_id, RunRecord.run_id == run_id)
        try:
            with self._db.transaction(action, write=True) as session:
                if found is None:
                    session.execute(insert(RunRecord).values(dag_id=dag_id, run_id=run_id, **values))
                else:
                    session.execute(update(RunRecord).where(*key).values(**values))
        except IntegrityError:  # another task of the run recorded it meanwhile: its dates are the same run's
            with self._db.transaction(action, write=True) as session:
                session.execute(update(RunRecord).where(*key).values(**values))

    def lookup(self, runs: Collection[tuple[str | None, str | None]]) -> Mapping[tuple[str, str], RunDates]:
        """The recorded dates of those runs that have a record; pairs with a ``None`` are skipped."""
        wanted = sorted({(d, r) for d, r in runs if d is not None and r is not None})
        found: dict[tuple[str, str], RunDates] = {}
        if not wanted:
            return found
        with self._db.transaction("reading DAG run records", write=False) as session:
            for i in range(0, len(wanted), _LOOKUP_CHUNK):
                chunk = wanted[i : i + _LOOKUP_CHUNK]
                for row in session.scalars(
                    select(RunRecord).where(tuple_(RunRecord.dag_id, RunRecord.run_id).in_(chunk))
                ):
                    found[(row.dag_id, row.run_id)] = _dates(row)
        return found


def _dates(row: RunRecord) -> RunDates:
    return RunDates(row.logical_date, row.interval_start, row.interval_end)


def _required_dag_id(dag_id: object) -> str:
    checked = arguments.dag_id(dag_id)
    if checked is None:
        raise InvalidPreCommit("a DAG run record needs the DAG id, got None")
    return checked


__all__ = ["RunDates", "SqlRunRecords"]
