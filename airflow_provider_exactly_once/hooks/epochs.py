"""The epoch of a DAG run, the same for every task of the run (write, persist, wait, commit, abort).

A run with a data interval addresses the epoch of its interval start, so reruns, clears and
backfills of an interval meet the same row and marker. A run without one (a manual run of an
unscheduled DAG) gets an epoch allocated in the meta store, keyed by its run id: every task of the
run, and every retry or clear of it, reads back the same number.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.identifiers import check_sink_id


class EpochAllocator(Protocol):
    """What ``epoch_for_context`` needs of the store (``SqlSinkStateStore`` has it)."""

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
    check_sink_id(sink_id)
    epoch = interval_epoch(context)
    if epoch is not None:
        return epoch
    return store.allocate_epoch(sink_id, run_id_of(context))
