"""What one persist or one abort was asked to do, as each step of the coordinator takes it.

The coordinator decides once per round (``core.decisions``) and hands the request, the row and the
decision to the one step of that action; these values keep the steps' signatures the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TypedDict

from .ports import CommitPlan, EpochRecord
from .precommit import PreCommit
from .status import AbortCause

__all__ = ["AbortRequest", "PersistRequest", "RunAttempt", "revision_plan"]


class RunAttempt(TypedDict):
    """The task attempt a write came from, as each of the store's persist transitions records it."""

    run_id: str | None
    try_number: int | None
    dag_id: str | None


@dataclass(frozen=True)
class PersistRequest:
    """One persist: the write, the task attempt that made it, and what the sink checked of it."""

    pre: PreCommit
    attempt: RunAttempt
    #: ``SinkCommitter.prepare``'s plan, for a step that records the write to stage it.
    plan: CommitPlan
    #: The write as staged (``SinkCommitter.stage``), once a step did: at most once per persist.
    staged: list[PreCommit] = field(default_factory=list)


@dataclass(frozen=True)
class AbortRequest:
    """One abort: of which epoch and write (``None``: the epoch's), why, and by which DAG."""

    sink_id: str
    epoch: int
    reason: str
    write: PreCommit | None
    dag_id: str | None
    cause: AbortCause | None


def revision_plan(plan: CommitPlan, committed: EpochRecord) -> CommitPlan:
    """``plan`` as the revision of the Committed row ``committed``, for persist to stage the
    revision's deletions with its write."""
    return dataclasses.replace(plan, replaces=committed.as_replaced())
