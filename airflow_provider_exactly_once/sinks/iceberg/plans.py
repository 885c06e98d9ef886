"""A commit's plans as the Iceberg committer (``committer.py``) keeps them: a table's prepared
state, how long it stays usable, and one plan's write to one table of a commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.write_kinds import ReplacedWrite
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import EpochSnapshot
from airflow_provider_exactly_once.sinks.iceberg.write_check import ColumnToAdd

#: How long a table ``prepare`` loaded may stand in for the commit's own load (``CommitPlan.fresh_state``).
PREPARED_FRESH_S = 5.0


@dataclass(frozen=True)
class TablePlan:
    """One table's prepared state in a ``CommitPlan``: the table as loaded and what its commit does.

    ``table`` is pyiceberg's object, which a commit through it updates in place: committing the same
    plan again then finds this write's marker at once.
    """

    write: TableWrite
    table: Table
    to_add: list[ColumnToAdd]
    #: A revision's: the replaced write's files in this table, removed by the same snapshot.
    to_replace: list[DataFile]
    #: Whether every data file of the write was found in storage (``prepare(check_files=True)``).
    files_checked: bool = False


@dataclass(frozen=True)
class TableEntry:
    """One plan's write to one table of a commit: a commit of several plans groups these by table."""

    #: The plan's position in the commit.
    index: int
    plan: CommitPlan
    write: TableWrite
    since: datetime
    #: The oldest snapshot time its marker walk looks at (``since`` minus the clock skew).
    not_before_ms: int

    @property
    def supersedes_a_marker(self) -> bool:
        """A revision of a write whose marker the table shows: even an empty one leaves a snapshot with
        its own marker, or the next revision would find a marker that is neither its write's nor the
        one it replaces (``ForeignWriteVisible``)."""
        return self.plan.kind.shows_replaced(self.write.table)

    @property
    def write_of(self) -> tuple[PreCommit, TableWrite, ReplacedWrite | None]:
        return self.plan.pre_commit, self.write, self.plan.replaces

    def snapshot(self, to_add: list[ColumnToAdd], to_replace: list[DataFile]) -> EpochSnapshot:
        """Its snapshot: an overwrite for a revision, or for an upsert that rewrote files."""
        replaces = self.plan.replaces
        number = replaces.revision + 1 if replaces else 0  # 0: an upsert's overwrite of what it rewrote
        revision = (number, to_replace) if replaces or to_replace else None
        return EpochSnapshot(self.plan.pre_commit, self.write, to_add, revision)
