"""The sensors on the checkpoint of a run's epoch (design.md, 'Checkpoint sources'): ``CheckpointSensor`` lets the
commit run on ``COMPLETED`` and fails on ``FAILED`` or a timeout, so the abort runs;
``CheckpointSettledSensor`` holds the write until the checkpoint is final either way. Poke and
reschedule modes poll ``CheckpointSource.status``; ``deferrable=True`` hands the wait to
``CheckpointTrigger`` so no worker slot is held.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig, MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, check_sink_id
from airflow_provider_exactly_once.core.errors import CheckpointFailed, ExactlyOnceError, InvalidSinkConfig
from airflow_provider_exactly_once.hooks.storage import resolved_storage_options
from airflow_provider_exactly_once.runtime.assembly import (
    as_checkpoint,
    as_sink,
    checkpoint_source,
    open_meta_store,
    run_epoch,
)
from airflow_provider_exactly_once.runtime.run_epochs import (
    checkpoint_location,
    epoch_for_context,
    epoch_interval,
    interval_epoch,
)
from airflow_provider_exactly_once.sinks.config import SinkConfig
from airflow_provider_exactly_once.version_compat import AirflowException, AirflowFailException, AirflowSensorTimeout

if TYPE_CHECKING:
    from airflow.sdk import Context


# Wait until the upstream's checkpoint for the run's epoch is final.
#
# ``COMPLETED`` lets the commit run; ``FAILED`` fails the sensor at once, without retries (a failed
# checkpoint is final, retrying cannot change it), and so does a timeout: either way the epoch's
# abort task runs. Poke and reschedule modes poll ``CheckpointSource.status``; ``deferrable=True``
# hands the waiting to ``CheckpointTrigger`` in the triggerer so no worker slot is held.


class CheckpointSensor(BaseSensorOperator):
    """Succeeds when the checkpoint of the run's epoch is ``COMPLETED``.

    :param sink: the sink (its ``sink_id`` is used), or give ``sink_id``.
    :param checkpoint: where the upstream records its checkpoints (``MetaStoreCheckpoint``,
        ``MarkerFileCheckpoint``, ``StreamingCheckpoint``, or such a config's dict).
    :param meta_conn_id: the meta store (read for a meta-store checkpoint and for the epoch of runs
        without a data interval); by default ``[exactly_once] meta_conn_id``, read when the task runs.
    :param deferrable: wait in the triggerer (``CheckpointTrigger``) instead of a worker.
    :param poke_interval, timeout, mode: as for every sensor; ``timeout`` bounds the whole wait.
    """

    template_fields = ("sink_id",)
    ui_color = "#f4e7f8"

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | Mapping[str, Any],
        sink: SinkConfig | Mapping[str, Any] | None = None,
        sink_id: str | None = None,
        meta_conn_id: str | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (sink is None) == (sink_id is None):
            raise InvalidSinkConfig(f"task {self.task_id}: give exactly one of sink and sink_id")
        self.sink_id = as_sink(sink).sink_id if sink is not None else check_sink_id(sink_id)
        self.checkpoint = as_checkpoint(checkpoint)
        self.meta_conn_id = meta_conn_id
        self.deferrable = deferrable

    # -- one look ----------------------------------------------------------------------------------

    def _status(self, context: Context) -> tuple[int, CheckpointStatus]:
        """The run's epoch and its checkpoint status; the store is opened only when needed."""
        epoch = interval_epoch(context)
        if epoch is not None and not isinstance(self.checkpoint, MetaStoreCheckpoint):
            return epoch, self.checkpoint.source(storage_options=resolved_storage_options(self.checkpoint)).status(
                self.sink_id, epoch
            )
        store = open_meta_store(self.meta_conn_id)
        try:
            if epoch is None:
                epoch = epoch_for_context(context, self.sink_id, store.epochs)
            return epoch, checkpoint_source(self.checkpoint, store.checkpoints).status(self.sink_id, epoch)
        finally:
            store.dispose()

    def poke(self, context: Context) -> bool:
        try:
            epoch, status = self._status(context)
        except ExactlyOnceError as exc:
            if exc.retryable:
                # A meta-store or object-store blip is "not known yet"; the timeout bounds the wait.
                self.log.warning("Checkpoint of sink %r unreadable this time: %s", self.sink_id, exc)
                return False
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
        return self._decide(epoch, status, context)

    def _where(self, epoch: int, context: Context) -> str:
        return f"{epoch_interval(epoch, context)} at {checkpoint_location(self.checkpoint, self.sink_id, epoch)}"

    def _decide(self, epoch: int, status: CheckpointStatus, context: Context) -> bool:
        if status is CheckpointStatus.FAILED:
            # The refusal kept inside Airflow's no-retry failure, as the epoch's history says it (D22).
            failed = CheckpointFailed(
                f"checkpoint of sink {self.sink_id!r} {self._where(epoch, context)} FAILED: the epoch will be aborted"
            )
            raise AirflowFailException(f"{type(failed).__name__}: {failed}") from failed
        self.log.info("Checkpoint of sink %r %s: %s", self.sink_id, self._where(epoch, context), status.value)
        return status is CheckpointStatus.COMPLETED

    # -- deferrable --------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):  # already final: no need to hand over to the triggerer
            return None
        epoch = interval_epoch(context)
        if epoch is None:
            epoch = run_epoch(context, self.sink_id, self.meta_conn_id)
        timeout_at = time.time() + self.timeout
        # Imported here: Airflow's trigger base is a DAG parse's largest import after the SDK's own.
        from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger

        self.defer(
            trigger=CheckpointTrigger(
                sink_id=self.sink_id,
                epoch=epoch,
                checkpoint=self.checkpoint.model_dump(mode="json"),
                meta_conn_id=self.meta_conn_id,
                poll_interval=self.poke_interval,
                timeout_at=timeout_at,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        """Resumed by the trigger's event: succeed, fail without retries, or time out."""
        if not event or "status" not in event:
            raise AirflowException(f"checkpoint trigger of sink {self.sink_id!r} returned no event")
        from airflow_provider_exactly_once.triggers.checkpoint import ERROR, TIMEOUT

        status, epoch = event["status"], event.get("epoch")
        if status == TIMEOUT:
            raise AirflowSensorTimeout(
                f"checkpoint of sink {self.sink_id!r} epoch {epoch} not complete within {self.timeout}s"
            )
        if status == ERROR:
            message = f"checkpoint of sink {self.sink_id!r} epoch {epoch} unreadable: {event.get('error')}"
            if event.get("retryable"):
                raise AirflowException(message)
            raise AirflowFailException(message)
        if not self._decide(int(epoch or 0), CheckpointStatus(status), context):
            raise AirflowException(f"checkpoint trigger fired with {status!r} for sink {self.sink_id!r}")


# Hold an epoch's write until the upstream is done with the interval, either way.
#
# The write reads the interval's input when it runs; reading while the upstream is still landing
# files would make a partial interval the epoch's write, and the checkpoint's ``COMPLETED`` would
# then commit it. So the write waits for the checkpoint to be final first. ``FAILED`` is final too:
# the sensor succeeds on it, the write runs (on whatever was landed) and the epoch's own
# ``wait_for_checkpoint`` then fails on the same ``FAILED`` and runs the abort, which records why. A
# settled sensor that failed on ``FAILED`` would skip the write and leave the abort with no write to
# record.


class CheckpointSettledSensor(CheckpointSensor):
    """Succeeds when the checkpoint of the run's epoch is ``COMPLETED`` or ``FAILED``.

    Takes the same arguments as ``CheckpointSensor`` (``sink``, ``checkpoint``, ``meta_conn_id``,
    ``deferrable``, ``poke_interval``, ``timeout``, ``mode``). A timeout fails it, and with it the
    write, so the epoch's abort runs.
    """

    ui_color = "#ecf4e7"

    def _decide(self, epoch: int, status: CheckpointStatus, context: Context) -> bool:
        if status is CheckpointStatus.FAILED:
            self.log.warning(
                "Checkpoint of sink %r %s: FAILED; settled, the epoch's wait will abort it",
                self.sink_id,
                self._where(epoch, context),
            )
            return True
        return super()._decide(epoch, status, context)
