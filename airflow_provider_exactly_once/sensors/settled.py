"""Hold an epoch's write until the upstream is done with the interval, either way.

The write reads the interval's input when it runs; reading while the upstream is still landing
files would make a partial interval the epoch's write, and the checkpoint's ``COMPLETED`` would
then commit it. So the write waits for the checkpoint to be final first. ``FAILED`` is final too:
the sensor succeeds on it, the write runs (on whatever was landed) and the epoch's own
``wait_for_checkpoint`` then fails on the same ``FAILED`` and runs the abort, which records why. A
settled sensor that failed on ``FAILED`` would skip the write and leave the abort with no write to
record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor

if TYPE_CHECKING:
    from airflow.sdk import Context


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
