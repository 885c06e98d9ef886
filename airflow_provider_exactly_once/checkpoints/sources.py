"""The checkpoint sources, each the upstream's word on whether an epoch's input is final
(design.md, 'Checkpoint sources'): marker objects at a templated path, a table of the meta store, a Spark
Structured Streaming checkpoint location, and an incremental input's reserved snapshot range.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.filesystems import FsLookup, PathTemplate, refuse_credentials

__all__ = [
    "CheckpointTable",
    "MarkerFileCheckpointSource",
    "MetaStoreCheckpointSource",
    "ReservedRanges",
    "SnapshotRangeCheckpointSource",
    "StructuredStreamingCheckpointSource",
    "identity_batch_id",
]

# Checkpoints as marker objects at a templated path (design.md, 'Checkpoint sources').
#
# The upstream (a batch job, Hadoop's output committer, a data-quality gate) says an epoch's input
# is final by writing ``_SUCCESS`` into the epoch's folder, or that it never will be by writing
# ``_FAILED``. Write-audit-publish is this with the audit as the upstream.

TEMPLATE_FIELDS = ("sink_id", "epoch", "start")


class MarkerFileCheckpointSource:
    """``CheckpointSource`` reading ``<path_template>/_SUCCESS`` and ``<path_template>/_FAILED``.

    ``path_template`` is a local path or fsspec URL with the fields ``{sink_id}``, ``{epoch}`` and
    ``{start}`` (the epoch's start as a UTC datetime), e.g.
    ``s3://lake/landing/{sink_id}/{start:%Y/%m/%d/%H}``. It must name the epoch through ``{epoch}``
    or ``{start}``: otherwise one marker would complete every epoch at once.

    A ``_FAILED`` marker wins over ``_SUCCESS`` (an audit may fail a load that had succeeded), and
    is looked for first. Both answers are final, so an upstream must write ``_FAILED`` before the
    epoch's ``_SUCCESS`` ever appears, never after it has been read.
    """

    def __init__(
        self,
        path_template: str,
        *,
        success_marker: str = "_SUCCESS",
        failed_marker: str = "_FAILED",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        refuse_credentials(path_template, what="checkpoint path_template")
        self._template = PathTemplate(path_template, allowed=TEMPLATE_FIELDS, what="checkpoint path_template")
        if not self._template.fields & {"epoch", "start"}:
            raise InvalidSinkConfig(
                f"checkpoint path_template {path_template!r} uses neither {{epoch}} nor {{start}}: "
                "every epoch would share one marker"
            )
        for what, marker in (("success_marker", success_marker), ("failed_marker", failed_marker)):
            if not isinstance(marker, str) or not marker or "/" in marker or marker in (".", ".."):
                raise InvalidSinkConfig(f"{what} must be a plain file name, got {marker!r}")
        if success_marker == failed_marker:
            raise InvalidSinkConfig(f"success_marker and failed_marker are both {success_marker!r}")
        self.success_marker = success_marker
        self.failed_marker = failed_marker
        self._lookup = FsLookup(self._template.sample, storage_options, what="marker checkpoint source")

    @property
    def path_template(self) -> str:
        return self._template.template

    def location(self, sink_id: str, epoch: int) -> str:
        """The folder whose markers decide this epoch (as the template renders it)."""
        return self._template.render(sink_id, epoch)

    def marker_paths(self, sink_id: str, epoch: int) -> tuple[str, str]:
        """``(failed, success)`` marker paths on the filesystem, in the order they are read."""
        folder = self._lookup.path(self.location(sink_id, epoch))
        return f"{folder}/{self.failed_marker}", f"{folder}/{self.success_marker}"

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        failed, success = self.marker_paths(sink_id, epoch)
        if self._lookup.exists(failed):
            return CheckpointStatus.FAILED
        if self._lookup.exists(success):
            return CheckpointStatus.COMPLETED
        return CheckpointStatus.PENDING

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        """Awaits the filesystem's own async API where it has one; else a worker thread."""
        if not self._lookup.is_async:
            return await asyncio.to_thread(self.status, sink_id, epoch)
        failed, success = self.marker_paths(sink_id, epoch)
        if await self._lookup.aexists(failed):
            return CheckpointStatus.FAILED
        if await self._lookup.aexists(success):
            return CheckpointStatus.COMPLETED
        return CheckpointStatus.PENDING

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path_template!r})"


# Checkpoints recorded in a table of the meta store (design.md, 'Checkpoint sources').
#
# The upstream, or an operator at the end of the upstream's DAG, writes ``COMPLETED`` or ``FAILED``
# for an epoch; this source reads it. The meta store's ``SqlSinkStateStore.checkpoints`` is such a
# table, and any object with the two methods of ``CheckpointTable`` will do.


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


# Checkpoints read from a Spark Structured Streaming checkpoint location (design.md, 'Checkpoint sources').
#
# Spark writes ``<location>/offsets/<batchId>`` when a micro-batch is planned and
# ``<location>/commits/<batchId>`` once its sink has finished it (each by an atomic rename of a
# temporary file, so a present name is a complete one). A micro-batch that was planned but not
# committed is re-run with the same offsets after a restart, so only ``commits/`` says COMPLETED, and
# a streaming checkpoint never says FAILED: a failed batch is retried, not abandoned.
#
# Mapping epochs to batch ids: the default is the identity, right when the epoch *is* the batch id
# (epochs allocated per run, or a pipeline that names its epochs after the batches it commits). When
# epochs are interval starts and the stream runs one micro-batch per interval from a known start,
# pass the arithmetic, for example hourly batches since ``T0_MS``::
#
#     StructuredStreamingCheckpointSource(
#         "s3://lake/_checkpoints/orders",
#         batch_id=lambda sink_id, epoch: (epoch - T0_MS) // 3_600_000,
#     )
#
# For anything less regular, keep the mapping where it is made (the job can record its batch id in
# the pre-commit's ``source_positions``) and look it up in the callable.

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


# The checkpoint of an incremental input: the epoch's snapshot range, reserved before its write.
#
# Any other checkpoint says when an epoch's input is final: more rows may land in an hour until its
# upstream says it is done. An incremental input reads the upstream table's snapshots, and a snapshot
# never changes; the range of an epoch is fixed in the meta store before its write reads it
# (``core.input_ranges``), and never changes after. Once it is reserved nothing can come to the
# epoch's input any more: rows appended upstream afterwards are the next epoch's. So the checkpoint is
# ``COMPLETED`` from the moment the range is reserved, and the sensor completes at its first look.
# An epoch without a reservation has not been written yet: ``PENDING``.


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
