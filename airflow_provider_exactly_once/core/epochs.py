"""An epoch's names, numbers and history: the checks of its keys (the sink id, the epoch number) and
of the texts an operator or an upstream hands in, epoch numbers derived from data intervals
(invariant 6), a write's generation (design.md D10), the statuses every layer shares, and the
events of its append-only history with who is acting (design.md D19).

Who acts is not an argument of the store's transitions: the doors that act set it around their
work (``acting``), and a transition made outside any of them records ``unknown``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field, PlainValidator

from airflow_provider_exactly_once.core import errors
from airflow_provider_exactly_once.core.errors import InvalidIdentifier, InvalidPreCommit, find_control, safe_text

#: What an epoch keeps of a failed task's error (design.md D22): its first lines, and at most this
#: many characters of them; the whole error is in the task's log, which the views link.
CAUSE_LINES = 5
CAUSE_CHARS = 1500


class EpochStatus(StrEnum):
    """Status of one (sink, epoch) row in ``pending_sink_state`` (design.md, 'The meta store')."""

    PENDING = "Pending"
    COMMITTED = "Committed"
    ABORTED = "Aborted"


class CheckpointStatus(StrEnum):
    """The upstream's statement about an epoch's input (design.md, 'Checkpoint sources').

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
    #: An audited write whose checks failed, dropped by an operator (``reject``, design.md D23).
    REJECTED = "rejected"


class AuditVerdict(StrEnum):
    """What the audit of an epoch's write concluded (design.md D23)."""

    PASSED = "passed"
    FAILED = "failed"


class AuditStage(StrEnum):
    """An audited Pending epoch's stage, as operators read it (``EpochRecord.stage``, design.md D23):
    its write waits for its audit to run, to be settled after the audit failed, or for its publish."""

    AUDITING = "Auditing"
    AUDIT_FAILED = "Audit failed"
    AUDITED = "Audited"


class AuditCheck(BaseModel, frozen=True, extra="forbid"):
    """One check of an audit as it ended: a task or a built-in check, by name, and what it said."""

    name: str = Field(min_length=1, max_length=250)
    passed: bool
    message: str = Field(default="", max_length=CAUSE_CHARS)


class EpochAudit(BaseModel, frozen=True, extra="forbid"):
    """An audited sink's write committed where only its checks read it (design.md D23): the audit
    branch of each table, the snapshot the write made there, and the verdict once the checks ran.
    Kept on the epoch's row (``pending_sink_state.audit``) for the write it names only."""

    write_id: str
    branch: str
    #: Per table: the audit snapshot's id, or ``"empty"`` when the write added nothing there.
    snapshots: dict[str, str]
    verdict: AuditVerdict | None = None
    checks: tuple[AuditCheck, ...] = ()
    #: When the write was committed to its audit branch (the meta store's clock): how long audits
    #: take is measured from here to the verdict.
    committed_at: datetime | None = None

    def failing(self) -> str:
        """The failed checks as one line each: ``name: message``."""
        return "\n".join(f"{c.name}: {c.message}".rstrip(": ") for c in self.checks if not c.passed)

    def judged(self, checks: Sequence[AuditCheck]) -> EpochAudit:
        """This audit with the verdict of ``checks``: passed when every one did (and there is one)."""
        passed = bool(checks) and all(c.passed for c in checks)
        return self.model_copy(
            update={"verdict": AuditVerdict.PASSED if passed else AuditVerdict.FAILED, "checks": tuple(checks)}
        )

    def failed_by(self, checks: Sequence[AuditCheck]) -> EpochAudit:
        """This audit judged failed by one of its tasks' ``checks``, beside what its other tasks
        found failed before (their checks of other names; a passed verdict kept none)."""
        names = {c.name for c in checks}
        earlier = [c for c in self.checks if c.name not in names] if self.verdict is AuditVerdict.FAILED else []
        return self.judged([*earlier, *checks])


SINK_ID_MAX_LENGTH = 128
#: The longest abort reason taken: a sentence or a paragraph, not a log pasted into the row.
ABORT_REASON_MAX_LENGTH = 2000
EPOCH_MAX = 2**63 - 1
#: The longest upstream table name a reservation row keeps (``input_range.source``).
TABLE_NAME_MAX_LENGTH = 512
#: Iceberg's snapshot ids are signed 64-bit (a ``BigInteger`` column in the meta store).
SNAPSHOT_ID_MIN, SNAPSHOT_ID_MAX = -(2**63), 2**63 - 1
_SINK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_sink_id(sink_id: object) -> str:
    if not isinstance(sink_id, str):
        raise InvalidIdentifier(f"sink_id must be a string, got {type(sink_id).__name__}")
    if not sink_id:
        raise InvalidIdentifier("sink_id is empty")
    if len(sink_id) > SINK_ID_MAX_LENGTH:
        raise InvalidIdentifier(
            f"sink_id {sink_id[:40]!r}... is {len(sink_id)} characters; at most {SINK_ID_MAX_LENGTH}"
        )
    if not _SINK_ID.fullmatch(sink_id) or ".." in sink_id:
        raise InvalidIdentifier(
            f"sink_id {sink_id!r} has characters unsafe in a path: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit, without '..'"
        )
    return sink_id


