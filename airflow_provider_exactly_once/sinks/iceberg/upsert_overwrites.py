"""What the overwrite of an upsert write removes, for a first write and for a revision (design.md D14).

A revision E' of a committed upsert write E was planned at P, the table just before E
(``core.upsert_revisions``): it rewrote every file E rewrote and every file holding one of its own
keys, from their rows at P. Its commit is one overwrite snapshot that removes E's added files and
the files E' rewrote that E did not (those are still in the table, untouched by E), and adds E''s
files. The table then equals P with E' applied instead of E, with everything committed since kept,
provided that nothing committed since P, other than the epoch's own snapshots:

* removed a file the overwrite removes (a later epoch or a compaction rewrote E's output or a file
  holding a key of E'): its rows' newest state would be lost;
* added a data file that may hold a key of E or E' (its key statistics overlap their key ranges, or
  it has none), whether the file is still there or was itself rewritten since: a later epoch then
  changed one of those keys, and replaying E' under it would undo or duplicate that change;
* added delete files, which may delete rows the revision rewrote from the data alone.

Otherwise the revision is refused with ``UpsertConflict``, nothing committed and nothing deleted,
the epoch left with E. The check reads the manifests of the snapshots since P, once: the cost is what
happened since the epoch, not the table's history.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, UpsertConflict
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upsert_revisions import DOCUMENTED
from airflow_provider_exactly_once.core.write_kinds import ReplacedWrite, WriteKind
from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, SINK_ID_KEY, marker_of
from airflow_provider_exactly_once.sinks.iceberg.prepared_deletes import replaced_as_prepared
from airflow_provider_exactly_once.sinks.iceberg.upsert_commits import (
    files_to_rewrite,
    may_hold_range,
    shown,
    snapshots_since,
)


def upsert_files_to_replace(
    table: Table, branch: str, pre_commit: PreCommit, write: TableWrite, replaces: ReplacedWrite | None
) -> list[DataFile]:
    """The data files the overwrite of upsert ``write`` removes, as the head of ``branch`` holds them.

    ``replaces`` is the committed write a revision replaces (``None`` while persist checks a write
    before the revision is opened: ``write.revises`` says the same). A first write's prepared
    snapshot, while it stands, vouches for the files it rewrote (``files_to_rewrite``).
    """
    revised = write.revises
    kind = WriteKind.of(pre_commit, replaces)
    if revised is None:
        if kind.revises:
            raise UpsertConflict(
                f"{pre_commit.describe()}: table {write.table!r}: this write replaces the committed write "
                f"{kind.replaced_write_id} of the epoch, but its changes were planned against the table as it was when it "
                "ran, not as it was before that write; nothing was committed. Write the epoch again: a new write "
                f"is planned as a revision ({DOCUMENTED})",
                (write.table,),
            )
        return files_to_rewrite(table, branch, pre_commit, write, replaced_as_prepared(table, branch, write))
    if (replaced := kind.replaces) is not None:
        _check_against(pre_commit, write, replaced)
    return files_to_revise(table, branch, pre_commit, write)


def _check_against(pre_commit: PreCommit, write: TableWrite, replaces: ReplacedWrite) -> None:
    """The revision was planned against the write the row says it replaces, as that write was."""
    revised = write.revises
    assert revised is not None
    try:
        committed = replaces.pre_commit.table(write.table)
    except KeyError:
        committed = None
    same = (
        committed is not None
        and revised.write_id == replaces.write_id
        and set(revised.added) == {f.path for f in committed.data_files}
        and set(revised.rewritten) == {r.path for r in committed.rewritten}
    )
    if not same:
        raise InvalidPreCommit(
            f"{pre_commit.describe()}: table {write.table!r}: the revision was planned against write "
            f"{revised.write_id}, but the epoch's revision replaces write {replaces.write_id} as it was committed; "
            f"nothing was committed. Write the epoch again ({DOCUMENTED})"
        )


def files_to_revise(table: Table, branch: str, pre_commit: PreCommit, write: TableWrite) -> list[DataFile]:
    """The files the revision's overwrite removes (the revised write's, and those the revision
    rewrote beyond them); ``UpsertConflict`` when the revision is not well defined any more."""
    revised = write.revises
    assert revised is not None
    owner = (
        f"{pre_commit.describe()}: revision of write {revised.write_id} in table {write.table!r} on branch {branch!r}"
    )
    metadata = table.metadata
    head = metadata.snapshot_by_name(branch)
    base = write.read_snapshot_id
    to_remove = set(revised.added) | ({r.path for r in write.rewritten} - set(revised.rewritten))
    if head is None:
        if to_remove or base is not None:
            _refuse(owner, f"the branch has no snapshot now, but the revision was planned at snapshot {base}", ())
        return []
    since = snapshots_since(metadata, head.snapshot_id, base)
    if since is None:
        _refuse(
            owner,
            f"snapshot {base}, the table as it was before write {revised.write_id}, is no longer an ancestor of "
            f"the head {head.snapshot_id} (rolled back or expired)",
            (f"snapshot {base}",),
        )
        return []  # unreachable: _refuse raises
    snapshots = {s.snapshot_id: s for s in metadata.snapshots if s.snapshot_id in since}
    later = _Later(metadata, {i: s for i, s in snapshots.items() if not _epochs_own(s, pre_commit)})
    found: dict[str, DataFile] = {}
    for manifest in head.manifests(table.io):
        if manifest.content != ManifestContent.DATA or len(found) == len(to_remove):
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.file_path in to_remove:
                found[entry.data_file.file_path] = entry.data_file
    removed, overlapping = later.changes(table, owner, write)
    gone = sorted(to_remove - set(found))
    if gone:
        named = (f"{path} ({removed.get(path, 'removed outside the commits since')})" for path in gone)
        _refuse(
            owner,
            f"{len(gone)} file(s) it must remove are no longer in the table: a later commit rewrote them, changing "
            f"keys of the epoch or rows beside them: {shown(named)}",
            gone,
        )
    if overlapping:
        _refuse(
            owner,
            f"{len(overlapping)} data file(s) committed since may hold keys the epoch changed: "
            f"{shown(f'{path} (added by {commit})' for path, commit in overlapping)}",
            [path for path, _ in overlapping],
        )
    return [found[path] for path in sorted(found)]


class _Later:
    """The commits since the revision's base other than the epoch's own, and what they changed."""

    def __init__(self, metadata: TableMetadata, snapshots: dict[int, Snapshot]) -> None:
        self._metadata = metadata
        self._snapshots = snapshots

    def changes(self, table: Table, owner: str, write: TableWrite) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The files these commits removed (path -> the commit), and the data files they added, kept
        or rewritten since, that may hold a key of the revision or of the write it revises."""
        revised = write.revises
        assert revised is not None
        seen: set[str] = set()
        removed: dict[str, str] = {}
        overlapping: list[tuple[str, str]] = []
        for snapshot in self._snapshots.values():
            for manifest in snapshot.manifests(table.io):
                if manifest.added_snapshot_id not in self._snapshots or manifest.manifest_path in seen:
                    continue
                seen.add(manifest.manifest_path)
                if manifest.content == ManifestContent.DELETES:
                    _refuse(
                        owner,
                        f"delete files were committed since, by {self.describe(manifest.added_snapshot_id)} "
                        f"(manifest {manifest.manifest_path})",
                        (manifest.manifest_path,),
                    )
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    data_file, by = entry.data_file, entry.snapshot_id
                    if by not in self._snapshots:
                        continue
                    if entry.status == ManifestEntryStatus.DELETED:
                        removed[data_file.file_path] = self.describe(by)
                    elif entry.status == ManifestEntryStatus.ADDED and (
                        may_hold_range(self._metadata, data_file, write.key_lower_bounds, write.key_upper_bounds)
                        or may_hold_range(self._metadata, data_file, revised.key_lower_bounds, revised.key_upper_bounds)
                    ):
                        overlapping.append((data_file.file_path, self.describe(by)))
        return removed, overlapping

    def describe(self, snapshot_id: int | None) -> str:
        """A commit as an operator finds it: epoch and sink from its marker, else its operation."""
        snapshot = self._snapshots.get(snapshot_id or 0)
        marker = None if snapshot is None else marker_of(snapshot)
        if marker is not None:
            return f"epoch {marker[EPOCH_KEY]} of sink {marker[SINK_ID_KEY]!r}, snapshot {snapshot_id}"
        operation = snapshot.summary.operation.value if snapshot is not None and snapshot.summary else "unknown"
        return f"snapshot {snapshot_id} ({operation}, not a sink's commit)"


def _epochs_own(snapshot: Snapshot, pre_commit: PreCommit) -> bool:
    """Whether the snapshot committed this epoch of this sink (the revised write, an earlier revision)."""
    marker = marker_of(snapshot)
    return (
        marker is not None and marker[SINK_ID_KEY] == pre_commit.sink_id and marker[EPOCH_KEY] == str(pre_commit.epoch)
    )


def _refuse(owner: str, why: str, conflicting: Iterable[str]) -> None:
    raise UpsertConflict(
        f"{owner} refused: {why}. Revising an upsert epoch is defined only while nothing committed after it "
        "changed the files it rewrote or may hold a key it or the write it revises changed. Nothing was committed "
        "and nothing deleted; the epoch keeps the write it has, as the table shows it. Correct those keys with a "
        f"new epoch's changes instead; a revision already persisted is given up with eo-sink abort SINK EPOCH "
        f"--reason ... ({DOCUMENTED})",
        tuple(conflicting),
    )
