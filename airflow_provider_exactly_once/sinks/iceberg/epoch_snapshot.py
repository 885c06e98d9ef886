"""Epochs' snapshots of one table, staged in one transaction and committed at most once, and the plans
the committer keeps of them: a table's prepared state, how long it stays usable, and one plan's write
to one table (design.md, 'The Iceberg commit', steps 3, 6 and 7; D15).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from airflow_provider_exactly_once.core.errors import CommitRefused
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.ports import CommitPlan, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    AUDIT_BRANCH_KEY,
    WRITE_ID_KEY,
    audit_branch_name,
    marker_of,
    marker_properties,
)
from airflow_provider_exactly_once.sinks.iceberg.overwrites import (
    PREPARED_FILE,
    identifier_update,
    refuse_stale_placeholders,
    usable_replacement,
)
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import tidy, usable_manifests
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    SinkCommitConflict,
    SinkTransaction,
    SpecAwareOverwrite,
    StackedFastAppend,
)
from airflow_provider_exactly_once.sinks.iceberg.write_check import ColumnToAdd, check_added_field_ids, write_spec

# Epochs' snapshots of one table: staged in one transaction, committed at most once.
#
# The committer (``committer.py``) decides which epochs a table takes a snapshot of and retries
# conflicts; this module is what the snapshots consist of (design.md, 'The Iceberg commit', steps 3, 6 and 7): the
# columns a write adds, an upsert's identifier fields, a name mapping for a table without one, the data
# files built from the writers' descriptors under the spec they were written for (or the manifests
# persist prepared of them: ``prepared_manifests`` for an append, ``overwrites`` for a revision or
# an upsert, deletions included), and the marker in
# the summary, as an append, or as an overwrite that removes exactly the files a revision or an upsert
# replaces. Several epochs (recovery's backlog, D15) are stacked in epoch order, each snapshot parented
# on the one before, so the catalog writes one metadata file for all of them and swaps it in once.


@dataclass(frozen=True)
class EpochSnapshot:
    """What one epoch's snapshot of one table holds, as the committer checked it against the table."""

    pre_commit: PreCommit
    write: TableWrite
    to_add: list[ColumnToAdd]
    #: A revision's number and the files it replaces, or an upsert's (revision 0 and the files it
    #: rewrote): the snapshot is then an overwrite; ``None``: an append.
    revision: tuple[int, list[DataFile]] | None


def refuse_stacked_schema_changes(snapshots: Sequence[EpochSnapshot]) -> None:
    """Only one epoch's snapshot of a table may change its schema: the columns each write adds were
    found missing from the table before the transaction, so a second epoch would add them again."""
    if len(snapshots) < 2:
        return
    for snapshot in snapshots:
        if snapshot.to_add:
            raise CommitRefused(
                f"{snapshot.pre_commit.describe()}: adds columns to table {snapshot.write.table!r}, "
                "so it is committed on its own, not stacked with other epochs; nothing was committed"
            )


@dataclass
class StagedSnapshots:
    """One table's transaction with its epochs' snapshots staged, not yet sent to the catalog."""

    table: Table
    tx: SinkTransaction
    snapshot_ids: list[int]
    #: Writes whose manifests persist prepared and the snapshot did not list: tidied once committed.
    unused: list[tuple[TableWrite, str]]
    #: The table as the writes name it, and the epochs, in the words of an error.
    name: str
    owner: str

    def committed(self) -> list[int]:
        """After the catalog took it: what only a committed snapshot may tidy; the snapshots' ids."""
        for write, write_id in self.unused:  # prepared at persist, not listed by the snapshot: nothing ever will
            tidy(self.table.io, write, write_id, unused=True)
        return self.snapshot_ids


def commit_snapshots(
    table: Table, snapshots: Sequence[EpochSnapshot], *, branch: str, fault: Callable[[str], None]
) -> list[int]:
    """``stage_snapshots``, then commit the table's transaction once. The snapshots' ids;
    ``SinkCommitConflict`` when the table moved."""
    staged = stage_snapshots(table, snapshots, branch=branch)
    ids = staged.snapshot_ids
    staged.tx.commit_staged(fault, lambda: f"{staged.owner}: the commit of table {staged.name!r} ({counted(ids)})")
    return staged.committed()


