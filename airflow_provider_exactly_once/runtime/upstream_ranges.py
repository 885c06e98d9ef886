"""The range an epoch of an incremental input reads, reserved before its write (``core.input_ranges``).

The write operator asks here before it starts Spark: the epoch's range is read back when it was
reserved before (a retry, a clear, a reprocess), or reserved now, ending at the upstream's current
snapshot. Reserving once, in the meta store, is what makes every later read of the epoch the same:
the Spark job only reads the range it is handed.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from airflow_provider_exactly_once.core.errors import InputRangeRefused, MetaStoreUnavailable
from airflow_provider_exactly_once.core.input_ranges import Replay, SnapshotRange, range_decision
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

log = logging.getLogger(__name__)

_ATTEMPTS = 20


def reserved_range(
    store: SqlSinkStateStore,
    sink_id: str,
    epoch: int,
    table: str,
    current_snapshot: Callable[[], int | None],
    *,
    start_after_snapshot_id: int | None = None,
    run_id: str | None = None,
) -> SnapshotRange:
    """The epoch's range: its reservation, or a new one up to ``current_snapshot()``. A lost race for
    the chain's next position (another epoch reserved first) is decided again on the new chain."""
    for attempt in range(_ATTEMPTS):
        chain = store.input_ranges.chain(sink_id)
        decision = range_decision(sink_id, epoch, table, chain.links, chain.status_of, start_after_snapshot_id)
        if isinstance(decision, Replay):
            log.info("sink %r epoch %d: %s", sink_id, epoch, decision.why)
            return decision.range
        to = current_snapshot()
        if to is None and decision.after_snapshot_id is not None:
            raise InputRangeRefused(
                f"sink {sink_id!r} epoch {epoch}: {table} has no current snapshot, but the sink read it up to "
                f"snapshot {decision.after_snapshot_id}: the table was emptied or re-created. Give the input "
                "a new sink id"
            )
        reserved = SnapshotRange(
            table=table,
            after_snapshot_id=decision.after_snapshot_id,
            to_snapshot_id=decision.after_snapshot_id if to is None else to,
        )
        if store.input_ranges.reserve(sink_id, epoch, decision.position, reserved, run_id):
            log.info("sink %r epoch %d reads %s (%s)", sink_id, epoch, reserved.describe(), decision.why)
            return reserved
        time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
    raise MetaStoreUnavailable(
        f"sink {sink_id!r} epoch {epoch}: reserving a range of {table} lost the race {_ATTEMPTS} times; try again"
    )


def current_snapshot_of(catalog_name: str, properties: dict[str, str], table: str) -> Callable[[], int | None]:
    """The upstream table's current snapshot on ``main``, loaded when asked (a replay never asks)."""

    def current() -> int | None:
        from pyiceberg.catalog import load_catalog

        from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table

        return load_table(load_catalog(catalog_name, **properties), table).metadata.current_snapshot_id

    return current
