"""Recovery of one sink, as the recovery DAG's mapped task runs it.

The coordinator decides every epoch's fate (``recover``); this only rebuilds the sink from the
registry (the recovery DAG never imports user DAGs), holds the sink's lock, and queues orphaned write
locations for the clean-up path's checked deletes (invariant 4), sharing those rules with ``eo-sink
gc`` in ``core/cleanups.py``. The contract: design.md D3, D5 and D9.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow_provider_exactly_once.core.cleanups import queue_old_orphans, settle_orphans, sink_lock
from airflow_provider_exactly_once.core.coordinator import report_pending
from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig
from airflow_provider_exactly_once.core.outcomes import SinkRecoveryReport
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH
from airflow_provider_exactly_once.defaults import DEFAULT_LOCK_TTL, DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.observability.assets import airflow_metrics
from airflow_provider_exactly_once.runtime.assembly import coordinator_for, open_sink, registered_configs
from airflow_provider_exactly_once.store import SqlSinkStateStore

__all__ = ["SinkRecoveryReport", "recover_sink"]

log = logging.getLogger(__name__)


def recover_sink(
    store: SqlSinkStateStore,
    sink_id: str,
    *,
    holder: str,
    orphan_grace: timedelta = DEFAULT_ORPHAN_GRACE,
    lock_ttl: timedelta = DEFAULT_LOCK_TTL,
) -> SinkRecoveryReport:
    """Finish the sink's half-done epochs and remove its orphaned write locations, under its lock.

    Raises ``SinkLocked`` (nothing done) when another recovery holds the lock, and lets
    ``MetaStoreUnavailable`` through (nothing else can make progress); every other failure, per epoch
    or per orphan, is in the report, and the rest of the sink is still recovered.
    """
    registration = registered_configs(store.registry, sink_id)
    if registration is None:
        raise InvalidSinkConfig(
            f"sink {sink_id!r} is not in the sink registry; it is registered by its first persist, commit or abort"
        )
    sink, checkpoint = registration
    with sink_lock(store.registry, sink_id, holder, lock_ttl):
        report = SinkRecoveryReport(sink_id=sink_id)
        metrics = airflow_metrics()
        opened = open_sink(sink, metrics=metrics)
        coordinator = coordinator_for(
            sink, checkpoint, store=store, metrics=metrics, fault=opened.fault, committer=opened.committer
        )
        enqueued = queue_old_orphans(store.registry, sink_id, opened.write_folders, orphan_grace, report)
        result = coordinator.recover(sink_id)
        report.committed, report.aborted, report.waiting = result.committed, result.aborted, result.waiting
        report.files_deleted = result.files_deleted
        report.failed.update({f"epoch {e}": why for e, why in result.failed.items() if e != ORPHAN_EPOCH})
        settle_orphans(store, enqueued, result, report)
        # After recovery, so the gauges show what is still Pending: epochs waiting for their checkpoint
        # or failing to commit; a growing oldest age is the signal that one is stuck.
        try:
            report_pending(store, sink_id, metrics)
        except ExactlyOnceError as exc:  # a missed gauge must not fail a recovery that did its work
            log.warning("sink %r: could not read the Pending gauges: %s", sink_id, exc)
        return report
