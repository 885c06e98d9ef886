"""The epoch of a DAG run, the same for every task of the run (write, persist, wait, commit, abort), and
how tasks name it in their logs; for an incremental input, the snapshot range the epoch reads,
reserved in the meta store before its write (design.md D21).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start, epoch_start, generation_of
from airflow_provider_exactly_once.core.errors import (
    InputRangeRefused,
    InvalidIdentifier,
    InvalidSinkConfig,
    MetaStoreUnavailable,
)

if TYPE_CHECKING:
    from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
    from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
    from airflow_provider_exactly_once.store import SqlSinkStateStore


# The epoch of a DAG run, the same for every task of the run (write, persist, wait, commit, abort),
# and how tasks name it in their logs.
#
# A run with a data interval addresses the epoch of its interval start, so reruns, clears and
# backfills of an interval meet the same row and marker. A run without one (a manual run of an
# unscheduled DAG) gets an epoch allocated in the meta store, keyed by its run id: every task of the
# run, and every retry or clear of it, reads back the same number.


class EpochAllocator(Protocol):
    """What ``epoch_for_context`` needs of the store (``SqlSinkStateStore.epochs`` is one)."""

    def allocate_epoch(self, sink_id: str, run_id: str) -> int: ...


def interval_epoch(context: Mapping[str, Any]) -> int | None:
    """The epoch of the run's data interval start, or ``None`` when the run has no data interval."""
    start: datetime | None = context.get("data_interval_start")
    return None if start is None else epoch_from_interval_start(start)


def run_id_of(context: Mapping[str, Any]) -> str:
    run_id = context.get("run_id")
    if not run_id:
        dag_run = context.get("dag_run")
        run_id = getattr(dag_run, "run_id", None)
    if not isinstance(run_id, str) or not run_id:
        raise InvalidSinkConfig("the task context has no run id, so no epoch can be allocated for the run")
    return run_id


def epoch_for_context(context: Mapping[str, Any], sink_id: str, store: EpochAllocator) -> int:
    """The run's epoch for ``sink_id``: its data-interval start in ms, else the run's allocated epoch."""
    epoch = interval_epoch(context)
    if epoch is not None:
        return epoch
    return store.allocate_epoch(sink_id, run_id_of(context))


def instant_text(at: datetime) -> str:
    """``2024-05-31T00:00Z`` (seconds, and their fraction, only when it has them): how task logs, ``eo-sink`` and the UI
    write the instants of data intervals, so one can be found in the other."""
    at = at.astimezone(UTC)
    if at.microsecond:
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return at.strftime("%Y-%m-%dT%H:%MZ" if at.second == 0 else "%Y-%m-%dT%H:%M:%SZ")


def interval_text(start: datetime, end: datetime | None) -> str:
    """``[2024-05-31T00:00Z, 2024-06-01T00:00Z)``, or ``[2024-05-31T00:00Z, ...)`` when the end is unknown."""
    return f"[{instant_text(start)}, {'...' if end is None else instant_text(end)})"


def epoch_interval(epoch: int, context: Mapping[str, Any] | None = None) -> str:
    """``epoch 1717113600000 = [2024-05-31T00:00Z, 2024-06-01T00:00Z)``: an epoch number alone is
    unreadable in a log, and the meta store, the UI and ``eo-sink`` all name epochs by number.

    The end comes from the run's data interval when the epoch is that interval's; an epoch
    allocated for a run without one (or given explicitly) shows only its start.
    """
    try:
        start = epoch_start(epoch)
    except InvalidIdentifier:
        return f"epoch {epoch}"
    context = context or {}
    begin, end = context.get("data_interval_start"), context.get("data_interval_end")
    if isinstance(begin, datetime) and isinstance(end, datetime) and end > begin:
        try:
            if epoch_from_interval_start(begin) == epoch:
                return f"epoch {epoch} = {interval_text(begin, end)}"
        except InvalidIdentifier:
            pass
    return f"epoch {epoch} = {interval_text(start, None)}"


