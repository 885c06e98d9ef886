"""Several epochs' appends to one table in one catalog commit: how recovery clears a backlog.

Each epoch still gets its own snapshot with its own marker (invariant 1). The transaction stacks one
marked fast-append per epoch, each staged on the one before, in epoch order, so the table's history
is the one a commit per epoch would have made; the catalog writes one metadata file and swaps it in
once, so the batch lands whole or not at all. What makes a commit per epoch cost O(history) -
loading the table, reading the parent's manifest list, writing a metadata file that lists every
snapshot - is then paid once per batch instead of once per epoch.

Everything else is the single commit's (design.md section 5, ``committer.py``, reached through
``plans.BatchHost``): the marker walk
(one walk for the batch, each epoch held to its own bound), the horizon and file checks before
anything is changed, our own bounded retry that re-reads the markers after a conflict, and an
unknown outcome that deletes nothing. Only appends come here: a revision or an upsert is an
overwrite whose check depends on the table after the epoch before it, so it commits on its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import (
    CommitConflictExhausted,
    CommitRefused,
    ExactlyOnceError,
    ForeignWriteVisible,
    MissingDataFiles,
)
from airflow_provider_exactly_once.core.observe import COMMIT_RETRIES
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan, CommittedTables
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.write_kinds import Kind
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import ensure_name_mapping, staged_data_files
from airflow_provider_exactly_once.sinks.iceberg.markers import marker_properties, sink_markers
from airflow_provider_exactly_once.sinks.iceberg.plans import PREPARED_FRESH_S, BatchHost, TablePlan
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    SinkCommitConflict,
    SinkTransaction,
    StackedFastAppend,
)

__all__ = ["commit_batch", "foreign_write_visible", "prepare_batch"]


@dataclass(frozen=True)
class _Entry:
    """One epoch's write to one table of the batch."""

    index: int
    pre_commit: PreCommit
    write: TableWrite
    since: datetime
    not_before_ms: int


def prepare_batch(committer: BatchHost, pre_commits: Sequence[PreCommit]) -> list[CommitPlan | None]:
    """Per write, in order: its plan, checked against each table loaded once for the whole batch;
    ``None`` for a write that must commit on its own (it adds columns, or the check refuses it: its
    own commit then says why, and records it on its row)."""
    prepared_at = time.monotonic()
    tables: dict[str, Table] = {}
    plans: list[CommitPlan | None] = []
    for pre in pre_commits:
        prepared: dict[str, TablePlan] = {}
        try:
            for write in pre.tables:
                if write.table not in tables:
                    tables[write.table] = committer.load(write.table)
                table = tables[write.table]
                if Kind.of_table(write).by_key or committer.check(table, pre, write):
                    break  # an overwrite, or a schema change staged before the append: alone
                prepared[write.table] = TablePlan(write, table, [], [])
            else:
                plans.append(CommitPlan(pre, None, prepared, prepared_at=prepared_at, prepared_by=committer))
                continue
        except ExactlyOnceError:
            pass
        plans.append(None)
    return plans


def commit_batch(
    committer: BatchHost,
    plans: Sequence[CommitPlan],
    since: Sequence[datetime],
    *,
    allow_beyond_horizon: bool = False,
) -> list[CommittedTables]:
    """Commit the writes of ``plans`` (appends, in epoch order; ``since[i]`` is the row's
    ``created_at`` of ``plans[i]``) with one catalog commit per table; per plan, what
    ``SinkCommitter.commit`` returns. Idempotent as the single commit is: a write a table shows
    already is skipped there. Raises what the single commit raises, for the batch as a whole."""
    by_table: dict[str, list[_Entry]] = {}
    for index, (plan, created_at) in enumerate(zip(plans, since, strict=True)):
        if not plan.kind.batches:
            raise CommitRefused(f"{plan.pre_commit.describe()}: only appends are committed in a batch")
        for write in plan.pre_commit.tables:
            not_before_ms = committer.not_before_ms(created_at)
            by_table.setdefault(write.table, []).append(
                _Entry(index, plan.pre_commit, write, created_at, not_before_ms)
            )

    committed: list[dict[str, str]] = [{} for _ in plans]
    staged: list[tuple[str, Table, list[_Entry]]] = []
    # Every table is checked before any is changed, as in the single commit.
    for name, entries in by_table.items():
        table = _prepared_table(committer, plans, entries) or committer.load(name)
        to_append: list[_Entry] = []
        for entry, found in zip(entries, _visible(committer, table, entries), strict=True):
            if found is not None:
                committed[entry.index][name] = str(found)
            elif entry.write.is_empty:
                committed[entry.index][name] = EMPTY
            else:
                if not allow_beyond_horizon:
                    committer.check_horizon(table, entry.pre_commit, entry.write, entry.since)
                to_append.append(entry)
        staged.append((name, table, to_append))
    for _, table, entries in staged:
        for entry in entries:
            missing = committer.missing_in(entry.pre_commit, [(entry.write, table)])
            if missing:
                raise MissingDataFiles(entry.pre_commit.sink_id, entry.pre_commit.epoch, missing)

    for name, table, entries in staged:
        if entries:
            for entry, snapshot_id in zip(entries, _commit_table(committer, name, table, entries), strict=True):
                committed[entry.index][name] = snapshot_id
    return [
        {write.table: committed[i][write.table] for write in plan.pre_commit.tables} for i, plan in enumerate(plans)
    ]


