"""Epochs of DAG runs without a data interval: the store's ``epochs`` companion.

Only the epoch operators' hook allocates (``runtime.run_epochs.epoch_for_context``); the coordinator is
handed epochs and never draws one, so allocation is not part of its port.
"""

from __future__ import annotations

import random
import time

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import MetaStoreUnavailable
from airflow_provider_exactly_once.core.identifiers import check_epoch
from airflow_provider_exactly_once.store import arguments, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import EpochAllocation

_ALLOCATION_ATTEMPTS = 50


class SqlEpochAllocator:
    """``runtime.run_epochs.EpochAllocator`` on the meta store's ``epoch_allocation`` table, keyed by (sink, run id)."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlEpochAllocator({self._db.url_for_display!r})"

    def allocate_epoch(self, sink_id: str, run_id: str) -> int:
        """The epoch of a DAG run without a data interval: the same for that run forever.

        New epochs follow the database clock in milliseconds (like interval-derived ones), and stay
        strictly increasing per sink even when the clock does not.
        """
        run_id = arguments.run_id(run_id)
        action = f"allocating an epoch for sink {sink_id!r} run {run_id!r}"
        for attempt in range(_ALLOCATION_ATTEMPTS):
            try:
                with self._db.transaction(action, write=True) as session:
                    existing = session.scalar(
                        select(EpochAllocation.epoch).where(
                            EpochAllocation.sink_id == sink_id, EpochAllocation.run_id == run_id
                        )
                    )
                    if existing is not None:
                        return int(existing)
                    now_ms = epoch_from_interval_start(rows.database_now(session))
                    last = session.scalar(
                        select(func.max(EpochAllocation.epoch)).where(EpochAllocation.sink_id == sink_id)
                    )
                    epoch = check_epoch(now_ms if last is None else max(now_ms, int(last) + 1))
                    session.execute(insert(EpochAllocation).values(sink_id=sink_id, run_id=run_id, epoch=epoch))
                    return epoch
            except IntegrityError:
                # A concurrent caller took this epoch (or allocated for this run): draw again.
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise MetaStoreUnavailable(
            f"meta store {self._db.url_for_display}: {action} lost the race {_ALLOCATION_ATTEMPTS} times; try again"
        )
