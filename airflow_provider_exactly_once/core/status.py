"""The two small vocabularies every layer shares."""

from __future__ import annotations

from enum import StrEnum


class EpochStatus(StrEnum):
    """Status of one (sink, epoch) row in ``pending_sink_state`` (design.md section 4)."""

    PENDING = "Pending"
    COMMITTED = "Committed"
    ABORTED = "Aborted"


class CheckpointStatus(StrEnum):
    """The upstream's statement about an epoch's input (design.md section 7).

    ``COMPLETED`` and ``FAILED`` are final: a checkpoint source must never move away from them,
    because the coordinator turns them into irreversible commit and abort decisions.
    """

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PENDING = "PENDING"