def _prepared_table(committer: BatchHost, plans: Sequence[CommitPlan], entries: list[_Entry]) -> Table | None:
    """The table ``prepare_batch`` loaded, while fresh; it is one object for the whole batch."""
    ready = plans[entries[0].index].fresh_state(committer, PREPARED_FRESH_S).get(entries[0].write.table)
    if not isinstance(ready, TablePlan):
        return None
    committer.adopt(entries[0].write.table, ready.table)
    return ready.table


def _visible(committer: BatchHost, table: Table, entries: list[_Entry]) -> list[int | None]:
    """Per entry, the snapshot of its write that the table shows (step 2 of the commit), or ``None``;
    ``ForeignWriteVisible`` when it shows the epoch committed by another write."""
    oldest = min(entry.not_before_ms for entry in entries)
    markers = sink_markers(table.metadata, entries[0].pre_commit.sink_id, branch=committer.branch, not_before_ms=oldest)
    found: list[int | None] = []
    for entry in entries:
        marker = markers.get(str(entry.pre_commit.epoch))
        if marker is None or marker[2] < entry.not_before_ms:
            found.append(None)
            continue
        snapshot_id, write_id, _ = marker
        if write_id != entry.pre_commit.write_id:
            raise foreign_write_visible(entry.pre_commit, table, snapshot_id, write_id)
        found.append(snapshot_id)
    return found


def foreign_write_visible(pre_commit: PreCommit, table: Table, snapshot_id: int, write_id: str) -> ForeignWriteVisible:
    """The refusal of a table that shows the epoch committed by another write, for the single commit
    and the batch alike; the table named as the sink names it (pyiceberg's ``name()`` is a tuple)."""
    return ForeignWriteVisible(
        f"{pre_commit.describe()}: table {'.'.join(table.name())!r} already shows this epoch in snapshot "
        f"{snapshot_id}, committed by write {write_id!r}; nothing was changed"
    )


def _commit_table(committer: BatchHost, name: str, table: Table, entries: list[_Entry]) -> list[str]:
    """One table's stacked appends, with the single commit's bounded retry: every attempt after a
    conflict re-loads the table and leaves out the epochs it shows by then."""
    done: dict[int, str] = {}
    try:
        for attempt in committer.retrying():
            with attempt:
                todo = entries
                if attempt.retry_state.attempt_number > 1:
                    sink_id = entries[0].pre_commit.sink_id
                    committer.metrics.incr(COMMIT_RETRIES, 1, {"sink_id": sink_id, "table": name})
                    table = committer.load(name)
                    todo = []
                    for entry, found in zip(entries, _visible(committer, table, entries), strict=True):
                        if found is None:
                            todo.append(entry)
                        else:
                            done[entry.index] = str(found)
                if todo:
                    for entry, snapshot_id in zip(todo, _append_all(committer, name, table, todo), strict=True):
                        done[entry.index] = str(snapshot_id)
    except SinkCommitConflict as exc:
        raise CommitConflictExhausted(
            f"{_describe(entries)}: table {name!r} changed under every one of {committer.max_attempts} commit "
            f"attempts: {exc}"
        ) from exc
    return [done[entry.index] for entry in entries]


def _append_all(committer: BatchHost, name: str, table: Table, entries: list[_Entry]) -> list[int]:
    """Stage one marked append per entry, each on the one before; commit the transaction once."""
    tx = SinkTransaction(table)
    snapshot_ids: list[int] = []
    with tx.staging(_describe(entries), name, committer.branch):
        ensure_name_mapping(tx)  # the batch adds no columns: the mapping of the table's schema
        previous: StackedFastAppend | None = None
        for entry in entries:
            pre, write = entry.pre_commit, entry.write
            data_files = staged_data_files(tx, pre, write)
            marker = marker_properties(pre.sink_id, pre.epoch, pre.write_id)
            append = tx.stacked_append(branch=committer.branch, snapshot_properties=marker, previous=previous)
            for data_file in data_files:
                append.append_data_file(data_file)
            append.commit()  # staged before the next append is created, so that one's parent is this one
            previous = append
            snapshot_ids.append(append.snapshot_id)
    tx.commit_staged(
        committer.fault,
        lambda: (
            f"{_describe(entries)}: the commit of table {name!r} ({len(snapshot_ids)} snapshots, the last "
            f"{snapshot_ids[-1]})"
        ),
    )
    return snapshot_ids


def _describe(entries: list[_Entry]) -> str:
    first, last = entries[0].pre_commit, entries[-1].pre_commit
    if len(entries) == 1:
        return first.describe()
    return f"sink {first.sink_id!r} epochs {first.epoch} to {last.epoch} ({len(entries)} epochs in one commit)"
