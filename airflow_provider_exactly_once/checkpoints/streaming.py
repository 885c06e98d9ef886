"""Checkpoints read from a Spark Structured Streaming checkpoint location (design.md section 7).

Spark writes ``<location>/offsets/<batchId>`` when a micro-batch is planned and
``<location>/commits/<batchId>`` once its sink has finished it (each by an atomic rename of a
temporary file, so a present name is a complete one). A micro-batch that was planned but not
committed is re-run with the same offsets after a restart, so only ``commits/`` says COMPLETED, and
a streaming checkpoint never says FAILED: a failed batch is retried, not abandoned.

Mapping epochs to batch ids: the default is the identity, right when the epoch *is* the batch id
(epochs allocated per run, or a pipeline that names its epochs after the batches it commits). When
epochs are interval starts and the stream runs one micro-batch per interval from a known start,
pass the arithmetic, for example hourly batches since ``T0_MS``::

    StructuredStreamingCheckpointSource(
        "s3://lake/_checkpoints/orders",
        batch_id=lambda sink_id, epoch: (epoch - T0_MS) // 3_600_000,
    )

For anything less regular, keep the mapping where it is made (the job can record its batch id in
the pre-commit's ``source_positions``) and look it up in the callable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.filesystems import FsLookup, PathTemplate, refuse_credentials

__all__ = ["StructuredStreamingCheckpointSource", "identity_batch_id"]

BatchIdMapping = Callable[[str, int], int]


def identity_batch_id(sink_id: str, epoch: int) -> int:
    """The default mapping: epoch ``n`` is micro-batch ``n``."""
    return epoch


class StructuredStreamingCheckpointSource:
    """``CheckpointSource`` over a Structured Streaming checkpoint location.

    ``checkpoint_location`` is a local path or fsspec URL; it may contain ``{sink_id}`` when one
    source serves several sinks, each with its own streaming query.

    A batch is COMPLETED when ``commits/<batchId>`` exists, or when a later batch's commit does:
    Spark purges old log entries (``spark.sql.streaming.minBatchesToRetain``), and batches commit in
    order, so without this a completed epoch would turn PENDING again once its file is purged.
    """

    def __init__(
        self,
        checkpoint_location: str,
        *,
        batch_id: BatchIdMapping | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        refuse_credentials(checkpoint_location, what="streaming checkpoint_location")
        self._template = PathTemplate(checkpoint_location, allowed=("sink_id",), what="streaming checkpoint_location")
        if batch_id is not None and not callable(batch_id):
            raise InvalidSinkConfig(f"batch_id must be a callable (sink_id, epoch) -> int, got {batch_id!r}")
        self._batch_id = batch_id or identity_batch_id
        self._lookup = FsLookup(self._template.sample, storage_options, what="streaming checkpoint source")

    @property
    def checkpoint_location(self) -> str:
        return self._template.template

    def batch_id(self, sink_id: str, epoch: int) -> int:
        """The micro-batch that must have committed for this epoch's input to be final."""
        self._template.render(sink_id, epoch)  # validates the epoch
        batch = self._batch_id(sink_id, epoch)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            mapping = getattr(self._batch_id, "__name__", self._batch_id)
            raise InvalidSinkConfig(
                f"batch_id mapping {mapping!r} returned {batch!r} "
                f"for sink {sink_id!r} epoch {epoch}; a Spark batch id is an integer >= 0"
            )
        return batch

    def commits_folder(self, sink_id: str) -> str:
        return f"{self._lookup.path(self._template.render(sink_id, 0))}/commits"

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        batch = self.batch_id(sink_id, epoch)
        commits = self.commits_folder(sink_id)
        if self._lookup.exists(f"{commits}/{batch}"):
            return CheckpointStatus.COMPLETED
        return _from_listing(self._lookup.listdir(commits), batch)

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        """Awaits the filesystem's own async API where it has one; else a worker thread."""
        if not self._lookup.is_async:
            return await asyncio.to_thread(self.status, sink_id, epoch)
        batch = self.batch_id(sink_id, epoch)
        commits = self.commits_folder(sink_id)
        if await self._lookup.aexists(f"{commits}/{batch}"):
            return CheckpointStatus.COMPLETED
        return _from_listing(await self._lookup.alistdir(commits), batch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.checkpoint_location!r})"


def _from_listing(names: list[str], batch: int) -> CheckpointStatus:
    """COMPLETED if a later batch committed (this one's entry was purged); temp and .crc files skipped."""
    committed = [int(name) for name in names if name.isdigit()]
    return CheckpointStatus.COMPLETED if committed and max(committed) > batch else CheckpointStatus.PENDING
