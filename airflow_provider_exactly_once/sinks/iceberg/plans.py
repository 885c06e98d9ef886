"""What the single commit (``committer.py``) and the batched one (``batch.py``) share: a table's
prepared plan, how long it stays usable, and what the batch asks of the committer.

The batch is the committer's own commit path stretched over several epochs, so it must use the
committer's loads, checks, marker window and retry policy, never copies of them; it reaches them
through ``BatchHost``, which the committer implements, so neither module imports the other both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from tenacity import Retrying

from airflow_provider_exactly_once.core.faults import FaultHook
from airflow_provider_exactly_once.core.observe import Metrics
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.schema_check import ColumnToAdd

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


class BatchHost(Protocol):
    """The committer as ``batch.py`` uses it (``IcebergSinkCommitter``)."""

    branch: str
    metrics: Metrics
    fault: FaultHook
    max_attempts: int

    def load(self, name: str) -> Table:
        """The table, loaded afresh from the catalog."""

    def adopt(self, name: str, table: Table) -> None:
        """``table``, loaded earlier, is the one this commit goes into."""

    def check(self, table: Table, pre_commit: PreCommit, write: TableWrite) -> list[ColumnToAdd]:
        """The write checked against the table: the columns its commit would add, or a refusal."""

    def check_horizon(self, table: Table, pre_commit: PreCommit, write: TableWrite, since: datetime) -> None:
        """Refuses a commit the table's retained snapshots can no longer prove absent."""

    def missing_in(self, pre_commit: PreCommit, writes: list[tuple[TableWrite, Table]]) -> list[str]:
        """The data files of the writes that storage does not have."""

    def not_before_ms(self, since: datetime) -> int:
        """The oldest snapshot time the marker walk of a row created at ``since`` looks at."""

    def retrying(self) -> Retrying:
        """The bounded, jittered retry of a commit conflict (design.md section 5, step 4)."""
