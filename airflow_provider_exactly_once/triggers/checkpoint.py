"""Wait for an epoch's checkpoint in the triggerer, without holding a worker slot.

The trigger is rebuilt in another process from ``serialize()``, so it carries only plain JSON: the
sink id, the epoch, the checkpoint configuration as a dict (``CheckpointConfig.model_dump(mode="json")``, which
names its storage connection but holds no secret), the meta-store connection id, the poll interval
and an absolute deadline. It polls the source's async
``astatus`` and fires once, with the final status, a timeout, or a refusal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import ExactlyOnceError
from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook
from airflow_provider_exactly_once.hooks.storage import aresolved_storage_options
from airflow_provider_exactly_once.runtime.assembly import meta_conn_id_or_configured
from airflow_provider_exactly_once.runtime.run_epochs import checkpoint_location, epoch_interval

if TYPE_CHECKING:
    from airflow_provider_exactly_once.store import SqlSinkStateStore

#: Event ``status`` values besides the final checkpoint statuses.
TIMEOUT = "TIMEOUT"
ERROR = "ERROR"


class CheckpointTrigger(BaseTrigger):
    """Fires ``{"status": "COMPLETED" | "FAILED" | "TIMEOUT" | "ERROR", "sink_id", "epoch", ...}``.

    :param sink_id: the sink whose epoch is awaited.
    :param epoch: the epoch (already resolved by the sensor: the triggerer has no task context).
    :param checkpoint: ``CheckpointConfig.model_dump(mode="json")`` of the sink's checkpoint source.
    :param meta_conn_id: the meta store (read only by a meta-store checkpoint); ``None``: the one
        ``[exactly_once] meta_conn_id`` names, resolved as the sensor defers, so that the triggerer
        gets the id the task used.
    :param poll_interval: seconds between polls.
    :param timeout_at: POSIX time after which the trigger fires ``TIMEOUT`` (the sensor's timeout;
        also enforced by the triggerer's own deferral timeout, this keeps runs without one finite).
    :param retryable_errors_fail_after: consecutive transient failures (meta store or object store
        unreachable) tolerated before firing ``ERROR``; a refusal fires ``ERROR`` at once.
    """

    def __init__(
        self,
        *,
        sink_id: str,
        epoch: int,
        checkpoint: dict[str, Any],
        meta_conn_id: str | None = None,
        poll_interval: float = 30.0,
        timeout_at: float | None = None,
        retryable_errors_fail_after: int = 20,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.sink_id = sink_id
        self.epoch = int(epoch)
        self.checkpoint = dict(checkpoint)
        self.meta_conn_id = meta_conn_id_or_configured(meta_conn_id)
        self.poll_interval = float(poll_interval)
        self.timeout_at = None if timeout_at is None else float(timeout_at)
        self.retryable_errors_fail_after = int(retryable_errors_fail_after)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "sink_id": self.sink_id,
                "epoch": self.epoch,
                "checkpoint": self.checkpoint,
                "meta_conn_id": self.meta_conn_id,
                "poll_interval": self.poll_interval,
                "timeout_at": self.timeout_at,
                "retryable_errors_fail_after": self.retryable_errors_fail_after,
            },
        )

    def _event(self, status: str, **extra: Any) -> TriggerEvent:
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {"status": status, "sink_id": self.sink_id, "epoch": self.epoch, **extra}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store: SqlSinkStateStore | None = None
        try:
            try:
                config = checkpoint_config_from_dict(self.checkpoint)
                if isinstance(config, MetaStoreCheckpoint):
                    store = await ExactlyOnceMetaStoreHook(self.meta_conn_id).aget_store()
                    source = config.source(store.checkpoints)
                else:
                    # The storage connection is fetched asynchronously here (a synchronous fetch
                    # may not run on the triggerer's loop), and the filesystem is made in this run.
                    source = config.source(storage_options=await aresolved_storage_options(config))
            except ExactlyOnceError as exc:
                yield self._event(ERROR, error=f"{type(exc).__name__}: {exc}", retryable=exc.retryable)
                return
            failures = 0
            while True:
                try:
                    status = await source.astatus(self.sink_id, self.epoch)
                except ExactlyOnceError as exc:
                    failures += 1
                    if not exc.retryable or failures >= self.retryable_errors_fail_after:
                        yield self._event(ERROR, error=f"{type(exc).__name__}: {exc}", retryable=exc.retryable)
                        return
                    self.log.warning(
                        "Checkpoint of sink %r epoch %d unreadable (%s); polling on", self.sink_id, self.epoch, exc
                    )
                else:
                    failures = 0
                    if status is not CheckpointStatus.PENDING:
                        self.log.info(
                            "Checkpoint of sink %r %s at %s: %s",
                            self.sink_id,
                            epoch_interval(self.epoch),
                            checkpoint_location(config, self.sink_id, self.epoch),
                            status.value,
                        )
                        yield self._event(status.value)
                        return
                if self.timeout_at is not None and time.time() >= self.timeout_at:
                    yield self._event(TIMEOUT)
                    return
                delay = self.poll_interval
                if self.timeout_at is not None:
                    delay = max(0.0, min(delay, self.timeout_at - time.time()))
                await asyncio.sleep(delay)
        finally:
            if store is not None:
                await asyncio.to_thread(store.dispose)
