"""Mark an epoch's checkpoint in the meta store: the upstream's "this epoch's input is final".

For upstreams that have no checkpoint of their own (a batch DAG, an ingestion job): the last task
of the upstream's run marks the epoch ``COMPLETED`` (or ``FAILED``), and the sink's
``CheckpointSensor`` with a ``MetaStoreCheckpoint`` waits for exactly that row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, check_epoch, check_sink_id
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.operators._common import airflow_errors
from airflow_provider_exactly_once.runtime.assembly import open_meta_store
from airflow_provider_exactly_once.runtime.run_epochs import epoch_for_context, interval_epoch

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_exactly_once.store import SqlSinkStateStore


class MarkCheckpointOperator(BaseOperator):
    """Record ``status`` for the run's epoch under a checkpoint name in the meta store.

    Name the checkpoint either directly (``checkpoint_name``, shared by several sinks fed by one
    upstream) or by ``sink_id`` (rendered through ``checkpoint``'s ``name_template``, ``{sink_id}``
    by default, i.e. what a ``MetaStoreCheckpoint()`` sensor of that sink reads).

    The epoch is the run's (``epoch_for_context``: the data-interval start) unless ``epoch`` is
    given (templated, e.g. from the sink DAG's interval). A run without a data interval needs
    ``sink_id`` or ``epoch``: only the sink's run-keyed allocation names the same epoch.

    ``COMPLETED`` and ``FAILED`` are final: marking the other one later fails the task without
    retries; marking the same one again is harmless (a retry or clear).
    """

    template_fields: Sequence[str] = ("checkpoint_name", "sink_id", "status", "epoch", "detail")
    ui_color = "#fdf1d6"

    def __init__(
        self,
        *,
        status: CheckpointStatus | str = CheckpointStatus.COMPLETED,
        checkpoint_name: str | None = None,
        sink_id: str | None = None,
        checkpoint: MetaStoreCheckpoint | None = None,
        epoch: int | str | None = None,
        detail: str | None = None,
        meta_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (checkpoint_name is None) == (sink_id is None):
            raise InvalidSinkConfig(f"task {self.task_id}: give exactly one of checkpoint_name and sink_id")
        self.status = str(status)
        self.checkpoint_name = checkpoint_name
        self.sink_id = sink_id
        self.checkpoint = checkpoint or MetaStoreCheckpoint()
        self.epoch = epoch
        self.detail = detail
        self.meta_conn_id = meta_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors():
            try:
                status = CheckpointStatus(self.status)
            except ValueError:
                raise InvalidSinkConfig(
                    f"task {self.task_id}: status {self.status!r} is not one of {[s.value for s in CheckpointStatus]}"
                ) from None
            if self.sink_id is not None:
                check_sink_id(self.sink_id)  # templated: only the rendered value can be checked
            store = open_meta_store(self.meta_conn_id)
            try:
                from airflow_provider_exactly_once.checkpoints.sources import MetaStoreCheckpointSource

                name = self.checkpoint_name or MetaStoreCheckpointSource(
                    store.checkpoints, name_template=self.checkpoint.name_template
                ).name(str(self.sink_id))
                epoch = self._epoch(context, store)
                store.checkpoints.set_checkpoint(name, epoch, status, self.detail)
            finally:
                store.dispose()
        self.log.info("Checkpoint %r epoch %d marked %s", name, epoch, status.value)
        return {"checkpoint": name, "epoch": epoch, "status": status.value}

    def _epoch(self, context: Context, store: SqlSinkStateStore) -> int:
        if self.epoch is not None and self.epoch != "":
            try:
                return check_epoch(int(self.epoch))
            except ValueError:
                raise InvalidSinkConfig(f"task {self.task_id}: epoch {self.epoch!r} is not an integer") from None
        if self.sink_id is not None:
            return epoch_for_context(context, self.sink_id, store.epochs)
        epoch = interval_epoch(context)
        if epoch is None:
            raise InvalidSinkConfig(
                f"task {self.task_id}: the run has no data interval; pass sink_id (to share the sink's "
                "allocated epoch) or epoch"
            )
        return epoch
