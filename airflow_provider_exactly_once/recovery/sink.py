"""Recovery of one sink, as the recovery DAG's mapped task runs it.

Everything that decides an epoch's fate stays in the coordinator (``recover``); this function only
rebuilds the sink's coordinator from the registry (the recovery DAG never imports user DAGs), holds
the sink's lock so two recoveries never work on one sink at once, and hands orphaned write
locations to the store's clean-up queue, whose deletes the clean-up path (``core/cleanups.py``)
runs with the committers' own safety checks (invariant 4). The sink is opened once
(``runtime.assembly.open_sink``): its committer and its write-folder listing share a catalog or
file system.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.cleanups import clean_up
from airflow_provider_exactly_once.core.errors import (
    ExactlyOnceError,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    SinkLocked,
)
from airflow_provider_exactly_once.core.observe import report_pending
from airflow_provider_exactly_once.core.orphans import queue_orphans, scan_orphans
from airflow_provider_exactly_once.core.outcomes import CleanupReport
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH, SinkRegistry
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.defaults import DEFAULT_LOCK_TTL, DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.observability.stats import airflow_metrics
from airflow_provider_exactly_once.runtime.assembly import OpenedSink, coordinator_for, open_sink
from airflow_provider_exactly_once.sinks.config import SinkConfig, sink_config_from_dict
from airflow_provider_exactly_once.store import SqlSinkStateStore

log = logging.getLogger(__name__)


@dataclass
class SinkRecoveryReport:
    """What one recovery did to one sink (JSON-friendly for XCom)."""

    sink_id: str
    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    #: ``"epoch <n>"``, ``"orphan <write id>"`` or ``"orphan scan"`` -> why it failed.
    failed: dict[str, str] = field(default_factory=dict)
    files_deleted: int = 0
    orphans_removed: list[str] = field(default_factory=list)
    #: Unknown write locations younger than the grace period (or of unknown age): kept.
    orphans_kept: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def summary(self) -> str:
        return (
            f"sink {self.sink_id!r}: committed {self.committed}, aborted {self.aborted}, waiting {self.waiting}, "
            f"failed {sorted(self.failed)}, {self.files_deleted} file(s) deleted, "
            f"{len(self.orphans_removed)} orphaned write location(s) removed, {len(self.orphans_kept)} kept"
        )


def registered_configs(registry: SinkRegistry, sink_id: str) -> tuple[SinkConfig, CheckpointConfig | None] | None:
    """The sink's config and checkpoint config (``None``: the meta-store checkpoint table) as
    registered, or ``None`` for a sink never registered."""
    registration = registry.registered_sink(sink_id)
    if registration is None:
        return None
    sink_dict, checkpoint_dict = registration
    checkpoint = None if checkpoint_dict is None else checkpoint_config_from_dict(checkpoint_dict)
    return sink_config_from_dict(sink_dict), checkpoint


@contextmanager
def sink_lock(registry: SinkRegistry, sink_id: str, holder: str, ttl: timedelta = DEFAULT_LOCK_TTL) -> Iterator[None]:
    """Hold the sink's lock: two recoveries (or a recovery and ``eo-sink gc``) never work on one sink at once."""
    acquired, by, until = registry.acquire_sink_lock(sink_id, holder, ttl=ttl)
    if not acquired:
        raise SinkLocked(f"sink {sink_id!r} is being recovered by {by!r} (lock held until {until.isoformat()})")
    try:
        yield
    finally:
        try:
            registry.release_sink_lock(sink_id, holder)
        except MetaStoreUnavailable:
            log.warning("could not release the lock of sink %r; it expires by itself", sink_id)


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
        report = SinkRecoveryReport(sink_id)
        metrics = airflow_metrics()
        opened = open_sink(sink, metrics=metrics)
        coordinator = coordinator_for(
            sink, checkpoint, store=store, metrics=metrics, fault=opened.fault, committer=opened.committer
        )
        enqueued = _queue_orphans(store.registry, opened, orphan_grace, report)
        result = coordinator.recover(sink_id)
        report.committed, report.aborted, report.waiting = result.committed, result.aborted, result.waiting
        report.files_deleted = result.files_deleted
        report.failed.update({f"epoch {e}": why for e, why in result.failed.items() if e != ORPHAN_EPOCH})
        _settle_orphans(store, enqueued, result, report)
        # After recovery, so the gauges show what is still Pending: epochs waiting for their checkpoint
        # or failing to commit; a growing oldest age is the signal that one is stuck.
        try:
            report_pending(store, sink_id, metrics)
        except ExactlyOnceError as exc:  # a missed gauge must not fail a recovery that did its work
            log.warning("sink %r: could not read the Pending gauges: %s", sink_id, exc)
        return report


