"""What a revision of an epoch replaces in an Iceberg table, and when the replaced files may go.

A revision's commit is one overwrite snapshot per table that removes exactly the replaced write's
data files and adds the new write's (design.md section 5, step 6). The files to remove are looked up
in the table as it is now, so they carry the spec and partition the table filed them under; a file
that is no longer there (rewritten by compaction, deleted by hand) refuses the replacement, because
committing the new write beside rows that moved elsewhere would show the epoch twice.

The replaced files stay referenced by the snapshots older than the replacement (time travel). They
may be deleted only once the table retains no snapshot older than the replacing one: every snapshot
that could still list them has then been expired.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import ReplacedFilesMissing
from airflow_provider_exactly_once.core.ports import EMPTY
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.write_kinds import ReplacedWrite


def files_to_replace(
    table: Table, branch: str, pre_commit: PreCommit, replaced: ReplacedWrite, name: str
) -> list[DataFile]:
    """The replaced write's data files in table ``name``, as the head of ``branch`` holds them.

    The manifests the replaced write's own snapshot added are read first (a fast append carries them
    into every later snapshot unchanged); the others only when some file was not found there.
    """
    try:
        wanted = {descriptor.path for descriptor in replaced.pre_commit.table(name).data_files}
    except KeyError:
        return []  # the replaced write did not write this table
    if not wanted:
        return []
    metadata = table.metadata
    head = metadata.snapshot_by_name(branch)
    found: dict[str, DataFile] = {}
    if head is not None:
        added_by = replaced.committed.get(name)
        added_by_id = int(added_by) if added_by and added_by != EMPTY and added_by.lstrip("-").isdigit() else None
        manifests = [m for m in head.manifests(table.io) if m.content == ManifestContent.DATA]
        own = [m for m in manifests if m.added_snapshot_id == added_by_id]
        for group in (own, [m for m in manifests if m.added_snapshot_id != added_by_id]):
            for manifest in group:
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    path = entry.data_file.file_path
                    if path in wanted:
                        found[path] = entry.data_file
            if len(found) == len(wanted):
                break
    missing = sorted(wanted - set(found))
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ReplacedFilesMissing(
            f"{pre_commit.describe()}: revision of table {name!r} refused: {len(missing)} data file(s) of the "
            f"write it replaces ({replaced.write_id}) are no longer in the table on branch {branch!r} "
            f"(rewritten by a compaction or deleted): {shown}. Nothing was committed and nothing deleted. "
            "Replacing it would show the epoch's rows twice. Abort the revision to keep what the table shows "
            "(eo-sink abort SINK EPOCH --reason ...; once its commit was decided, add --files-lost), "
            "see docs/operations.md",
            tuple(missing),
        )
    return [found[path] for path in sorted(found)]


def still_referenced(table: Table, removed_by: Mapping[str, str], name: str, recorded_ms: int) -> int | None:
    """A retained snapshot that may still list the replaced files of table ``name`` (its id), or ``None``.

    ``removed_by[name]`` is the snapshot that removed them; every snapshot older than it may list
    them. Once that snapshot is expired too, its age is bounded by ``recorded_ms`` (when the
    replacement was recorded, after its commit, minus the caller's clock-skew margin): any snapshot
    older than that bound still counts as older. A table the replacement left unchanged
    (``empty``) holds nothing to wait for.
    """
    removing = removed_by.get(name)
    if removing == EMPTY:
        return None
    metadata = table.metadata
    replacing = None
    if removing is not None and removing.lstrip("-").isdigit():
        replacing = next((s for s in metadata.snapshots if s.snapshot_id == int(removing)), None)
    for snapshot in metadata.snapshots:
        if replacing is not None:
            # Sequence numbers order snapshots in format v2 (v1 tables have none); timestamps in any
            # format, up to writers' clock skew: older by either counts.
            older = (snapshot.sequence_number or 0) < (replacing.sequence_number or 0) or (
                snapshot.timestamp_ms < replacing.timestamp_ms
            )
        else:
            older = snapshot.timestamp_ms < recorded_ms
        if older:
            return snapshot.snapshot_id
    return None