def checkpoint_location(checkpoint: CheckpointConfig, sink_id: str, epoch: int) -> str:
    """Where the checkpoint that decides this epoch lives, as resolved for it (the folder whose
    markers are read, the meta-store checkpoint name, the streaming checkpoint): a wait that never
    ends is debugged by looking there."""
    from airflow_provider_exactly_once.checkpoints.config import (
        MarkerFileCheckpoint,
        MetaStoreCheckpoint,
        SnapshotRangeCheckpoint,
        StreamingCheckpoint,
    )
    from airflow_provider_exactly_once.checkpoints.sources import MarkerFileCheckpointSource
    from airflow_provider_exactly_once.core.errors import mask_userinfo
    from airflow_provider_exactly_once.filesystems import PathTemplate

    if isinstance(checkpoint, MarkerFileCheckpoint):
        # Where the markers are needs no credentials: the connection is not read for it.
        source = checkpoint.source(storage_options=checkpoint.storage_options)
        assert isinstance(source, MarkerFileCheckpointSource)
        folder = source.location(sink_id, epoch)
        return mask_userinfo(f"{folder} ({checkpoint.success_marker} / {checkpoint.failed_marker})")
    if isinstance(checkpoint, SnapshotRangeCheckpoint):
        return f"the snapshot range reserved for epoch {epoch} (eo-sink show {sink_id} {epoch})"
    if isinstance(checkpoint, MetaStoreCheckpoint):
        name = PathTemplate(checkpoint.name_template, allowed=("sink_id",), what="checkpoint name_template").render(
            sink_id, epoch
        )
        return f"meta-store checkpoint {name!r}, epoch {epoch}"
    if isinstance(checkpoint, StreamingCheckpoint):
        return mask_userinfo(f"streaming checkpoint {checkpoint.checkpoint_location}, batch {epoch}")
    return repr(checkpoint)


def generation_for_context(context: Mapping[str, Any]) -> str | None:
    """The generation a write started in this task belongs to (``core.epochs``), or ``None``
    when the context names no DAG run (a task run outside a scheduled run)."""
    dag_run = context.get("dag_run")
    if dag_run is None:
        return None
    # The later of the run's start and its run_after: a clear restarts the run (a later start), a
    # new run of the interval (a manual trigger, ``dags test``) runs after the earlier one. ``dags
    # test`` gives its run the logical date as start, so run_after is what orders its runs.
    instants = [
        at
        for at in (getattr(dag_run, "start_date", None), getattr(dag_run, "run_after", None))
        if isinstance(at, datetime) and at.tzinfo is not None
    ]
    if not instants:
        return None
    clear_number = getattr(dag_run, "clear_number", None) or 0
    return generation_of(max(instants), int(clear_number))


def record_run(store: SqlSinkStateStore, context: Mapping[str, Any], dag_id: str | None) -> None:
    """Keep the run's logical date and data interval in the meta store, beside the epochs it writes.

    An operator selects a run by its logical date, which for a ``dags test DAG DATE`` run is the
    interval's end and for a scheduled or backfilled run its start: the views show both, so the run
    of the intended day is the one selected. A context without a DAG or run id records nothing.
    """
    from airflow_provider_exactly_once.store.registry import RunDates

    run_id = context.get("run_id")
    if dag_id is None or not isinstance(run_id, str) or not run_id:
        return
    dag_run = context.get("dag_run")

    def instant(key: str) -> datetime | None:
        value = context.get(key, getattr(dag_run, key, None))
        return value if isinstance(value, datetime) and value.tzinfo is not None else None

    dates = RunDates(instant("logical_date"), instant("data_interval_start"), instant("data_interval_end"))
    store.runs.record(dag_id, run_id, dates)


# The range an epoch of an incremental input reads, reserved before its write (``core.input_ranges``).
#
# The write operator asks here before it starts Spark: the epoch's range is read back when it was
# reserved before (a retry, a clear, a reprocess), or reserved now, ending at the upstream's current
# snapshot. Reserving once, in the meta store, is what makes every later read of the epoch the same:
# the Spark job only reads the range it is handed.

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
    # Imported here: sensors and triggers import this module as a DAG is parsed.
    from airflow_provider_exactly_once.core.input_ranges import Replay, SnapshotRange, range_decision

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
