"""What the rules of ``decisions.py`` may ask beyond an epoch's row, as functions each rule calls
only when it needs the answer: each costs I/O (an upstream's checkpoint, the meta store, the sink's
catalog), and a decided or settled epoch needs none.

An action and its dry run build them with the same ``of``, over the same store, checkpoint source
and committer, so that they decide on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .input_ranges import SnapshotRange
from .ports import CheckpointSource, EpochRecord, SinkCommitter, SinkStateStore
from .precommit import PreCommit
from .status import CheckpointStatus, EpochStatus

CheckpointLookup = Callable[[], CheckpointStatus]


@dataclass(frozen=True)
class EpochLookups:
    """What the commit's rules (and recovery's) ask beyond the epoch's row."""

    checkpoint: CheckpointLookup
    #: The sink's Pending epochs: asked only for an upsert write (the upsert order).
    pending: Callable[[], Iterable[int]]
    #: The sink's Committed rows: asked only for an upsert revision (``untellable_revision``).
    committed: Callable[[], Iterable[EpochRecord]]
    #: Another epoch, committed or decided, whose range starts where the given one does: asked only
    #: for an incremental input's write (``core.input_ranges``).
    range_taken: Callable[[SnapshotRange], int | None] = lambda _: None

    @classmethod
    def of(cls, store: SinkStateStore, checkpoints: CheckpointSource, sink_id: str, epoch: int) -> EpochLookups:
        return cls(
            checkpoint=lambda: checkpoints.status(sink_id, epoch),
            pending=lambda: [r.epoch for r in store.epochs_with_status(sink_id, EpochStatus.PENDING)],
            committed=lambda: store.epochs_with_status(sink_id, EpochStatus.COMMITTED),
            range_taken=lambda reserved: store.input_ranges.sharing_start(sink_id, epoch, reserved),
        )


@dataclass(frozen=True)
class WriteLookups:
    """What persist's rules ask beyond the epoch's row about the write being persisted."""

    #: The write's tables' identities now: asked only of a Committed epoch (``recreated_tables``).
    identities: Callable[[], Mapping[str, str]]
    #: Whether the write was ever queued for clean-up: it must then never become the epoch's.
    discarded: Callable[[], bool]
    #: Whether a revision's commit replaced the write: asked only of an epoch ever revised.
    replaced: Callable[[], bool]
    #: The sink's Committed rows: asked only for an upsert revision (``untellable_revision``).
    committed: Callable[[], Iterable[EpochRecord]]

    @classmethod
    def of(cls, store: SinkStateStore, committer: SinkCommitter, write: PreCommit) -> WriteLookups:
        sink_id, epoch, write_id = write.sink_id, write.epoch, write.write_id
        return cls(
            identities=lambda: committer.identities(write),
            discarded=lambda: store.write_discarded(sink_id, epoch, write_id),
            replaced=lambda: store.revisions.was_replaced(sink_id, epoch, write_id),
            committed=lambda: store.epochs_with_status(sink_id, EpochStatus.COMMITTED),
        )
