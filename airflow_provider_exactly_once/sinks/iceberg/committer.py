"""The Iceberg side of the two-phase commit: one idempotent snapshot per table per epoch.

design.md, 'The Iceberg commit' is the specification; the comments below say where pyiceberg's own behaviour
has to be worked around to meet it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ManageSnapshots
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from airflow_provider_exactly_once.core.coordinator import COMMIT_RETRIES, NO_METRICS, Metrics, safe
from airflow_provider_exactly_once.core.errors import (
    CommitConflictExhausted,
    CommitRefused,
    ExactlyOnceError,
    ForeignWriteVisible,
    InvalidPreCommit,
    InvalidSinkConfig,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.ports import (
    EMPTY,
    CommitPlan,
    CommittedTables,
    FileCheck,
    Kind,
    ReplacedWrite,
    VisibleEpoch,
    WriteKind,
)
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import (
    delete_locations,
    load_table,
    missing_in_locations,
    require_files,
    unavailable_when_unreachable,
)
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import (
    PREPARED_FRESH_S,
    EpochSnapshot,
    TableEntry,
    TablePlan,
    commit_snapshots,
    describe_epochs,
    refuse_stacked_schema_changes,
)
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    AUDIT_BRANCH_KEY,
    EPOCH_KEY,
    SINK_ID_KEY,
    WRITE_ID_KEY,
    AddedFiles,
    audit_branch_name,
    check_horizon,
    find_marker,
    marker_of,
    recent_ancestry,
    recent_snapshots,
    refuse_if_referenced,
    sink_markers,
)
from airflow_provider_exactly_once.sinks.iceberg.overwrites import (
    delete_shared_manifests,
    files_replaced,
    preparer,
    still_referenced,
    unrecorded,
    upsert_files_to_replace,
)
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import staged_pre_commit, tidy
from airflow_provider_exactly_once.sinks.iceberg.table_transactions import (
    RouteMissing,
    TableTransactions,
    report_torn,
    stage_together,
)
from airflow_provider_exactly_once.sinks.iceberg.transaction import SinkCommitConflict
from airflow_provider_exactly_once.sinks.iceberg.write_check import CheckedWrites, ColumnToAdd, check_location

#: The fault point of every table load; those around the catalog update are ``transaction.py``'s.
FAULT_LOADED = "iceberg.loaded"

#: One table's part of a commit: the table as loaded, the entries it takes, their snapshots.
_Staged = tuple[Table, list[TableEntry], list[EpochSnapshot]]


def _remove_audit_branch(
    table: Table, pre_commit: PreCommit, branch: str, not_before_ms: int
) -> ManageSnapshots | None:
    """The write's audit branch removed, unless it holds another write's audit of the epoch."""
    if branch not in table.metadata.refs:
        return None
    found = find_marker(
        table.metadata, pre_commit.sink_id, pre_commit.epoch, branch=branch, not_before_ms=not_before_ms
    )
    if found is not None and found[1] != pre_commit.write_id:
        return None
    return table.manage_snapshots().remove_branch(branch)


def _audits_write(snapshot: Snapshot, pre_commit: PreCommit) -> bool:
    props = marker_of(snapshot)
    return (
        props is not None
        and props[SINK_ID_KEY] == pre_commit.sink_id
        and props[EPOCH_KEY] == str(pre_commit.epoch)
        and props.get(WRITE_ID_KEY) == pre_commit.write_id
        and AUDIT_BRANCH_KEY in props
    )


class IcebergSinkCommitter:
    """``core.ports.SinkCommitter`` for Iceberg tables reached through one pyiceberg catalog.

    Every table of a pre-commit gets its own snapshot with its own marker, so each is idempotent on
    its own. Where the catalog commits several tables at once, a fan-out's go in one transaction
    (``table_transactions``, D18); elsewhere a crash between two tables leaves the first committed,
    and the next attempt finds its marker and commits only the rest.
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        branch: str = "main",
        clock_skew: timedelta = timedelta(minutes=10),
        max_attempts: int = 8,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 5.0,
        allow_schema_evolution: bool = False,
        fault: FaultHook = no_faults,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        if not isinstance(catalog, Catalog):
            raise InvalidSinkConfig(f"catalog must be a pyiceberg Catalog, got {type(catalog).__name__}")
        if not isinstance(branch, str) or not branch.strip():
            raise InvalidSinkConfig(f"branch must be a non-empty branch name, got {branch!r}")
        if not isinstance(clock_skew, timedelta) or clock_skew < timedelta(0):
            raise InvalidSinkConfig(f"clock_skew must be a non-negative timedelta, got {clock_skew!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidSinkConfig(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        for name, value in (("backoff_initial_s", backoff_initial_s), ("backoff_max_s", backoff_max_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidSinkConfig(f"{name} must be a non-negative number of seconds, got {value!r}")
        if backoff_max_s < backoff_initial_s:
            raise InvalidSinkConfig(
                f"backoff_max_s ({backoff_max_s}) must not be smaller than backoff_initial_s ({backoff_initial_s})"
            )
        if not isinstance(allow_schema_evolution, bool):
            raise InvalidSinkConfig(f"allow_schema_evolution must be a bool, got {allow_schema_evolution!r}")
        if not callable(fault):
            raise InvalidSinkConfig("fault must be callable")
        self.catalog = catalog
        #: Whether the catalog commits a fan-out's tables in one transaction (``table_transactions``).
        self.transactions = TableTransactions(catalog)
        self.branch = branch
        self._clock_skew = clock_skew
        self.max_attempts = max_attempts
        self._backoff_initial_s = float(backoff_initial_s)
        self._backoff_max_s = float(backoff_max_s)
        self._allow_schema_evolution = allow_schema_evolution
        self.fault: Callable[[str], None] = fault
        #: Table name -> the UUID of the table this committer last loaded under that name.
        self._uuids: dict[str, str] = {}
        self._added_files = AddedFiles()
        self._checked = CheckedWrites()
        #: Write location -> the FileIO ``stage`` wrote its manifest with, until ``tidy`` runs.
        self._staged: dict[str, FileIO] = {}
        #: Conflict retries are reported here (``core.coordinator.COMMIT_RETRIES``); settable after
        #: construction because sink configs build committers without knowing the metrics backend.
        self.metrics: Metrics = safe(metrics)

    # -- SinkCommitter --------------------------------------------------------------------------

    def prepare(
        self, pre_commit: PreCommit, *, replaces: ReplacedWrite | None = None, check_files: FileCheck = FileCheck.NONE
    ) -> CommitPlan:
        """Load and check every table of the write (and a revision's replaced files in it).

        The plan keeps each loaded table: the coordinator prepares immediately before recording its
        commit decision and committing, and loading and checking a table with a long history again
        milliseconds later would double the commit's metadata cost. ``commit`` uses them only while
        fresh (``PREPARED_FRESH_S``), and its append asserts the branch head they showed; nor does it
        look again for the files ``check_files`` found (``catalog_access.missing_in_locations``: the
        write's own manifests, or one listing of each write location).
        """
        return self._prepare(pre_commit, replaces, {}, time.monotonic(), check_files)

    def prepare_batch(self, pre_commits: Sequence[PreCommit]) -> list[CommitPlan | None]:
        """``core.ports.BatchCommitter``: per write, in order, its plan, checked against each table
        loaded once for the whole batch; ``None`` for a write that must commit on its own (more than
        an append, it adds columns, or the check refuses it: its own commit then says why, and
        records it on its row)."""
        prepared_at = time.monotonic()  # one for all: a table loaded for one plan serves the next
        loaded: dict[str, Table] = {}
        plans: list[CommitPlan | None] = []
        for pre_commit in pre_commits:
            plan: CommitPlan | None = None
            with contextlib.suppress(ExactlyOnceError):  # refused: its own commit says why
                if WriteKind.of(pre_commit).batches:
                    plan = self._prepare(pre_commit, None, loaded, prepared_at, FileCheck.EVERY_FILE)
            if plan is not None and any(isinstance(t, TablePlan) and t.to_add for t in plan.prepared.values()):
                plan = None  # a schema change staged before its append: alone
            plans.append(plan)
        return plans

    def _prepare(
        self,
        pre_commit: PreCommit,
        replaces: ReplacedWrite | None,
        loaded: dict[str, Table],
        prepared_at: float,
        check_files: FileCheck = FileCheck.NONE,
    ) -> CommitPlan:
        """``prepare``, loading only the tables ``loaded`` lacks (and adding them to it)."""
        prepared: dict[str, TablePlan] = {}
        checked = check_files is not FileCheck.NONE
        for write in pre_commit.tables:
            if write.table not in loaded:
                loaded[write.table] = self.load(write.table)
            table = loaded[write.table]
            to_add = self.check(table, pre_commit, write)
            to_replace = self._to_replace(table, pre_commit, write, replaces)
            prepared[write.table] = TablePlan(write, table, to_add, to_replace, files_checked=checked)
        if checked:
            loaded_writes = [(plan.write, plan.table) for plan in prepared.values()]
            require_files(pre_commit, loaded_writes, every_file=check_files is FileCheck.EVERY_FILE)
        return CommitPlan(pre_commit, replaces, prepared, prepared_at=prepared_at, prepared_by=self)

    def stage(self, plan: CommitPlan) -> PreCommit:
        """The manifests of the write's snapshots (``overwrites.preparer``), written against the
        tables ``prepare`` loaded and checked (an upsert's rewritten files as it found them)."""
        if not (kind := plan.kind).stages_manifests:
            return plan.pre_commit
        ready = {name: s for name, s in plan.prepared.items() if isinstance(s, TablePlan) and not s.to_add}
        self._staged.update({plan.pre_commit.table(name).location: s.table.io for name, s in ready.items()})
        prepare = preparer(kind, {name: s.to_replace for name, s in ready.items()}, self.branch)
        return staged_pre_commit(plan.pre_commit, {name: s.table for name, s in ready.items()}, prepare)

    def tidy(self, staged: PreCommit, recorded: PreCommit | None) -> None:
        for write in staged.tables:
            io = self._staged.pop(write.location, None)
            if io is not None:
                kept = write if recorded is None else recorded.table(write.table)
                tidy(io, kept, staged.write_id, only_staged=recorded is None)
                if recorded is not None:  # another attempt's row: what this one wrote outside its location
                    delete_shared_manifests(staged, [(unrecorded(write, kept), io)])

    def identities(self, pre_commit: PreCommit) -> Mapping[str, str]:
        identities: dict[str, str] = {}
        for write in pre_commit.tables:
            if write.table not in self._uuids:
                self.load(write.table)
            identities[write.table] = self._uuids[write.table]
        return identities

    def check(self, table: Table, pre_commit: PreCommit, write: TableWrite) -> list[ColumnToAdd]:
        return self._checked.check(
            table.metadata,
            table.metadata_location,
            write,
            branch=self.branch,
            allow_schema_evolution=self._allow_schema_evolution,
            owner=pre_commit.describe(),
        )

    def find_committed(self, pre_commit: PreCommit, since: datetime) -> VisibleEpoch:
        not_before_ms = self.not_before_ms(since)
        tables: dict[str, str] = {}
        write_ids: dict[str, str | None] = {}
        for write in pre_commit.tables:
            table = self.load(write.table)
            found = find_marker(
                table.metadata, pre_commit.sink_id, pre_commit.epoch, branch=self.branch, not_before_ms=not_before_ms
            )
            if found is not None:
                tables[write.table] = str(found[0])
                write_ids[write.table] = found[1] or None
        return VisibleEpoch(tables=tables, write_ids=write_ids)

    # -- write, audit, publish (design.md D23) ---------------------------------------------------

    def audit_branch(self, pre_commit: PreCommit) -> str:
        return audit_branch_name(pre_commit.sink_id, pre_commit.epoch)

    def commit_audit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        """The write committed onto its audit branch, as the sink's own commit would (marker, retries,
        checks), on a copy of this committer bound to that branch; the branch starts at the sink
        branch's head, so that the audit reads the table as publishing the write would leave it.

        A fresh prepared plan's tables open the branch and then carry the commit, so that the audit
        commit loads, checks and lists the write's files once, as a plain commit does (its checks,
        made against the sink branch's head, hold for a branch made at that head)."""
        pre_commit = plan.pre_commit
        branch, not_before_ms = self.audit_branch(pre_commit), self.not_before_ms(since)
        auditing = copy.copy(self)
        auditing.branch = branch
        fresh = plan.fresh_state(self, PREPARED_FRESH_S)
        on_branch: dict[str, object] = {}
        for write in pre_commit.tables:
            ready = fresh.get(write.table)
            prepared = ready if isinstance(ready, TablePlan) else None
            table = self._update_refs(
                write.table,
                lambda table: self._open_audit_branch(table, pre_commit, branch, not_before_ms),
                loaded=None if prepared is None else prepared.table,
            )
            if prepared is not None:
                on_branch[write.table] = dataclasses.replace(prepared, table=table)
        audit_plan = (
            CommitPlan(pre_commit, plan.replaces, on_branch, plan.prepared_at, auditing)
            if on_branch
            else CommitPlan(pre_commit, plan.replaces)
        )
        return auditing.commit(audit_plan, since, allow_beyond_horizon=allow_beyond_horizon)

    def _open_audit_branch(
        self, table: Table, pre_commit: PreCommit, branch: str, not_before_ms: int
    ) -> ManageSnapshots | None:
        """The audit branch at the sink branch's head, unless it holds this write already; a branch
        left by another write of the epoch (replaced, rejected) starts again."""
        found = find_marker(
            table.metadata, pre_commit.sink_id, pre_commit.epoch, branch=branch, not_before_ms=not_before_ms
        )
        if found is not None and found[1] == pre_commit.write_id:
            return None
        head = table.metadata.snapshot_by_name(self.branch)
        manage = table.manage_snapshots()
        if branch in table.metadata.refs:
            manage = manage.remove_branch(branch)
        return manage.create_branch(head.snapshot_id, branch) if head is not None else manage

    def drop_audit(self, pre_commit: PreCommit, since: datetime) -> None:
        for write in pre_commit.tables:
            self._drop_audit_in(write.table, pre_commit, self.not_before_ms(since))

    def _drop_audit_in(self, name: str, pre_commit: PreCommit, not_before_ms: int) -> Table:
        """``drop_audit`` in one table; the table as it is afterwards. Only snapshots of the write's
        audit (``AUDIT_BRANCH_KEY``) that no branch or tag reads are expired: never a published one."""
        branch = self.audit_branch(pre_commit)
        table = self.load(name)
        if _remove_audit_branch(table, pre_commit, branch, not_before_ms) is not None:
            self._update_refs(name, lambda t: _remove_audit_branch(t, pre_commit, branch, not_before_ms))
            table = self.load(name)
        recent = recent_snapshots(table.metadata, not_before_ms).values()
        ours = {snapshot.snapshot_id for snapshot in recent if _audits_write(snapshot, pre_commit)}
        if not ours:
            return table
        read = {
            s.snapshot_id
            for ref in table.metadata.refs
            for s in recent_ancestry(table.metadata, branch=ref, not_before_ms=not_before_ms)
        }
        if expired := sorted(ours - read):
            expiry = table.maintenance.expire_snapshots()
            for snapshot_id in expired:
                expiry = expiry.by_id(snapshot_id)
            expiry.commit()
            table = self.load(name)
        return table

    def _update_refs(
        self, name: str, change: Callable[[Table], ManageSnapshots | None], *, loaded: Table | None = None
    ) -> Table:
        """``change`` of the table's refs, against ``loaded`` first, if given, then against the table
        loaded afresh for each of up to eight attempts: a concurrent commit to the table refuses the
        update, which is then made again. Returns the table as the change left it (pyiceberg updates
        the committed object in place)."""
        for attempt in range(8):
            table = loaded if attempt == 0 and loaded is not None else self.load(name)
            manage = change(table)
            if manage is None:
                return table
            try:
                manage.commit()
                return table
            except CommitFailedException:
                if attempt == 7:
                    raise
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def missing_files(self, pre_commit: PreCommit) -> Sequence[str]:
        return missing_in_locations(pre_commit, [(write, self.load(write.table)) for write in pre_commit.tables])

    def commit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        """One epoch: the batch of one (``commit_batch``)."""
        return self.commit_batch([plan], [since], allow_beyond_horizon=allow_beyond_horizon)[0]

    def commit_batch(
        self, plans: Sequence[CommitPlan], since: Sequence[datetime], *, allow_beyond_horizon: bool = False
    ) -> list[CommittedTables]:
        """Commit the writes of ``plans`` (``since[i]`` is the row's ``created_at`` of ``plans[i]``),
        one catalog commit per table; per plan, every table's snapshot id or ``EMPTY``.

        Several plans (recovery's backlog, ``core.ports.BatchCommitter``) must be appends in epoch
        order: each gets its own marked snapshot, stacked on the one before. Idempotent: a table
        already showing a write's marker is skipped for it. Raises for the batch as a whole.
        """
        if len(plans) > 1:
            for plan in plans:
                if not plan.kind.batches:
                    raise CommitRefused(f"{plan.pre_commit.describe()}: only appends are committed in a batch")
        by_table: dict[str, list[TableEntry]] = {}
        for index, (plan, created_at) in enumerate(zip(plans, since, strict=True)):
            not_before_ms = self.not_before_ms(created_at)
            for write in plan.pre_commit.tables:
                by_table.setdefault(write.table, []).append(TableEntry(index, plan, write, created_at, not_before_ms))

        committed: list[dict[str, str]] = [{} for _ in plans]
        staged: list[_Staged] = []
        unchecked: dict[int, list[tuple[TableWrite, Table]]] = {}  # files no fresh plan found all there
        # Every table is checked before any is changed: a refusal on the third table of a fan-out
        # must not leave the first two committed with an epoch that can never complete.
        for name, entries in by_table.items():
            table, ready = self._table_for(name, entries)
            to_commit: list[TableEntry] = []
            snapshots: list[EpochSnapshot] = []
            for entry, found in zip(entries, self._visible(table, entries), strict=True):
                if found is not None:
                    committed[entry.index][name] = str(found)
                    continue
                prepared = ready.get(entry.index)
                to_replace = prepared.to_replace if prepared else self._to_replace(table, *entry.write_of)
                if entry.write.is_empty and not to_replace and not entry.supersedes_a_marker:
                    committed[entry.index][name] = EMPTY
                    continue
                if not allow_beyond_horizon:
                    self.check_horizon(table, entry.plan.pre_commit, entry.write, entry.since)
                to_add = prepared.to_add if prepared else self.check(table, entry.plan.pre_commit, entry.write)
                if prepared is None or not prepared.files_checked:  # a resumed commit, or a stale plan
                    unchecked.setdefault(entry.index, []).append((entry.write, table))
                to_commit.append(entry)
                snapshots.append(entry.snapshot(to_add, to_replace))
            refuse_stacked_schema_changes(snapshots)
            staged.append((table, to_commit, snapshots))

        for index, loaded in unchecked.items():  # once per call: files do not come back for a retry
            require_files(plans[index].pre_commit, loaded)
        pending = [group for group in staged if group[1]]
        together = len(pending) > 1 and self.transactions.offered
        if together:
            report_torn(plans, committed, [entries for _, entries, _ in pending], self.catalog.name)
        for group in [pending] if together else [[one] for one in pending]:
            try:
                done = self._commit_tables(group)
            except RouteMissing:  # learnt on the first try, before anything was applied
                done = {key: value for one in group for key, value in self._commit_tables([one]).items()}
            for (index, name), snapshot_id in done.items():
                committed[index][name] = snapshot_id
        return [
            {write.table: committed[i][write.table] for write in plan.pre_commit.tables} for i, plan in enumerate(plans)
        ]

    def delete_replaced(
        self, pre_commit: PreCommit, removed_by: Mapping[str, str], recorded_at: datetime
    ) -> int | None:
        """Delete a replaced write's files once no retained snapshot may list them; ``None``: not yet.

        The replacing snapshots removed the files from the table; every older snapshot still lists
        them (``overwrites.still_referenced``), so they wait for the table's snapshot expiry.
        """
        recorded_ms = self.not_before_ms(recorded_at)
        loaded: list[tuple[TableWrite, Table]] = []
        for write in pre_commit.tables:
            table = self.load(write.table)
            check_location(table.metadata, write)
            what = f"{pre_commit.describe()}: could not read the history of table {write.table!r}"
            # A write that added no file left nothing in its location for any snapshot to list.
            with unavailable_when_unreachable(what, table.io.properties):
                if write.data_files and still_referenced(table, removed_by, write.table, recorded_ms) is not None:
                    return None
            loaded.append((write, table))
        return delete_locations(pre_commit, loaded)

    def delete_write(self, pre_commit: PreCommit, since: datetime) -> int:
        not_before_ms = self.not_before_ms(since)
        loaded: list[tuple[TableWrite, Table]] = []
        # All tables are cleared before anything is deleted, so a refusal leaves every file in place.
        for write in pre_commit.tables:
            # An audit of the write (design.md D23) goes first: its snapshot would hold the files.
            table = self._drop_audit_in(write.table, pre_commit, not_before_ms)
            check_location(table.metadata, write)
            # Reads the manifests of the snapshots since the write: object storage, which may be down.
            what = f"{pre_commit.describe()}: could not check what table {write.table!r} references"
            with unavailable_when_unreachable(what, table.io.properties):
                refuse_if_referenced(
                    table,
                    pre_commit,
                    write,
                    not_before_ms,
                    added_files=self._added_files,
                    check_horizon=functools.partial(self.check_horizon, table, pre_commit, write, since),
                )
            loaded.append((write, table))
        return delete_locations(pre_commit, loaded) + delete_shared_manifests(
            pre_commit, [(w, t.io) for w, t in loaded]
        )

    # -- loading and markers --------------------------------------------------------------------

    def load(self, name: str) -> Table:
        table = load_table(self.catalog, name)
        self.adopt(name, table)
        self.fault(FAULT_LOADED)
        return table

    def adopt(self, name: str, table: Table) -> None:
        """Remember the identity of the table under ``name`` that this committer commits into."""
        self._uuids[name] = str(table.metadata.table_uuid)

    def retrying(self) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_random_exponential(multiplier=self._backoff_initial_s, max=self._backoff_max_s),
            retry=retry_if_exception_type(SinkCommitConflict),
            reraise=True,
        )

    def not_before_ms(self, since: datetime) -> int:
        if not isinstance(since, datetime) or since.tzinfo is None or since.utcoffset() is None:
            raise InvalidPreCommit(f"since must be a timezone-aware datetime, got {since!r}")
        return int((since - self._clock_skew).timestamp() * 1000)

    def check_horizon(self, table: Table, pre_commit: PreCommit, write: TableWrite, since: datetime) -> None:
        owner, not_before_ms = pre_commit.describe(), self.not_before_ms(since)
        check_horizon(
            table.metadata,
            self.branch,
            owner=owner,
            table=write.table,
            since=since,
            not_before_ms=not_before_ms,
            clock_skew=self._clock_skew,
        )

    def _table_for(self, name: str, entries: list[TableEntry]) -> tuple[Table, dict[int, TablePlan]]:
        """The table a commit goes into: the one a plan prepared, while fresh, else a fresh load; and
        the plans (by position) prepared on that very table, whose checks then hold."""
        prepared: list[tuple[int, TablePlan]] = []
        for entry in entries:
            ready = entry.plan.fresh_state(self, PREPARED_FRESH_S).get(name)
            if isinstance(ready, TablePlan):
                prepared.append((entry.index, ready))
        if not prepared:
            return self.load(name), {}
        table = prepared[0][1].table
        self.adopt(name, table)
        return table, {index: ready for index, ready in prepared if ready.table is table}

    def _visible(self, table: Table, entries: list[TableEntry]) -> list[int | None]:
        """Per entry, the snapshot of its write the table shows (step 2 of the commit), or ``None``:
        one walk for every entry, each held to its own row's bound. A revision finds the marker of
        the write it replaces as the newest until it commits itself; the epoch committed by any
        other write is ``ForeignWriteVisible``."""
        oldest = min(entry.not_before_ms for entry in entries)
        sink_id = entries[0].plan.pre_commit.sink_id
        markers = sink_markers(table.metadata, sink_id, branch=self.branch, not_before_ms=oldest)
        found: list[int | None] = []
        for entry in entries:
            pre_commit = entry.plan.pre_commit
            marker = markers.get(str(pre_commit.epoch))
            if marker is None or marker[2] < entry.not_before_ms or marker[1] == entry.plan.kind.replaced_write_id:
                found.append(None)
                continue
            snapshot_id, write_id, _ = marker
            if write_id != pre_commit.write_id:
                raise ForeignWriteVisible(
                    f"{pre_commit.describe()}: table {'.'.join(table.name())!r} already shows this epoch in "
                    f"snapshot {snapshot_id}, committed by write {write_id!r}; nothing was changed"
                )
            found.append(snapshot_id)
        return found

    # -- committing -----------------------------------------------------------------------------

    def _to_replace(
        self, table: Table, pre_commit: PreCommit, write: TableWrite, replaces: ReplacedWrite | None
    ) -> list[DataFile]:
        if Kind.of_table(write).by_key:
            # The files it rewrote; a revision's also the revised write's (``core.decisions``).
            what = f"{pre_commit.describe()}: could not read the files the upsert rewrote in table {write.table!r}"
            with unavailable_when_unreachable(what, table.io.properties):
                return upsert_files_to_replace(table, self.branch, pre_commit, write, replaces)
        replaced = WriteKind.of(pre_commit, replaces).replaces
        if replaced is None:
            return []
        what = f"{pre_commit.describe()}: could not read the replaced files in table {write.table!r}"
        with unavailable_when_unreachable(what, table.io.properties):  # reads the table's manifests
            return files_replaced(table, self.branch, pre_commit, write, replaced)

    def _commit_tables(self, group: list[_Staged]) -> dict[tuple[int, str], str]:
        """The snapshots of one table, or of every table of a fan-out where the catalog commits them
        in one transaction; per (plan position, table), the snapshot id. Our own bounded retry: every
        attempt after a conflict re-loads the tables, leaves out the entries they show by then, and
        checks the others again."""
        done: dict[tuple[int, str], str] = {}
        todo = group
        try:
            for attempt in self.retrying():
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        todo = self._still_to_commit(group, done)
                    ids: list[list[int]] = []
                    if len(todo) == 1:
                        table, _, snapshots = todo[0]
                        ids = [commit_snapshots(table, snapshots, branch=self.branch, fault=self.fault)]
                    elif todo:
                        staged = stage_together([(table, snapshots) for table, _, snapshots in todo], self.branch)
                        ids = self.transactions.commit(staged, self.fault)
                    for (_, entries, _), table_ids in zip(todo, ids, strict=True):
                        for entry, snapshot_id in zip(entries, table_ids, strict=True):
                            done[entry.index, entry.write.table] = str(snapshot_id)
        except SinkCommitConflict as exc:
            entries = [entry for _, group_entries, _ in group for entry in group_entries]
            owner = describe_epochs(list({id(e.plan): e.plan.pre_commit for e in entries}.values()))
            names = ", ".join(repr(name) for name in dict.fromkeys(e.write.table for e in entries))
            raise CommitConflictExhausted(
                f"{owner}: table(s) {names} changed under every one of {self.max_attempts} commit attempts: {exc}"
            ) from exc
        return done

    def _still_to_commit(self, group: list[_Staged], done: dict[tuple[int, str], str]) -> list[_Staged]:
        """After a conflict: each table re-loaded, the entries it shows by now recorded in ``done``,
        the others checked again and staged anew."""
        todo: list[_Staged] = []
        for _, entries, _ in group:
            name = entries[0].write.table
            self.metrics.incr(COMMIT_RETRIES, 1, {"sink_id": entries[0].plan.pre_commit.sink_id, "table": name})
            table = self.load(name)
            left: list[TableEntry] = []
            snapshots: list[EpochSnapshot] = []
            for entry, found in zip(entries, self._visible(table, entries), strict=True):
                if found is not None:
                    done[entry.index, name] = str(found)
                    continue
                to_add = self.check(table, entry.plan.pre_commit, entry.write)
                left.append(entry)
                snapshots.append(entry.snapshot(to_add, self._to_replace(table, *entry.write_of)))
            if left:
                todo.append((table, left, snapshots))
        return todo
