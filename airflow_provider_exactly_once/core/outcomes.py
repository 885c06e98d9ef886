"""What the coordinator's steps report: an outcome per step, and the row it left.

Outcomes are values a caller branches on (an operator logs "already committed" differently from
"committed"); the results carry the row so no caller has to read the store again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, Field, computed_field

from .decisions import Action
from .ports import EpochRecord


class PersistOutcome(StrEnum):
    PERSISTED = "persisted"
    ALREADY_PERSISTED = "already persisted"
    REPLACED = "replaced an earlier write"
    ALREADY_COMMITTED = "already committed"
    COMMIT_DECIDED = "an earlier write is being committed"
    REOPENED = "re-opened: the table was re-created since the epoch was committed"
    REVISED = "revision opened: the write replaces the committed one once its checkpoint completes"
    SUPERSEDED = "discarded: a newer generation's write holds the epoch"
    KEPT = "kept: the epoch stays as committed (on_reprocess='keep'); the new write was removed"


class CommitOutcome(StrEnum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already committed"


class AbortOutcome(StrEnum):
    ABORTED = "aborted"
    ALREADY_ABORTED = "already aborted"
    ALREADY_COMMITTED = "already committed"
    REVISION_ABORTED = "revision aborted: the write it would have replaced stays visible"
    NOT_PERSISTED = "not persisted; the write's files were removed"
    OTHER_WRITE_REMOVED = "the write was not the epoch's; its files were removed"
    NO_WRITE = "recorded Aborted: the run produced no write"


class RewriteOutcome(StrEnum):
    ALREADY_COMMITTED = "already committed: nothing to write again"
    REWRITE = "write again: the write conflicts with the table; the next write replaces it"
    GAVE_UP = "the decided write can never be committed and was given up; write again"


#: What a persist that leaves the epoch's row as it is reports, per action of ``persist_decision``.
KEPT_OUTCOMES = {
    Action.KEEP: PersistOutcome.ALREADY_PERSISTED,
    Action.ALREADY_COMMITTED: PersistOutcome.ALREADY_COMMITTED,
    Action.ALREADY_REPLACED: PersistOutcome.SUPERSEDED,
    Action.DISCARD_LATE: PersistOutcome.ALREADY_COMMITTED,
    Action.DISCARD_UNDER_COMMIT: PersistOutcome.COMMIT_DECIDED,
    Action.DISCARD_OLDER: PersistOutcome.SUPERSEDED,
    Action.DISCARD_KEPT: PersistOutcome.KEPT,
}


@dataclass(frozen=True)
class PersistResult:
    outcome: PersistOutcome
    record: EpochRecord
    #: The write whose data the epoch holds (or will): differs from the persisted write's id when
    #: the epoch was already committed or decided with an earlier one.
    write_id: str
    #: Something an operator must hear about (also kept on the row): the task logs it at WARNING.
    warning: str | None = None


@dataclass(frozen=True)
class CommitResult:
    outcome: CommitOutcome
    record: EpochRecord


@dataclass(frozen=True)
class RewriteResult:
    outcome: RewriteOutcome
    record: EpochRecord
    #: What conflicts (the ``UpsertConflict`` message), or why nothing is written again.
    why: str


@dataclass(frozen=True)
class AbortResult:
    outcome: AbortOutcome
    files_deleted: int
    record: EpochRecord | None


@dataclass
class CleanupReport:
    """What running a sink's queued clean-ups did; a clean-up that failed stays queued."""

    sink_id: str
    #: epoch -> why its clean-up (or, in a recovery, the epoch itself) failed.
    failed: dict[int, str] = field(default_factory=dict)
    files_deleted: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class RecoveryReport(CleanupReport):
    """What a recovery did: the epochs it settled, then the clean-ups it ran."""

    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


class SinkRecoveryReport(BaseModel):
    """What one recovery (or ``eo-sink gc``, its orphan half) did to one sink, as XCom and
    ``eo-sink --json`` carry it (``model_dump(mode="json")``)."""

    sink_id: str
    committed: list[int] = Field(default_factory=list)
    aborted: list[int] = Field(default_factory=list)
    waiting: list[int] = Field(default_factory=list)
    #: ``"epoch <n>"``, ``"orphan <write id>"`` or ``"orphan scan"`` -> why it failed.
    failed: dict[str, str] = Field(default_factory=dict)
    files_deleted: int = 0
    orphans_removed: list[str] = Field(default_factory=list)
    #: Unknown write locations younger than the grace period (or of unknown age): kept.
    orphans_kept: list[str] = Field(default_factory=list)
    #: Files outside any write location that nothing references (``core.cleanups.StrayFiles``), removed by gc.
    stray_removed: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        return (
            f"sink {self.sink_id!r}: committed {self.committed}, aborted {self.aborted}, waiting {self.waiting}, "
            f"failed {sorted(self.failed)}, {self.files_deleted} file(s) deleted, "
            f"{len(self.orphans_removed)} orphaned write location(s) removed, {len(self.orphans_kept)} kept"
        )
