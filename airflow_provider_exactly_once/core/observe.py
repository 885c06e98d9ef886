"""The metrics port: what the coordinator and the committers report about epochs, with no backend.

``core/`` may not import Airflow, so the coordinator reports through this small protocol and the
Airflow layer adapts it to Airflow's ``Stats`` (``observability.stats``), which forwards to StatsD,
Datadog or OpenTelemetry as configured. Names here carry no prefix; the adapter adds
``exactly_once.``. Every metric is tagged with ``sink_id``: one deployment runs many sinks, and an
operator wants to see which one is slow, retrying or piling up Pending epochs.

A metrics backend must never decide an epoch's fate: ``safe`` wraps one so that a failing backend
is logged and ignored rather than failing a commit that already made data visible.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from .outcomes import AbortResult, CommitOutcome, CommitResult
from .ports import SinkStateStore
from .precommit import PreCommit
from .status import EpochStatus

log = logging.getLogger(__name__)

#: Seconds from the commit call to the Committed mark, for a commit that made the epoch visible.
COMMIT_DURATION = "commit.duration"
#: Commits by ``outcome`` (``committed``, ``already_committed``) and failed commit attempts (``error``).
COMMITS = "commits"
COMMIT_ERRORS = "commit.errors"
#: Data files and rows an epoch's commit made visible (counters; zero for an empty epoch).
COMMIT_FILES = "commit.files"
COMMIT_ROWS = "commit.rows"
COMMIT_BYTES = "commit.bytes"
#: An upsert epoch's committed changes: rows inserted, updated and deleted by key.
COMMIT_INSERTED = "commit.rows_inserted"
COMMIT_UPDATED = "commit.rows_updated"
COMMIT_DELETED = "commit.rows_deleted"
#: Iceberg commit conflicts that sent a table's commit back to reload and re-check its marker.
COMMIT_RETRIES = "commit.retries"
#: Aborts by ``outcome`` and the files they deleted.
ABORTS = "aborts"
ABORT_FILES_DELETED = "abort.files_deleted"
#: Gauges per sink, set by the recovery task: how many epochs are Pending and how old the oldest is.
PENDING_EPOCHS = "pending_epochs"
OLDEST_PENDING_AGE = "oldest_pending_age_seconds"


class Metrics(Protocol):
    """Where the coordinator's measurements go. ``tags`` always holds ``sink_id``."""

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None: ...

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None: ...

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None: ...


class NoMetrics:
    """The default: measurements go nowhere (tests, scripts, deployments without metrics)."""

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        return None

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        return None

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        return None


NO_METRICS: Metrics = NoMetrics()


class SafeMetrics:
    """Wraps a backend so that its failure is logged once per call and never raised.

    A commit that made an epoch visible must report COMMITTED even when the StatsD host is down.
    """

    def __init__(self, inner: Metrics) -> None:
        self._inner = inner

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        try:
            self._inner.incr(name, count, tags)
        except Exception:  # a metrics backend's failure must not change an epoch's outcome
            log.warning("metrics: could not emit %s", name, exc_info=True)

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        try:
            self._inner.gauge(name, value, tags)
        except Exception:  # as above
            log.warning("metrics: could not emit %s", name, exc_info=True)

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        try:
            self._inner.timing(name, duration, tags)
        except Exception:  # as above
            log.warning("metrics: could not emit %s", name, exc_info=True)


def safe(metrics: Metrics) -> Metrics:
    """``metrics`` wrapped in ``SafeMetrics`` (once); ``NO_METRICS`` as it is."""
    if metrics is NO_METRICS or isinstance(metrics, SafeMetrics):
        return metrics
    return SafeMetrics(metrics)


def write_totals(pre_commit: PreCommit) -> tuple[int, int, int]:
    """Files, rows and bytes of a write, over all its tables."""
    files = rows = size = 0
    for table in pre_commit.tables:
        files += len(table.data_files)
        rows += table.data_files.record_count()
        size += table.data_files.size_in_bytes()
    return files, rows, size


def report_pending(store: SinkStateStore, sink_id: str, metrics: Metrics) -> tuple[int, float]:
    """Set the sink's Pending gauges from the store's ``(sink_id, status)`` index; returns them.

    The age is measured on the database's clock, the one ``created_at`` was written with, so a
    worker's clock skew cannot make a fresh epoch look stuck. No Pending epoch: count 0, age 0.
    """
    pending = store.epochs_with_status(sink_id, EpochStatus.PENDING)
    age = 0.0
    if pending:
        oldest = min(row.created_at for row in pending)
        age = max(0.0, (store.now() - oldest).total_seconds())
    tags = {"sink_id": sink_id}
    metrics.gauge(PENDING_EPOCHS, float(len(pending)), tags)
    metrics.gauge(OLDEST_PENDING_AGE, age, tags)
    return len(pending), age


def count_commit(metrics: Metrics, sink_id: str, result: CommitResult, took: timedelta) -> None:
    """Count a commit by outcome; only the attempt that made the epoch visible counts its files and rows,
    so the counters add up to what the tables hold however often a commit is retried or rerun."""
    tags = {"sink_id": sink_id}
    metrics.incr(COMMITS, 1, {**tags, "outcome": result.outcome.name.lower()})
    if result.outcome is CommitOutcome.COMMITTED:
        files, rows, size = write_totals(result.record.pre_commit)
        metrics.timing(COMMIT_DURATION, took, tags)
        metrics.incr(COMMIT_FILES, files, tags)
        metrics.incr(COMMIT_ROWS, rows, tags)
        metrics.incr(COMMIT_BYTES, size, tags)
        changes = [t.changes for t in result.record.pre_commit.tables if t.changes is not None]
        if changes:
            metrics.incr(COMMIT_INSERTED, sum(c.inserted for c in changes), tags)
            metrics.incr(COMMIT_UPDATED, sum(c.updated for c in changes), tags)
            metrics.incr(COMMIT_DELETED, sum(c.deleted for c in changes), tags)


def count_abort(metrics: Metrics, sink_id: str, result: AbortResult) -> None:
    tags = {"sink_id": sink_id}
    metrics.incr(ABORTS, 1, {**tags, "outcome": result.outcome.name.lower()})
    if result.files_deleted:
        metrics.incr(ABORT_FILES_DELETED, result.files_deleted, tags)