def stage_snapshots(table: Table, snapshots: Sequence[EpochSnapshot], *, branch: str) -> StagedSnapshots:
    """Stage each epoch's schema changes, name mapping and marked snapshot, in order, in one
    transaction of ``table``.

    An upsert's key becomes the table's identifier fields when the table has none and its columns
    allow it. An overwrite removes exactly its replaced files in the same step as it adds the new ones.
    """
    refuse_stacked_schema_changes(snapshots)
    for staged in snapshots:
        refuse_stale_placeholders(table, staged.write, branch, staged.revision[1] if staged.revision else [])
    name, owner = snapshots[0].write.table, describe_epochs([staged.pre_commit for staged in snapshots])
    tx = SinkTransaction(table)
    snapshot_ids: list[int] = []
    unused: list[tuple[TableWrite, str]] = []
    with tx.staging(owner, name, branch):
        previous: StackedFastAppend | None = None
        for position, staged in enumerate(snapshots):
            pre_commit, write = staged.pre_commit, staged.write
            if staged.to_add:
                with tx.update_schema() as update:
                    for column in staged.to_add:
                        update.add_column(column.name, column.type, doc=column.doc, required=False)
                check_added_field_ids(tx.table_metadata.schema(), write)  # the ids the files carry
            key = identifier_update(tx.table_metadata, write)
            if key:
                with tx.update_schema() as update:
                    update.set_identifier_fields(*key)
            if position == 0:
                _ensure_name_mapping(tx)  # once: a later schema change keeps the mapping current
            number, to_replace = staged.revision or (0, [])
            marker = marker_properties(
                pre_commit.sink_id,
                pre_commit.epoch,
                pre_commit.write_id,
                number,
                SnapshotRange.of_positions(pre_commit.source_positions),
                branch=branch,
            )
            snapshot: StackedFastAppend | SpecAwareOverwrite
            own = True  # the snapshot writes its manifests itself, not listing those persist wrote
            if staged.revision is None:
                snapshot = tx.stacked_append(branch=branch, snapshot_properties=marker, previous=previous)
                appended = usable_manifests(tx.table_metadata, write, table.io, snapshot.snapshot_id)
                if appended is not None:
                    snapshot.use_prepared(*appended)
                    own = False
            else:
                snapshot = tx.replace_files(branch=branch, snapshot_properties=marker)
                replacing = usable_replacement(tx.table_metadata, write, table.io, branch, to_replace)
                if replacing is not None:
                    snapshot.use_prepared(*replacing)
                    own = False
                elif to_replace and to_replace[0] is PREPARED_FILE:  # the table changed under the staging
                    raise SinkCommitConflict(f"{owner}: table {name!r} no longer takes the prepared snapshot")
                for replaced in to_replace if own else []:
                    snapshot.delete_data_file(replaced)
            if own:
                for data_file in _staged_data_files(tx, pre_commit, write):
                    snapshot.append_data_file(data_file)
                if write.prepared is not None:
                    unused.append((write, pre_commit.write_id))
            # Writes the manifests; stages the snapshot and AssertRefSnapshotId(the head checked
            # before). Staged before the next one is created, so that one's parent is this one.
            snapshot.commit()
            previous = snapshot if isinstance(snapshot, StackedFastAppend) else None
            snapshot_ids.append(int(snapshot.snapshot_id))
            retire_audit(tx, pre_commit, branch)
    return StagedSnapshots(table, tx, snapshot_ids, unused, name, owner)


def retire_audit(tx: SinkTransaction, pre_commit: PreCommit, branch: str) -> None:
    """A publish takes its write's audit branch and audit snapshot away in its own transaction
    (design.md D23): once the write is on the sink's branch nothing reads them, and a publish and its
    clean-up that could be parted by a crash would leave a branch behind. Only a branch whose head
    is this write's audit snapshot goes; a commit onto the audit branch itself retires nothing."""
    audit = audit_branch_name(pre_commit.sink_id, pre_commit.epoch)
    ref = tx.table_metadata.refs.get(audit)
    if branch == audit or ref is None:
        return
    head = tx.table_metadata.snapshot_by_id(ref.snapshot_id)
    props = None if head is None else marker_of(head)
    if props is None or AUDIT_BRANCH_KEY not in props or props.get(WRITE_ID_KEY) != pre_commit.write_id:
        return
    tx.retire(audit, ref.snapshot_id)


def _ensure_name_mapping(tx: SinkTransaction) -> None:
    """Give a table without a name mapping one, from its staged schema.

    Spark and pyarrow write Parquet without Iceberg field ids; readers resolve columns through the
    name mapping. ``update_schema`` keeps an existing mapping current (stage schema changes first),
    but does not create one.
    """
    if tx.table_metadata.name_mapping() is None:
        mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})


def _staged_data_files(tx: SinkTransaction, pre_commit: PreCommit, write: TableWrite) -> list[DataFile]:
    """The write's ``DataFile`` entries against the table as staged so far, in the spec the files
    were written for (not necessarily the table's default)."""
    metadata = tx.table_metadata
    spec = write_spec(metadata, write, owner=pre_commit.describe())
    return build_data_files(
        write.data_files,
        schema=metadata.schema(),
        spec=spec,
        spec_id=spec.spec_id,
        table=write.table,
    )


def describe_epochs(pre_commits: Sequence[PreCommit]) -> str:
    """The epochs of one table's commit, in the words of an error."""
    first, last = pre_commits[0], pre_commits[-1]
    if len(pre_commits) == 1:
        return first.describe()
    return f"sink {first.sink_id!r} epochs {first.epoch} to {last.epoch} ({len(pre_commits)} epochs in one commit)"


def counted(snapshot_ids: list[int]) -> str:
    if len(snapshot_ids) == 1:
        return f"snapshot {snapshot_ids[0]}"
    return f"{len(snapshot_ids)} snapshots, the last {snapshot_ids[-1]}"


# A commit's plans as the Iceberg committer (``committer.py``) keeps them: a table's prepared
# state, how long it stays usable, and one plan's write to one table of a commit.

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
    #: Whether ``prepare`` found the write's files in storage (``check_files``, as ``FileCheck`` says).
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