def check_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidIdentifier(f"epoch must be an integer, got {type(epoch).__name__}")
    if epoch < 0:
        raise InvalidIdentifier(f"epoch {epoch} is negative")
    if epoch > EPOCH_MAX:
        raise InvalidIdentifier(f"epoch {epoch} does not fit in 64 bits")
    return epoch


def check_write_id(write_id: object) -> str:
    if not isinstance(write_id, str):
        raise InvalidIdentifier(f"write_id must be a UUID string, got {type(write_id).__name__}")
    try:
        return str(uuid.UUID(write_id))
    except ValueError:
        raise InvalidIdentifier(f"write_id {write_id!r} is not a UUID") from None


def abort_reason_fault(reason: object) -> str | None:
    """What is wrong with an operator's abort reason, said for whoever typed it, or ``None``."""
    if not isinstance(reason, str) or not reason.strip():
        return "an abort needs a reason (it is kept on the row)"
    if (control := find_control(reason)) is not None:
        # Printed raw by a later listing, an escape sequence would act on the reader's terminal.
        return f"the abort reason holds the control character {control}; give it as one line of printable text"
    if len(reason) > ABORT_REASON_MAX_LENGTH:
        return (
            f"the abort reason is {len(reason)} characters long; at most {ABORT_REASON_MAX_LENGTH} are kept: "
            "shorten it, and say where the details are rather than pasting them"
        )
    return None


def table_name_fault(table: str) -> str | None:
    """What is wrong with an upstream table's name as a reservation row keeps it and every listing
    prints it, said for whoever wrote it, or ``None``."""
    if (control := find_control(table)) is not None:
        # Printed raw by a listing, an escape sequence would act on the reader's terminal.
        return f"{table[:40]!r} holds the control character {control}; name the table in printable characters"
    if len(table) > TABLE_NAME_MAX_LENGTH:
        return f"{table[:40]!r}... is {len(table)} characters long; a table name has at most {TABLE_NAME_MAX_LENGTH}"
    return None


def new_write_id() -> str:
    """A fresh write id: every attempt at writing an epoch gets its own (design.md, 'Vocabulary')."""
    return str(uuid.uuid4())


#: Field types for pydantic models that carry an epoch's keys: the checks above, with their messages.
SinkId = Annotated[str, PlainValidator(check_sink_id)]
Epoch = Annotated[int, PlainValidator(check_epoch)]
WriteId = Annotated[str, PlainValidator(check_write_id)]


#: What a sink does with a newer generation's write for a committed epoch: replace it (a revision)
#: or keep what it committed (for inputs that cannot be re-read). ``core.decisions`` applies it.
OnReprocess = Literal["replace", "keep"]
ON_REPROCESS: tuple[OnReprocess, ...] = ("replace", "keep")

_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z/\d{10}$")


def generation_of(run_started_at: datetime, clear_number: int) -> str:
    """The generation of a write started in a run that started at ``run_started_at`` after ``clear_number`` clears."""
    if run_started_at.tzinfo is None:
        raise InvalidPreCommit(f"run start {run_started_at.isoformat()} has no time zone")
    if isinstance(clear_number, bool) or not isinstance(clear_number, int) or not 0 <= clear_number < 10**10:
        raise InvalidPreCommit(f"clear_number must be a non-negative integer, got {clear_number!r}")
    return f"{run_started_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}Z/{clear_number:010d}"


def check_generation(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FORMAT.match(value):
        raise ValueError(f"generation {value!r} is not '<run start, UTC, microseconds>Z/<clear number, 10 digits>'")
    return value


def is_newer(candidate: str | None, than: str | None) -> bool:
    """Whether a write of generation ``candidate`` may replace one of generation ``than``.

    A write without a generation (outside Airflow, or from before generations were recorded) is
    never newer; anything with one is newer than a row without one.
    """
    if candidate is None:
        return False
    return than is None or candidate > than


def is_older(candidate: str | None, than: str | None) -> bool:
    """Whether a write is from an older generation than the row's (a zombie of a run since cleared)."""
    return candidate is not None and than is not None and candidate < than


def epoch_from_interval_start(start: datetime) -> int:
    if start.tzinfo is None or start.utcoffset() is None:
        raise InvalidIdentifier(f"data interval start {start.isoformat()} has no time zone; epochs need an instant")
    delta = start.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return check_epoch(delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000)


def epoch_start(epoch: int) -> datetime:
    """The instant an interval-derived epoch starts at (for templating paths and log lines)."""
    check_epoch(epoch)
    return datetime.fromtimestamp(epoch / 1000, tz=UTC)


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
    #: An audited sink's write committed to its audit branch, for its checks to read (D23).
    AUDIT_COMMITTED = "audit committed"
    #: The audit's checks ran: every one passed, so the write may be published; or one failed.
    AUDIT_PASSED = "audit passed"
    AUDIT_FAILED = "audit failed"


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
