"""The small vocabularies every layer shares."""

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


class AbortCause(StrEnum):
    """Why an epoch's write was given up, kept beside the free-text reason (migration 0009).

    The rules that depend on why an epoch ended (the rewrite task writes again only a write given
    up for an upsert conflict) read this, never the reason's words. ``None`` on rows aborted before
    it was recorded whose reason did not tell it.
    """

    #: The upstream's checkpoint FAILED: the epoch's input is not to be committed.
    CHECKPOINT_FAILED = "checkpoint_failed"
    #: Given up before its checkpoint completed: a step of the run failed, or it was aborted by hand.
    GIVEN_UP = "given_up"
    #: Dropped on purpose although its checkpoint completed (``force``).
    FORCED = "forced"
    #: A decided write whose data files are gone for good (``files_lost``).
    FILES_LOST = "files_lost"
    #: Changes by key whose table moved under them, given up to be written again (design.md D14).
    UPSERT_CONFLICT = "upsert_conflict"
