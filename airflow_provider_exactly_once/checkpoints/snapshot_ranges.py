"""The checkpoint of an incremental input: the epoch's snapshot range, reserved before its write.

Any other checkpoint says when an epoch's input is final: more rows may land in an hour until its
upstream says it is done. An incremental input reads the upstream table's snapshots, and a snapshot
never changes; the range of an epoch is fixed in the meta store before its write reads it
(``core.input_ranges``), and never changes after. Once it is reserved nothing can come to the
epoch's input any more: rows appended upstream afterwards are the next epoch's. So the checkpoint is
``COMPLETED`` from the moment the range is reserved, and the sensor completes at its first look.
An epoch without a reservation has not been written yet: ``PENDING``.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.status import CheckpointStatus

__all__ = ["ReservedRanges", "SnapshotRangeCheckpointSource"]


@runtime_checkable
class ReservedRanges(Protocol):
    """Whether an epoch of a sink has its range reserved (the meta store's checkpoint companion)."""

    def range_reserved(self, sink_id: str, epoch: int) -> bool: ...


class SnapshotRangeCheckpointSource:
    """``CheckpointSource``: ``COMPLETED`` once the epoch's range is reserved, else ``PENDING``."""

    def __init__(self, ranges: object) -> None:
        if not isinstance(ranges, ReservedRanges):
            raise InvalidSinkConfig(f"{ranges!r} cannot say whether an epoch's range is reserved (range_reserved)")
        self._ranges = ranges

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        reserved = self._ranges.range_reserved(sink_id, epoch)
        return CheckpointStatus.COMPLETED if reserved else CheckpointStatus.PENDING

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        """The store is a synchronous database client: read it on a worker thread."""
        return await asyncio.to_thread(self.status, sink_id, epoch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._ranges!r})"
