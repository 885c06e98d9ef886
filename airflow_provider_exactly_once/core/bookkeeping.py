"""What the coordinator keeps on an epoch's row besides its status, and how it reads a row that
must exist. None of it decides anything: a failure to record is logged and never hides the
failure or the warning being recorded, which the task's own log still carries."""

from __future__ import annotations

import logging

from .decisions import other_dag_warning
from .errors import EpochNotFound, MetaStoreUnavailable
from .identifiers import check_epoch
from .ports import EpochRecord, SinkStateStore
from .precommit import PreCommit

__all__ = ["note_error", "record_warning", "require_epoch", "warn_other_dag"]

log = logging.getLogger(__name__)


def require_epoch(store: SinkStateStore, sink_id: str, epoch: int) -> EpochRecord:
    """The epoch's row; ``EpochNotFound`` (naming sink and epoch) when it was never persisted."""
    check_epoch(epoch)
    row = store.get(sink_id, epoch)
    if row is None:
        raise EpochNotFound(f"sink {sink_id!r} epoch {epoch} was never persisted")
    return row


def note_error(store: SinkStateStore, row: EpochRecord, exc: Exception) -> None:
    """Keep the last failure on the row, where the UI and ``eo-sink show`` give it to operators."""
    try:
        store.record_error(row.sink_id, row.epoch, write_id=row.write_id, error=f"{type(exc).__name__}: {exc}")
    except MetaStoreUnavailable:
        log.warning("could not record the error on sink %r epoch %d", row.sink_id, row.epoch)


def record_warning(store: SinkStateStore, pre: PreCommit, warning: str) -> None:
    """Said at WARNING and kept on the epoch's row, where the UI and eo-sink show it."""
    log.warning("%s", warning)
    try:
        store.record_warning(pre.sink_id, pre.epoch, warning=warning)
    except MetaStoreUnavailable:
        log.warning("could not record the warning on sink %r epoch %d", pre.sink_id, pre.epoch)


def warn_other_dag(store: SinkStateStore, pre: PreCommit, row: EpochRecord, dag_id: str | None) -> str | None:
    """A write from another DAG for an epoch already settled: the sink id may be reused by mistake."""
    warning = other_dag_warning(pre, row, dag_id)
    if warning is not None:
        record_warning(store, pre, warning)
    return warning
