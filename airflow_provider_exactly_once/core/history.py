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

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from . import errors
from .redact import safe_text
from .status import EpochStatus


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
    #: A step failed on the epoch; it stays finishable (the next try, recovery or an operator). A
    #: task of the epoch's group that failed for good records its own (design.md D22), row or not.
    ERROR = "error"
    #: A try of a task of the epoch's group failed, and Airflow runs it again (D22).
    TRY_FAILED = "try failed"
    #: A write's files queued for deletion, and their deletion done.
    CLEANUP_QUEUED = "clean-up queued"
    CLEANED_UP = "cleaned up"
    #: A revision record kept before the history held them, carried over by migration 0014.
    REVISION_RECORDED = "revision recorded"


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
class RevisionWrite:
    """A write that was, or was to be, a revision, as its record shows it (design.md D11), kept
    whole on each event that makes or changes the record: the records are read from the history."""

    write_id: str
    revision: int
    #: ``Committed`` (until a revision's commit names it ``replaced_write_id``) or ``Aborted``;
    #: ``Pending`` only for the revision in flight, which its row shows, never an event.
    status: EpochStatus
    generation: str | None
    #: The run that wrote it.
    dag_id: str | None
    run_id: str | None
    try_number: int | None
    rows: int
    files: int
    #: Per table, the snapshot that made it visible; ``None`` for a revision given up.
    committed: dict[str, str] | None


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
    #: The revision record the event makes or changes: the committed write a revision opened to
    #: replace, a revision given up (its reason the event's), a revision committed.
    revised: RevisionWrite | None = None
    #: The write a revision's commit replaced: its record reads ``Replaced`` from this event on.
    replaced_write_id: str | None = None


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


#: What an epoch keeps of a failed task's error (design.md D22): its first lines, and at most this
#: many characters of them; the whole error is in the task's log, which the views link.
CAUSE_LINES = 5
CAUSE_CHARS = 1500
#: Our own rules that make a step wait rather than fail: said as such, not as a failure.
_WAITS = (errors.EarlierEpochUndecided, errors.RevisionInProgress, errors.CheckpointNotReady)


def failure_reason(kind: str, message: str) -> str:
    """``<kind>: <first lines of message>``, secrets masked and control characters escaped: the
    reason of the ERROR event a failed task leaves on its epoch."""
    lines = [safe_text(line.rstrip()) for line in message.strip().splitlines() if line.strip()][:CAUSE_LINES]
    text = f"{safe_text(kind)}: " + "\n".join(lines)
    return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 1] + "\u2026"


def task_of(actor: Actor) -> str | None:
    """The task id of a task actor (``dag_id.task_id`` without its DAG), else ``None``."""
    if actor.kind is not ActorKind.TASK or not actor.name:
        return None
    prefix = f"{actor.dag_id}."
    return actor.name[len(prefix) :] if actor.dag_id and actor.name.startswith(prefix) else actor.name


def failed_step(entry: HistoryEntry) -> str | None:
    """``write failed on try 2: <reason>`` for a task's ERROR or TRY_FAILED event (``..., retried``);
    ``None`` for any other. A refusal by the package's own rules reads as one (``was refused``,
    ``must wait``): its message already says what to do."""
    task = task_of(entry.actor)
    if entry.event not in (EpochEvent.ERROR, EpochEvent.TRY_FAILED) or task is None:
        return None
    kind = (entry.reason or "").split(":", 1)[0].strip()
    error = next((e for e in _error_classes() if e.__name__ == kind), None)
    verb = "failed"
    if error is not None and issubclass(error, _WAITS):
        verb = "must wait"
    elif error is not None and not error.retryable:
        verb = "was refused"
    attempt = "" if entry.actor.try_number is None else f" on try {entry.actor.try_number}"
    retried = ", retried" if entry.event is EpochEvent.TRY_FAILED else ""
    return f"{task.rsplit('.', 1)[-1]} {verb}{attempt}{retried}: {entry.reason or 'no error given'}"


def run_failure(events: Sequence[HistoryEntry], run_id: str | None, tasks: Collection[str] = ()) -> str | None:
    """Why run ``run_id`` gave its epoch up: the newest failure for good one of its tasks recorded
    (of ``tasks`` when given, the task ids Airflow says failed), as ``failed_step`` says it."""
    for entry in reversed(events):
        task = task_of(entry.actor)
        if entry.event is EpochEvent.ERROR and entry.actor.run_id == run_id and (not tasks or task in tasks):
            return failed_step(entry)
    return None


def _error_classes() -> Iterator[type[errors.ExactlyOnceError]]:
    pending: list[type[errors.ExactlyOnceError]] = [errors.ExactlyOnceError]
    while pending:
        error = pending.pop()
        yield error
        pending.extend(error.__subclasses__())
