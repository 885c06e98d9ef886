"""The Iceberg side of the two-phase commit: one idempotent snapshot per table per epoch.

design.md section 5 is the specification; the comments below say where pyiceberg's own behaviour
has to be worked around to meet it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CommitConflictExhausted,
    InvalidPreCommit,
    InvalidSinkConfig,
    MarkerHorizonExceeded,
    MissingDataFiles,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.observe import COMMIT_RETRIES, NO_METRICS, Metrics, safe
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan, CommittedTables, VisibleEpoch
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.write_kinds import Kind, ReplacedWrite, WriteKind
from airflow_provider_exactly_once.sinks.iceberg.batch import commit_batch, foreign_write_visible, prepare_batch
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table, unavailable_when_unreachable
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import commit_snapshot
from airflow_provider_exactly_once.sinks.iceberg.horizon import check_horizon
from airflow_provider_exactly_once.sinks.iceberg.locations import parse_location
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    EPOCH_KEY,
    SINK_ID_KEY,
    WRITE_ID_KEY,
    find_marker,
    marker_of,
    recent_snapshots,
)
from airflow_provider_exactly_once.sinks.iceberg.plans import PREPARED_FRESH_S, TablePlan
from airflow_provider_exactly_once.sinks.iceberg.references import AddedFiles, files_live_in_refs
from airflow_provider_exactly_once.sinks.iceberg.replacement import files_to_replace, still_referenced
from airflow_provider_exactly_once.sinks.iceberg.schema_check import ColumnToAdd
from airflow_provider_exactly_once.sinks.iceberg.storage import delete_tree, missing_files
from airflow_provider_exactly_once.sinks.iceberg.transaction import SinkCommitConflict
from airflow_provider_exactly_once.sinks.iceberg.upsert_overwrites import upsert_files_to_replace
from airflow_provider_exactly_once.sinks.iceberg.write_check import CheckedWrites, check_location

#: The fault point of every table load; those around the catalog update are ``transaction.py``'s.
FAULT_LOADED = "iceberg.loaded"


class IcebergSinkCommitter:
    """``core.ports.SinkCommitter`` for Iceberg tables reached through one pyiceberg catalog.

    Every table of a pre-commit gets its own snapshot with its own marker, so each is idempotent on
    its own: a crash between two tables of a fan-out leaves the first committed, and the next
    attempt finds its marker and commits only the rest.
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
        self._catalog = catalog
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
        #: Conflict retries are reported here (``core.observe.COMMIT_RETRIES``); settable after
        #: construction because sink configs build committers without knowing the metrics backend.
        self.metrics: Metrics = safe(metrics)

    # -- SinkCommitter --------------------------------------------------------------------------

    def prepare(self, pre_commit: PreCommit, *, replaces: ReplacedWrite | None = None) -> CommitPlan:
        """Load and check every table of the write (and a revision's replaced files in it).

        The plan keeps each loaded table: the coordinator prepares immediately before recording its
        commit decision and committing, and loading and checking a table with a long history again
        milliseconds later would double the commit's metadata cost. ``commit`` uses them only while
        fresh (``PREPARED_FRESH_S``), and its append asserts the branch head they showed.
        """
        prepared_at = time.monotonic()
        prepared: dict[str, TablePlan] = {}
        for write in pre_commit.tables:
            table = self.load(write.table)
            to_add = self.check(table, pre_commit, write)
            prepared[write.table] = TablePlan(
                write, table, to_add, self._to_replace(table, pre_commit, write, replaces)
            )
        return CommitPlan(pre_commit, replaces, prepared, prepared_at=prepared_at, prepared_by=self)

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
            found = self._find_marker(table, pre_commit, not_before_ms)
            if found is not None:
                tables[write.table] = str(found[0])
                write_ids[write.table] = found[1] or None
        return VisibleEpoch(tables=tables, write_ids=write_ids)

    def missing_files(self, pre_commit: PreCommit) -> Sequence[str]:
        return self.missing_in(pre_commit, [(write, self.load(write.table)) for write in pre_commit.tables])

    def commit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        pre_commit, replaces = plan.pre_commit, plan.replaces
        not_before_ms = self.not_before_ms(since)
        fresh = plan.fresh_state(self, PREPARED_FRESH_S)
        committed: dict[str, str] = {}
        to_commit: list[TablePlan] = []
        # Every table is checked before any is changed: a refusal on the third table of a fan-out
        # must not leave the first two committed with an epoch that can never complete.
        for write in pre_commit.tables:
            ready = fresh.get(write.table)
            if isinstance(ready, TablePlan):
                table = ready.table
                self.adopt(write.table, table)
            else:
                ready, table = None, self.load(write.table)
            found = self._marker_of_this_write(table, pre_commit, not_before_ms, replaces)
            if found is not None:
                committed[write.table] = str(found)
                continue
            to_replace = ready.to_replace if ready else self._to_replace(table, pre_commit, write, replaces)
            if write.is_empty and not to_replace:
                committed[write.table] = EMPTY
                continue
            if not allow_beyond_horizon:
                self.check_horizon(table, pre_commit, write, since)
            to_add = ready.to_add if ready else self.check(table, pre_commit, write)
            to_commit.append(TablePlan(write, table, to_add, to_replace))

        self._check_files_exist(pre_commit, to_commit)
        for table_plan in to_commit:
            committed[table_plan.write.table] = self._commit_table(pre_commit, table_plan, not_before_ms, replaces)
        return {write.table: committed[write.table] for write in pre_commit.tables}

    def prepare_batch(self, pre_commits: Sequence[PreCommit]) -> list[CommitPlan | None]:
        """``core.ports.BatchCommitter``: each table loaded once for the batch (``batch.py``)."""
        return prepare_batch(self, pre_commits)

    def commit_batch(
        self, plans: Sequence[CommitPlan], since: Sequence[datetime], *, allow_beyond_horizon: bool = False
    ) -> list[CommittedTables]:
        """``core.ports.BatchCommitter``: the epochs' appends stacked in one catalog commit per table."""
        return commit_batch(self, plans, since, allow_beyond_horizon=allow_beyond_horizon)

    def delete_replaced(
        self, pre_commit: PreCommit, removed_by: Mapping[str, str], recorded_at: datetime
    ) -> int | None:
        """Delete a replaced write's files once no retained snapshot may list them; ``None``: not yet.

        The replacing snapshots removed the files from the table; every older snapshot still lists
        them (``replacement.still_referenced``), so they wait for the table's snapshot expiry.
        """
        recorded_ms = self.not_before_ms(recorded_at)
        loaded: list[tuple[TableWrite, Table]] = []
        for write in pre_commit.tables:
            table = self.load(write.table)
            check_location(table.metadata, write)
            what = f"{pre_commit.describe()}: could not read the history of table {write.table!r}"
            with unavailable_when_unreachable(what, table.io.properties):
                if still_referenced(table, removed_by, write.table, recorded_ms) is not None:
                    return None
            loaded.append((write, table))
        return _delete_locations(pre_commit, loaded)

    def delete_write(self, pre_commit: PreCommit, since: datetime) -> int:
        not_before_ms = self.not_before_ms(since)
        loaded: list[tuple[TableWrite, Table]] = []
        # All tables are cleared before anything is deleted, so a refusal leaves every file in place.
        for write in pre_commit.tables:
            table = self.load(write.table)
            check_location(table.metadata, write)
            # Reads the manifests of the snapshots since the write: object storage, which may be down.
            what = f"{pre_commit.describe()}: could not check what table {write.table!r} references"
            with unavailable_when_unreachable(what, table.io.properties):
                self._refuse_if_referenced(table, pre_commit, write, since, not_before_ms)
            loaded.append((write, table))
        return _delete_locations(pre_commit, loaded)

    # -- loading and markers --------------------------------------------------------------------

    # -- what the batch uses too (``plans.BatchHost``) --------------------------------------------

    def load(self, name: str) -> Table:
        table = load_table(self._catalog, name)
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

    def _find_marker(self, table: Table, pre_commit: PreCommit, not_before_ms: int) -> tuple[int, str] | None:
        return find_marker(
            table.metadata,
            pre_commit.sink_id,
            pre_commit.epoch,
            branch=self.branch,
            not_before_ms=not_before_ms,
        )

    def _marker_of_this_write(
        self, table: Table, pre_commit: PreCommit, not_before_ms: int, replaces: ReplacedWrite | None = None
    ) -> int | None:
        """This write's commit snapshot, or ``None``; a revision finds the marker of the write it
        replaces as the newest until it commits itself."""
        found = self._find_marker(table, pre_commit, not_before_ms)
        if found is None:
            return None
        snapshot_id, write_id = found
        if write_id == WriteKind.of(pre_commit, replaces).replaced_write_id:
            return None
        if write_id != pre_commit.write_id:
            raise foreign_write_visible(pre_commit, table, snapshot_id, write_id)
        return snapshot_id

    # -- committing -----------------------------------------------------------------------------

    def _check_files_exist(self, pre_commit: PreCommit, plans: list[TablePlan]) -> None:
        """Once per commit call, not per conflict retry: the files do not go away while it runs."""
        missing = self.missing_in(pre_commit, [(plan.write, plan.table) for plan in plans])
        if missing:
            raise MissingDataFiles(pre_commit.sink_id, pre_commit.epoch, missing)

    def missing_in(self, pre_commit: PreCommit, writes: Sequence[tuple[TableWrite, Table]]) -> list[str]:
        missing: list[str] = []
        for write, table in writes:
            what = f"{pre_commit.describe()}: could not check the data files of table {write.table!r}"
            with unavailable_when_unreachable(what, table.io.properties):
                paths = [descriptor.path for descriptor in write.data_files]
                missing.extend(missing_files(table.io, paths, under=write.location))
        return missing

    def _to_replace(
        self, table: Table, pre_commit: PreCommit, write: TableWrite, replaces: ReplacedWrite | None
    ) -> list[DataFile]:
        if Kind.of_table(write).by_key:
            # The files it rewrote; a revision's also the revised write's (``upsert_revisions``).
            what = f"{pre_commit.describe()}: could not read the files the upsert rewrote in table {write.table!r}"
            with unavailable_when_unreachable(what, table.io.properties):
                return upsert_files_to_replace(table, self.branch, pre_commit, write, replaces)
        replaced = WriteKind.of(pre_commit, replaces).replaces
        if replaced is None:
            return []
        what = f"{pre_commit.describe()}: could not read the replaced files in table {write.table!r}"
        with unavailable_when_unreachable(what, table.io.properties):  # reads the table's manifests
            return files_to_replace(table, self.branch, pre_commit, replaced, write.table)

    def _commit_table(
        self, pre_commit: PreCommit, plan: TablePlan, not_before_ms: int, replaces: ReplacedWrite | None
    ) -> str:
        """One table, with our own bounded retry: every attempt re-loads and re-checks the marker."""
        write = plan.write
        try:
            for attempt in self.retrying():
                with attempt:
                    table, to_add, to_replace = plan.table, plan.to_add, plan.to_replace
                    if attempt.retry_state.attempt_number > 1:
                        self.metrics.incr(COMMIT_RETRIES, 1, {"sink_id": pre_commit.sink_id, "table": write.table})
                        table = self.load(write.table)
                        found = self._marker_of_this_write(table, pre_commit, not_before_ms, replaces)
                        if found is not None:
                            return str(found)
                        to_add = self.check(table, pre_commit, write)
                        to_replace = self._to_replace(table, pre_commit, write, replaces)
                    number = replaces.revision + 1 if replaces else 0  # 0: an upsert's overwrite of what it rewrote
                    revision = (number, to_replace) if replaces or to_replace else None
                    return str(
                        commit_snapshot(
                            pre_commit, write, table, to_add, revision, branch=self.branch, fault=self.fault
                        )
                    )
        except SinkCommitConflict as exc:
            raise CommitConflictExhausted(
                f"{pre_commit.describe()}: table {write.table!r} changed under every one of "
                f"{self.max_attempts} commit attempts: {exc}"
            ) from exc
        raise AssertionError("unreachable: tenacity either returned or raised")  # pragma: no cover

    # -- deleting -------------------------------------------------------------------------------

    def _refuse_if_referenced(
        self, table: Table, pre_commit: PreCommit, write: TableWrite, since: datetime, not_before_ms: int
    ) -> None:
        """Invariant 4: delete only what is neither marked as ours nor referenced by the table."""
        metadata = table.metadata
        recent = recent_snapshots(metadata, not_before_ms)
        for snapshot in recent.values():
            props = marker_of(snapshot)
            if (
                props is not None
                and props[SINK_ID_KEY] == pre_commit.sink_id
                and props[EPOCH_KEY] == str(pre_commit.epoch)
                and props.get(WRITE_ID_KEY) == pre_commit.write_id
            ):
                raise AbortRefused(
                    f"{pre_commit.describe()}: table {write.table!r} shows this write committed in snapshot "
                    f"{snapshot.snapshot_id}; its files are not deleted"
                )
        try:
            self.check_horizon(table, pre_commit, write, since)
            # Our files can only have entered the table after the row was written: looking at what
            # the recent snapshots added is enough, and costs what happened since, not history.
            candidates: Iterable[str] = self._added_files.of(table, recent.values())
        except MarkerHorizonExceeded:
            # Snapshots that may have added our files could be expired while the files stay live;
            # only a full look at what every ref can still read proves them unreferenced.
            candidates = files_live_in_refs(table)
        root = parse_location(write.location)
        referenced = sorted({path for path in candidates if parse_location(path).is_inside(root)})
        if referenced:
            shown = ", ".join(referenced[:10]) + (f" (and {len(referenced) - 10} more)" if len(referenced) > 10 else "")
            raise AbortRefused(
                f"{pre_commit.describe()}: table {write.table!r} references {len(referenced)} file(s) "
                f"below the write location {write.location!r}: {shown}; nothing is deleted"
            )


def _delete_locations(pre_commit: PreCommit, loaded: list[tuple[TableWrite, Table]]) -> int:
    """Delete each write location, once every table cleared it: the number of files deleted."""
    deleted = 0
    for write, table in loaded:
        what = f"{pre_commit.describe()}: could not delete below {write.location!r}"
        with unavailable_when_unreachable(what, table.io.properties):
            deleted += delete_tree(table.io, write.location)
    return deleted
