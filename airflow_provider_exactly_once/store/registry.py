"""The sinks and the runs on record: the sink registry, the orphans' look-ups and the per-sink lock
(design.md D5, D9), and the DAG runs that persisted writes with their logical date and data interval
(migration 0008): the store's ``registry`` and ``runs`` companions.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_exactly_once.core.epochs import EpochStatus, check_write_id
from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    StateConflict,
)
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH, CleanupTask
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import models, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import PendingSinkState, RunRecord, SinkCleanup, SinkLock, db_now

#: Write ids asked about per query by ``known_writes`` (bind-parameter limits of the databases).
_KNOWN_WRITES_CHUNK = 500


class SqlSinkRegistry:
    """``core.ports.SinkRegistry`` on the meta store's ``sink_registry``, ``sink_lock``,
    ``pending_sink_state`` and ``sink_cleanup`` tables."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlSinkRegistry({self._db.url_for_display!r})"

    def register_sink(
        self, sink_id: str, sink_config: Mapping[str, Any], checkpoint_config: Mapping[str, Any] | None
    ) -> None:
        """Record (or update) how to rebuild a sink's coordinator; idempotent.

        Written by the epoch operators, so the registry follows the DAG's current configuration;
        an unchanged registration writes nothing (no lock, no ``updated_at`` churn). A
        ``checkpoint_config`` of ``None`` means "not known to this caller" (persist is not given the
        checkpoint) and keeps a registered one: clearing it would make recovery consult the wrong
        checkpoint source.
        """
        sink_json = rows.config_json(sink_config, f"sink {sink_id!r} configuration")
        if sink_config.get("sink_id", sink_id) != sink_id:
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: the configuration to register names sink {sink_config.get('sink_id')!r}"
            )
        checkpoint_json = (
            None
            if checkpoint_config is None
            else rows.config_json(checkpoint_config, f"sink {sink_id!r} checkpoint configuration")
        )
        action = f"registering sink {sink_id!r}"
        with self._db.transaction(action, write=False) as session:
            current = session.get(models.SinkRegistry, sink_id)
            if (
                current is not None
                and current.sink_config == sink_json
                and checkpoint_json in (None, current.checkpoint_config)
            ):
                return
        for attempt in range(2):
            try:
                with self._db.transaction(action, write=True) as session:
                    statement = (
                        update(models.SinkRegistry)
                        .where(models.SinkRegistry.sink_id == sink_id)
                        .values(
                            sink_config=sink_json,
                            updated_at=db_now(),
                            **({} if checkpoint_json is None else {"checkpoint_config": checkpoint_json}),
                        )
                        .execution_options(synchronize_session=False)
                    )
                    if rows.rowcount(session, statement) == 0:
                        now = db_now()
                        session.execute(
                            insert(models.SinkRegistry).values(
                                sink_id=sink_id,
                                sink_config=sink_json,
                                checkpoint_config=checkpoint_json,
                                registered_at=now,
                                updated_at=now,
                            )
                        )
                    return
            except IntegrityError:
                if attempt == 1:  # pragma: no cover - a second insert race on the same sink
                    raise  # a concurrent registration inserted first: the update path now applies

    def registered_sinks(self) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """Every registered sink as ``(sink_id, sink_config, checkpoint_config)``, by sink id."""
        with self._db.transaction("listing registered sinks", write=False) as session:
            found = session.scalars(select(models.SinkRegistry).order_by(models.SinkRegistry.sink_id)).all()
            return [
                (
                    row.sink_id,
                    json.loads(row.sink_config),
                    None if row.checkpoint_config is None else json.loads(row.checkpoint_config),
                )
                for row in found
            ]

    def registered_sink(self, sink_id: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """One sink's registered ``(sink_config, checkpoint_config)``, or ``None`` if never registered."""
        with self._db.transaction(f"reading the registration of sink {sink_id!r}", write=False) as session:
            row = session.get(models.SinkRegistry, sink_id)
            if row is None:
                return None
            return json.loads(row.sink_config), (
                None if row.checkpoint_config is None else json.loads(row.checkpoint_config)
            )

    def known_writes(self, sink_id: str, write_ids: Sequence[str]) -> set[str]:
        """The given write ids the store still answers for: the row's write of a Pending or Committed
        epoch, or a write queued for a clean-up not yet done. Any other write found on storage is
        an orphan candidate (served by the ``(sink_id, write_id)`` indexes)."""
        ids = sorted({check_write_id(w) for w in write_ids})
        known: set[str] = set()
        with self._db.transaction(f"looking up {len(ids)} write(s) of sink {sink_id!r}", write=False) as session:
            for start in range(0, len(ids), _KNOWN_WRITES_CHUNK):
                chunk = ids[start : start + _KNOWN_WRITES_CHUNK]
                known.update(
                    session.scalars(
                        select(PendingSinkState.write_id).where(
                            PendingSinkState.sink_id == sink_id,
                            PendingSinkState.write_id.in_(chunk),
                            PendingSinkState.status.in_([EpochStatus.PENDING.value, EpochStatus.COMMITTED.value]),
                        )
                    )
                )
                known.update(
                    session.scalars(
                        select(SinkCleanup.write_id).where(
                            SinkCleanup.sink_id == sink_id,
                            SinkCleanup.write_id.in_(chunk),
                            SinkCleanup.done_at.is_(None),
                        )
                    )
                )
        return known

    def enqueue_orphan_cleanup(self, pre_commit: PreCommit, *, reason: str, written_since: datetime) -> CleanupTask:
        """Queue an orphaned write (epoch ``ORPHAN_EPOCH``) for the coordinator's clean-up path.

        Its ``created_at`` is ``written_since`` (the oldest of its files) when that is earlier than
        now: the coordinator hands ``created_at`` to the committer as the earliest moment the write
        could have become visible, and the Iceberg committer looks for references from there on.
        Refused when the write is not an orphan by the store's own records, in the same transaction.
        """
        pre_commit = PreCommit.parse(pre_commit)
        if pre_commit.epoch != ORPHAN_EPOCH:
            raise InvalidPreCommit(f"{pre_commit.describe()}: an orphan is queued under epoch {ORPHAN_EPOCH}")
        if written_since.tzinfo is None:
            raise InvalidPreCommit(f"written_since {written_since.isoformat()} must be timezone-aware")
        reason = rows.text(reason, "clean-up reason")
        sink_id, write_id = pre_commit.sink_id, pre_commit.write_id
        with self._db.transaction(f"queuing orphaned write {write_id} of sink {sink_id!r}", write=True) as session:
            owner = session.scalar(
                select(PendingSinkState.epoch)
                .where(
                    PendingSinkState.sink_id == sink_id,
                    PendingSinkState.write_id == write_id,
                    PendingSinkState.status != EpochStatus.ABORTED.value,
                )
                .limit(1)
            )
            if owner is not None:
                raise StateConflict(f"sink {sink_id!r}: write {write_id} is the write of epoch {owner}, not an orphan")
            created_at = min(rows.database_now(session), written_since)
            cleanup_id = session.execute(
                insert(SinkCleanup)
                .values(
                    sink_id=sink_id,
                    epoch=ORPHAN_EPOCH,
                    write_id=write_id,
                    metadata_json=pre_commit.to_json(),
                    reason=reason,
                    created_at=created_at,
                )
                .returning(SinkCleanup.id)
            ).scalar_one()
            return rows.cleanup_task(session.get_one(SinkCleanup, cleanup_id))

    def acquire_sink_lock(self, sink_id: str, holder: str, *, ttl: timedelta) -> tuple[bool, str, datetime]:
        """Take the sink's lock for ``ttl`` unless another holder has it unexpired (a CAS).

        Returns ``(acquired, holder, expires_at)``: on refusal, who holds it and until when. The
        same holder taking it again extends it. An expired lock is taken over, so a recovery task
        killed while holding it delays the next one by at most ``ttl``.
        """
        holder = rows.lock_holder(holder)
        if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
            raise InvalidSinkConfig(f"lock ttl must be a positive timedelta, got {ttl!r}")
        action = f"locking sink {sink_id!r} for {holder!r}"
        for _ in range(2):
            try:
                with self._db.transaction(action, write=True) as session:
                    now = rows.database_now(session)
                    expires = now + ttl
                    statement = (
                        update(SinkLock)
                        .where(
                            SinkLock.sink_id == sink_id,
                            (SinkLock.expires_at <= now) | (SinkLock.holder == holder),
                        )
                        .values(holder=holder, acquired_at=now, expires_at=expires)
                        .execution_options(synchronize_session=False)
                    )
                    if rows.rowcount(session, statement) == 1:
                        return True, holder, expires
                    current = session.scalars(
                        select(SinkLock).where(SinkLock.sink_id == sink_id).execution_options(populate_existing=True)
                    ).one_or_none()
                    if current is not None:
                        return False, current.holder, current.expires_at
                    session.execute(
                        insert(SinkLock).values(sink_id=sink_id, holder=holder, acquired_at=now, expires_at=expires)
                    )
                    return True, holder, expires
            except IntegrityError:
                continue  # a concurrent taker inserted the row first: look again at who holds it
        raise MetaStoreUnavailable(f"meta store {self._db.url_for_display}: {action} kept racing; try again")

    def release_sink_lock(self, sink_id: str, holder: str) -> bool:
        """Give the lock back if ``holder`` still has it; ``False`` when it was taken over meanwhile."""
        holder = rows.lock_holder(holder)
        with self._db.transaction(f"unlocking sink {sink_id!r} for {holder!r}", write=True) as session:
            statement = (
                update(SinkLock)
                .where(SinkLock.sink_id == sink_id, SinkLock.holder == holder)
                # bound, not db_now(): SQLite compares these as text, so all lock times share one form
                .values(expires_at=rows.database_now(session))
                .execution_options(synchronize_session=False)
            )
            return rows.rowcount(session, statement) == 1


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
        run_id = rows.run_id(run_id)
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
    checked = rows.dag_id(dag_id)
    if checked is None:
        raise InvalidPreCommit("a DAG run record needs the DAG id, got None")
    return checked


__all__ = ["RunDates", "SqlRunRecords"]
