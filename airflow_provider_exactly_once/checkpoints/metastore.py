"""Checkpoints recorded in a table of the meta store (design.md section 7).

The upstream, or an operator at the end of the upstream's DAG, writes ``COMPLETED`` or ``FAILED``
for an epoch; this source reads it. The meta store's ``SqlSinkStateStore.checkpoints`` is such a
table, and any object with the two methods of ``CheckpointTable`` will do.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.filesystems import PathTemplate

__all__ = ["CheckpointTable", "MetaStoreCheckpointSource"]


@runtime_checkable
class CheckpointTable(Protocol):
    """Where checkpoints are kept, by name and epoch. An epoch never recorded reads ``PENDING``.

    ``set_checkpoint`` must refuse to move an epoch away from ``COMPLETED`` or ``FAILED`` (those
    are final: the coordinator turns them into irreversible commits and aborts).
    """

    def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus: ...

    def set_checkpoint(self, name: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None: ...


class MetaStoreCheckpointSource:
    """``CheckpointSource`` over a ``CheckpointTable``.

    ``name_template`` maps a sink to the checkpoint name the upstream writes under
    (``{sink_id}`` is the only field); several sinks fed by one upstream can share a name, e.g.
    ``"orders-ingest"`` with no field at all.
    """

    def __init__(self, table: CheckpointTable, *, name_template: str = "{sink_id}") -> None:
        if not isinstance(table, CheckpointTable):
            raise InvalidSinkConfig(
                f"checkpoint table {table!r} lacks get_checkpoint(name, epoch) and "
                "set_checkpoint(name, epoch, status, detail)"
            )
        self._table = table
        self._name = PathTemplate(name_template, allowed=("sink_id",), what="checkpoint name_template")

    def name(self, sink_id: str) -> str:
        """The checkpoint name this sink's epochs are recorded under."""
        return self._name.render(sink_id, 0)

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        name = self.name(sink_id)
        status = self._table.get_checkpoint(name, epoch)
        if not isinstance(status, CheckpointStatus):
            raise TypeError(
                f"checkpoint table {self._table!r} returned {status!r} for {name!r} epoch {epoch}, "
                "not a CheckpointStatus"
            )
        return status

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        """The table is a synchronous database client: read it on a worker thread."""
        return await asyncio.to_thread(self.status, sink_id, epoch)

    def mark(self, sink_id: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None:
        """Record the upstream's word for a sink's epoch (what the marking operator calls)."""
        self._table.set_checkpoint(self.name(sink_id), epoch, CheckpointStatus(status), detail)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._table!r}, name_template={self._name.template!r})"
