"""Reprocessing an upsert epoch (design.md D14): when a write revises the epoch's committed changes,
and against which state of the table it is planned.

A revision of an append epoch swaps one write's files for another's. Changes by key cannot be
swapped like that: the committed write E rewrote files, updating and deleting rows of keys, and
later epochs built on what it left. So the newer write E' is planned at P, the table as it was just
before E (the parent of E's commit snapshot), rewriting every file E rewrote as well as the files
holding its own keys. Its commit removes E's added files and the files it rewrote that E did not,
and adds its own: the table becomes P with E' applied instead of E, with everything committed since
kept. That is well defined only while nothing committed since E touched those files or may hold a
key of E or E'; the commit checks exactly that (``sinks.iceberg.upsert_overwrites``) and refuses
otherwise.

A revision of a revision is planned at the same P: the revised write's own read snapshot.

The write task asks ``revision_basis`` before the Spark job runs; persist asks ``revision_refusal``
of what the job produced. No I/O here: the row says everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .errors import ReprocessRefused
from .generations import is_newer, is_older
from .ports import EMPTY, CommittedTables, EpochRecord
from .precommit import PreCommit, TableWrite
from .status import EpochStatus
from .upserts import RevisionBasis
from .write_kinds import Kind, WriteKind

#: Where the rule is explained to operators; every refusal points there.
DOCUMENTED = "docs/operators.md, 'Reprocessing an upsert epoch'"


def revised_write(
    row: EpochRecord | None, generation: str | None, on_reprocess: str
) -> tuple[str, PreCommit, CommittedTables, Mapping[str, str]] | None:
    """The committed upsert write a write of ``generation`` would replace: its id, pre-commit,
    snapshots and tables' identities; ``None`` when such a write would not revise the epoch.

    A Committed epoch is revised by a newer generation (persist opens the revision). A revision in
    flight (Pending, ``replaces`` set) is written again by its own generation or a newer one (a retry,
    a rewrite after a conflict): that write still replaces the committed write, not the Pending one.
    """
    if on_reprocess != "replace" or row is None or generation is None:
        return None
    if row.status is EpochStatus.COMMITTED and is_newer(generation, row.pre_commit.generation):
        replaced = (row.write_id, row.pre_commit, row.committed or {}, row.table_uuids or {})
    elif row.status is EpochStatus.PENDING and (was := row.kind.replaces) is not None:
        if is_older(generation, row.pre_commit.generation):
            return None
        replaced = (was.write_id, was.pre_commit, was.committed, was.table_uuids or {})
    else:
        return None
    if not WriteKind.of(replaced[1]).by_key:
        return None
    return replaced


def revision_basis(
    row: EpochRecord | None, generation: str | None, on_reprocess: str
) -> Mapping[str, RevisionBasis] | None:
    """Per table, what a write of ``generation`` is planned against when it revises the epoch's
    committed changes (``revised_write``); ``None``: it is an ordinary write."""
    found = revised_write(row, generation, on_reprocess)
    if found is None:
        return None
    write_id, pre_commit, committed, identities = found
    return {
        t.table: _basis(write_id, t, committed.get(t.table), identities.get(t.table))
        for t in pre_commit.tables
        if Kind.of_table(t).by_key
    }


def _basis(write_id: str, written: TableWrite, committed: str | None, table_uuid: str | None) -> RevisionBasis:
    revised = {
        "table_uuid": table_uuid,
        "write_id": write_id,
        "added": list(written.data_files.paths()),
        "rewritten": [r.path for r in written.rewritten],
        "key_lower_bounds": written.key_lower_bounds,
        "key_upper_bounds": written.key_upper_bounds,
    }
    if written.revises is not None or committed is None or committed == EMPTY or not _is_id(committed):
        # A revision was itself planned at P, which it read; a write that committed nothing here
        # changed nothing, so the table it read is as good a P as any (the commit checks the rest).
        return RevisionBasis(**revised, snapshot_id=written.read_snapshot_id)
    return RevisionBasis(**revised, parent_of=int(committed))


def _is_id(text: str) -> bool:
    return text.lstrip("-").isdigit()


def revision_refusal(write: PreCommit, committed_write_id: str, committed: PreCommit) -> str | None:
    """Why ``write`` (a newer generation's) cannot revise the epoch's committed upsert write, in
    words that end an error message; ``None`` when it can."""
    if not (WriteKind.of(write).by_key and WriteKind.of(committed).by_key):
        kinds = {"committed": committed, "new": write}
        shown = ", ".join(
            f"the {name} write {'is' if WriteKind.of(w).by_key else 'is not'} changes by key"
            for name, w in kinds.items()
        )
        return (
            f"the sink's mode changed between the two writes ({shown}); an epoch committed as changes by key is "
            "revised only by changes by key, and an epoch of rows only by rows. Restore the sink's mode, or give "
            f"the new pipeline its own sink_id ({DOCUMENTED})"
        )
    unplanned = sorted(t.table for t in write.tables if t.revises is None)
    if unplanned:
        return (
            f"its changes to {unplanned} were planned against the table as it is now, not as it was before write "
            f"{committed_write_id}, so they cannot replace that write's changes (the write task did not find the "
            "epoch committed when it ran, or an older version of the package wrote it). Run the epoch again "
            f"(clear its run): its write is then planned as a revision ({DOCUMENTED})"
        )
    other = sorted({t.revises.write_id for t in write.tables if t.revises and t.revises.write_id != committed_write_id})
    if other:
        return (
            f"it was planned as a revision of write {other[0]}, but the epoch is committed with write "
            f"{committed_write_id} now (another revision committed meanwhile). Run the epoch again (clear its run) "
            f"to revise what the table shows ({DOCUMENTED})"
        )
    return None


def later_deletes_refusal(write: PreCommit, committed: Iterable[EpochRecord]) -> str | None:
    """Why a revision cannot be told well defined from the meta store, when the table cannot tell.

    A later epoch's delete of a key the table did not hold leaves no file behind, so the commit's
    checks against the table never see it; yet had this revision inserted that key, the later
    delete would have removed it. ``committed``: the sink's Committed epochs (their counts say
    whether such deletes happened). ``None`` when no later epoch of the revised tables made one.
    """
    tables = {t.table for t in write.tables if t.revises is not None}
    later = sorted(
        {
            row.epoch
            for row in committed
            if row.epoch > write.epoch
            for t in row.pre_commit.tables
            if t.table in tables and t.changes is not None and t.changes.deletes_of_absent_keys
        }
    )
    if not later:
        return None
    shown = ", ".join(str(e) for e in later[:5]) + (f" (and {len(later) - 5} more)" if len(later) > 5 else "")
    return (
        f"later epoch(s) {shown} deleted keys the table did not hold; such a delete leaves nothing in the table, so "
        "whether this revision inserts one of those keys (which the later delete would have removed) cannot be "
        f"told. Correct the keys with a new epoch's changes instead ({DOCUMENTED})"
    )


def untellable_revision(write: PreCommit, committed: Callable[[], Iterable[EpochRecord]]) -> ReprocessRefused | None:
    """An upsert revision the table cannot prove well defined (``later_deletes_refusal``), at persist
    and again before its commit decision (a later epoch may have committed since). The sink's
    Committed rows are asked for only of an upsert revision."""
    if not any(t.revises is not None for t in write.tables):
        return None
    why = later_deletes_refusal(write, committed())
    return None if why is None else ReprocessRefused(f"{write.describe()}: revision refused: {why}")