def remove_orphans(
    store: SqlSinkStateStore,
    sink: OpenedSink,
    *,
    holder: str,
    grace: timedelta,
    lock_ttl: timedelta = DEFAULT_LOCK_TTL,
) -> SinkRecoveryReport:
    """Only the orphan half of ``recover_sink`` (``eo-sink gc``): no epoch's status is touched.

    Orphans go through the store's clean-up queue and the clean-up path (``core.cleanups``, with the
    sink's committer), under the sink's lock, exactly as the recovery DAG removes them. The caller
    opens the sink, so it can say which catalog could not be reached.
    """
    with sink_lock(store.registry, sink.sink_id, holder, lock_ttl):
        report = SinkRecoveryReport(sink.sink_id)
        enqueued = _queue_orphans(store.registry, sink, grace, report)
        result = clean_up(store, sink.committer, sink.sink_id, ORPHAN_EPOCH, fault=sink.fault)
        report.files_deleted = result.files_deleted
        _settle_orphans(store, enqueued, result, report)
        return report


def _settle_orphans(
    store: SqlSinkStateStore, enqueued: set[str], result: CleanupReport, report: SinkRecoveryReport
) -> None:
    """An orphan is removed once its clean-up left the queue; what is still queued failed."""
    remaining = {task.write_id for task in store.cleanups(report.sink_id, ORPHAN_EPOCH)}
    report.orphans_removed = sorted(enqueued - remaining)
    for write_id in sorted(remaining):
        report.failed[f"orphan {write_id}"] = result.failed.get(ORPHAN_EPOCH, "its clean-up did not complete")


def _queue_orphans(registry: SinkRegistry, sink: OpenedSink, grace: timedelta, report: SinkRecoveryReport) -> set[str]:
    """Queue every orphan older than ``grace`` for the clean-up path; their write ids."""
    old, young, failed = scan_orphans(sink.sink_id, sink.write_folders, registry, grace)
    if failed is not None:  # a listing failure must not stop the epochs' recovery
        report.failed["orphan scan"] = failed
    report.orphans_kept = [candidate.write_id for candidate in young]
    return queue_orphans(registry, old, grace)


def unreachable(sink: SinkConfig, exc: Exception) -> str:
    """Why the sink's catalog or file system cannot be reached, naming it, credentials masked."""
    lines = str(exc).strip().splitlines()
    why = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    conn_id = getattr(sink, "iceberg_conn_id", None)
    if conn_id is None:
        where = f"the file system of root {sink.to_dict().get('root')!r}"
    else:
        where = f"the Iceberg catalog of connection {conn_id!r}"
        uri = _catalog_uri(conn_id)
        if uri:
            where += f" ({uri})"
    return mask_userinfo(
        f"sink {sink.sink_id!r}: {where} cannot be reached: {why}; check that it is up and that the "
        "connection is right, then retry"
    )


def _catalog_uri(conn_id: str) -> str | None:
    """The catalog's URI from its connection, to name it in a message (masked by the caller)."""
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception:  # naming the catalog is a courtesy: the refusal stands without it
        return None
    uri = conn.host or (conn.extra_dejson or {}).get("uri")  # the host wins, as in IcebergHook
    return str(uri) if uri else None
