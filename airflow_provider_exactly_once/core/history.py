"""What happened to an epoch, kept: the events of its append-only history, and who is acting.

An epoch's row says where it stands; an operator asking how it got there (which run wrote revision
2, why Tuesday's first write was aborted before the re-delivery committed, who cleared it) needs
every step, so each transition of the meta store writes one event row in the transaction of its
change (``store/epoch_history.py``): no event without its change, no change without its event.

Who acts is not an argument of the transitions (the coordinator's port stays what the coordinator
decides); the doors that act set it around their work (``acting``): a task of an epoch's DAG run
(with how Airflow started that run), the recovery DAG, an ``eo-sink`` user, a UI user. A
transition made outside any of them records ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class EpochEvent(StrEnum):
    """One step of an epoch's history; each transition of the meta store records exactly one kind."""

    #: A write persisted as the epoch's Pending row (``insert_pending``).
    PERSISTED = "persisted"
    #: A Pending or Aborted epoch's write replaced by a new one (``replace_write``).
    REPLACED = "replaced"
    #: A Committed epoch whose tables were re-created, opened again with a new write.
    REOPENED = "reopened"
    #: A Committed epoch's revision opened: a newer run's write is to replace the committed one.
    REVISION_OPENED = "revision opened"
    #: The commit decided: from here the write is committed, never aborted unless its files are lost.
    COMMIT_DECIDED = "commit decided"
    #: The write visible in every table and the row Committed (a revision's too).
    COMMITTED = "committed"
    #: The write given up: the reason says why (a failed checkpoint, a failed step, by hand).
    ABORTED = "aborted"
    #: A write aborted before it was ever persisted: its tombstone (``insert_aborted``).
    ABORTED_UNPERSISTED = "aborted unpersisted"
    #: A revision given up: the write it was to replace is the epoch's again.
    REVISION_GIVEN_UP = "revision given up"
    #: Something an operator must see though nothing failed (a refused reprocess, another DAG).
    WARNING = "warning"
    #: A step failed on the epoch; it stays finishable (the next try, recovery or an operator).
    ERROR = "error"
    #: A write's files queued for deletion, and their deletion done.
    CLEANUP_QUEUED = "clean-up queued"
    CLEANED_UP = "cleaned up"


class ActorKind(StrEnum):
    TASK = "task"
    RECOVERY = "recovery"
    CLI = "cli"
    UI = "ui"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Actor:
    """Who makes the transitions of the current context, as its history rows name them."""

    kind: ActorKind
    #: A task's ``dag_id.task_id``, a user's name (``user@host`` for the CLI).
    name: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    try_number: int | None = None
    #: Airflow's ``DagRunType`` of the run (``scheduled``, ``manual``, ``backfill``...), and how often
    #: it was cleared before: how the run that acted was started.
    run_type: str | None = None
    clear_number: int | None = None


@dataclass(frozen=True)
class HistoryEntry:
    """One row of an epoch's history, as the store returns it (oldest first)."""

    id: int
    sink_id: str
    epoch: int
    event: EpochEvent
    write_id: str
    #: The epoch's status after the event (``None`` for a clean-up of a write no longer the epoch's).
    status: str | None
    revision: int | None
    at: datetime
    actor: Actor
    reason: str | None


UNKNOWN = Actor(ActorKind.UNKNOWN)
_ACTOR: ContextVar[Actor] = ContextVar("exactly_once_actor", default=UNKNOWN)


def current_actor() -> Actor:
    return _ACTOR.get()


@contextmanager
def acting(actor: Actor) -> Iterator[Actor]:
    """Name ``actor`` in the history rows of the transitions made inside the block."""
    token = _ACTOR.set(actor)
    try:
        yield actor
    finally:
        _ACTOR.reset(token)
