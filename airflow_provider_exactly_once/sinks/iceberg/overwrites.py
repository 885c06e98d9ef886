"""The overwrite snapshots of revisions and upserts: what a revision replaces and an upsert's overwrite
removes, when the table moved so that an upsert must not be committed, and their manifests, deletions
included, written at persist so that the commit only lists them (design.md, 'The Iceberg commit', steps 6 and 7;
D14).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, cast

from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.types import PrimitiveType, StringType

from airflow_provider_exactly_once.core.decisions import DOCUMENTED
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, ReplacedFilesMissing, UpsertConflict
from airflow_provider_exactly_once.core.ports import EMPTY, Kind, ReplacedWrite, WriteKind
from airflow_provider_exactly_once.core.precommit import PreCommit, PreparedSnapshot, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import unavailable_when_unreachable
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.markers import EPOCH_KEY, SINK_ID_KEY, marker_of
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import (
    PREPARED_FORMAT_VERSION,
    Preparer,
    listed,
    manifest_folder,
    prepare_snapshot,
    recorded,
    snapshot_manifests,
    still_valid,
    summary_limit,
)
from airflow_provider_exactly_once.sinks.iceberg.transaction import SinkCommitConflict, SinkTransaction
from airflow_provider_exactly_once.sinks.iceberg.write_check import write_spec

# What a revision of an epoch replaces in an Iceberg table, and when the replaced files may go.
#
# A revision's commit is one overwrite snapshot per table that removes exactly the replaced write's
# data files and adds the new write's (design.md, 'The Iceberg commit', step 6). The files to remove are looked up
# in the table as it is now, so they carry the spec and partition the table filed them under; a file
# that is no longer there (rewritten by compaction, deleted by hand) refuses the replacement, because
# committing the new write beside rows that moved elsewhere would show the epoch twice.
#
# The replaced files stay referenced by the snapshots older than the replacement (time travel). They
# may be deleted only once the table retains no snapshot older than the replacing one: every snapshot
# that could still list them has then been expired.


def files_to_replace(
    table: Table, branch: str, pre_commit: PreCommit, replaced: ReplacedWrite, name: str
) -> list[DataFile]:
    """The replaced write's data files in table ``name``, as the head of ``branch`` holds them.

    The manifests the replaced write's own snapshot added are read first (a fast append carries them
    into every later snapshot unchanged); the others only when some file was not found there.
    """
    return _replaced_entries(table, branch, pre_commit, replaced, name).files


class _Read(NamedTuple):
    """What ``files_to_replace`` found, and what a revision's persist writes its manifests from
    (``SpecAwareOverwrite.write_ahead``) without reading the table again."""

    #: The replaced files, as the head holds them.
    files: list[DataFile]
    #: The live entries of each manifest read, by path.
    entries: dict[str, list[ManifestEntry]]
    #: The sequence number of the snapshot that added the replaced files (0: not known): no
    #: manifest added before it can list them.
    since: int


def _replaced_entries(table: Table, branch: str, pre_commit: PreCommit, replaced: ReplacedWrite, name: str) -> _Read:
    """``files_to_replace``, with the entries it read."""
    try:
        wanted = {descriptor.path for descriptor in replaced.pre_commit.table(name).data_files}
    except KeyError:
        return _Read([], {}, 0)  # the replaced write did not write this table
    if not wanted:
        return _Read([], {}, 0)
    metadata = table.metadata
    head = metadata.snapshot_by_name(branch)
    found: dict[str, DataFile] = {}
    read: dict[str, list[ManifestEntry]] = {}
    since = 0
    if head is not None:
        added_by = replaced.committed.get(name)
        added_by_id = int(added_by) if added_by and added_by != EMPTY and added_by.lstrip("-").isdigit() else None
        added = metadata.snapshot_by_id(added_by_id) if added_by_id is not None else None
        since = added.sequence_number or 0 if added is not None else 0
        manifests = [m for m in head.manifests(table.io) if m.content == ManifestContent.DATA]
        own = [m for m in manifests if m.added_snapshot_id == added_by_id]
        for group in (own, [m for m in manifests if m.added_snapshot_id != added_by_id]):
            for manifest in group:
                entries = read[manifest.manifest_path] = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                for entry in entries:
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
    return _Read([found[path] for path in sorted(found)], read, since)


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


# The commit side of an upsert write (design.md, 'The Iceberg commit', step 7): what its overwrite removes,
# and when the table moved so that the write must not be committed.
#
# The Spark write read the table at one snapshot (``TableWrite.read_snapshot_id``), rewrote the files
# there that held the epoch's keys, and recorded the epoch's key range. Its commit is one snapshot that
# removes exactly those files and adds the new ones. It is refused (``UpsertConflict``, nothing
# committed, nothing deleted) when, on the branch head it would commit onto:
#
# * a rewritten file is gone (a compaction or another upsert rewrote it): its rows' newest state is
#   elsewhere, and the write's copy would resurrect deleted rows or undo updates;
# * a data file added since the read may hold one of the epoch's keys (its key statistics overlap the
#   epoch's key range, or it has none): the write never saw that row, so the table would end with two
#   rows for one key, or a delete that missed its row;
# * delete files were added since the read (another engine's merge-on-read): they may delete rows of
#   the files the write rewrote from the data alone;
# * the snapshot it read is no longer an ancestor of the head (rolled back, or expired past it).
#
# Java Iceberg's ``OverwriteFiles.validateNoConflictingData`` with a conflict-detection filter is the
# model; this is the same rule with the key range as the filter.

#: Conflicting files an error names at most.
SHOWN = 5


def files_to_rewrite(
    table: Table, branch: str, pre_commit: PreCommit, write: TableWrite, prepared: Sequence[DataFile] = ()
) -> list[DataFile]:
    """The data files ``write`` rewrote, as the head of ``branch`` holds them; ``UpsertConflict``
    when the table moved since the write read it in a way the write cannot absorb.

    ``prepared``, one per rewritten file, where the write's prepared snapshot stands
    (``overwrites.replaced_as_prepared``): the head still lists every manifest that held them
    live at persist, so none is gone, and only the manifests added since the read are read, for the
    other conflicts; the commit lists the prepared manifests, which remove them."""
    owner = f"{pre_commit.describe()}: upsert into table {write.table!r} on branch {branch!r}"
    metadata = table.metadata
    head = metadata.snapshot_by_name(branch)
    wanted = {r.path for r in write.rewritten}
    if not wanted and not write.key_lower_bounds:
        return []  # no changes: nothing to remove, no key to collide with, whatever the table did since
    if head is None:
        if wanted or write.read_snapshot_id is not None:
            _conflict(
                owner,
                f"the branch has no snapshot now, but the write read snapshot {write.read_snapshot_id}",
                (f"snapshot {write.read_snapshot_id}",),
            )
        return []
    since = snapshots_since(metadata, head.snapshot_id, write.read_snapshot_id)
    if since is None:
        _conflict(
            owner,
            f"snapshot {write.read_snapshot_id}, which the write read, is no longer an ancestor of the head "
            f"{head.snapshot_id} (rolled back or expired)",
            (f"snapshot {write.read_snapshot_id}",),
        )
        return []  # unreachable: _conflict raises
    found: dict[str, DataFile] = {}
    as_prepared = len(prepared) == len(wanted) > 0
    overlapping: list[str] = []
    for manifest in head.manifests(table.io):
        new = manifest.added_snapshot_id in since
        if manifest.content == ManifestContent.DELETES:
            if new:
                _conflict(
                    owner,
                    f"delete files were added since the write's read (manifest {manifest.manifest_path})",
                    (manifest.manifest_path,),
                )
            continue
        if not new and (as_prepared or len(found) == len(wanted)):
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.file_path in wanted:
                found[data_file.file_path] = data_file
            elif (
                new
                and entry.status == ManifestEntryStatus.ADDED
                and entry.snapshot_id in since
                and may_hold_keys(metadata, data_file, write)
            ):
                overlapping.append(data_file.file_path)
    missing = [] if as_prepared else sorted(wanted - set(found))
    if missing:
        _conflict(owner, f"{len(missing)} file(s) it rewrote are no longer in the table: {shown(missing)}", missing)
    if overlapping:
        _conflict(
            owner,
            f"{len(overlapping)} data file(s) added since its read may hold the epoch's keys: {shown(overlapping)}",
            overlapping,
        )
    return list(prepared) if as_prepared else [found[path] for path in sorted(found)]


def snapshots_since(metadata: TableMetadata, head_id: int, read_id: int | None) -> set[int] | None:
    """Ids of the head and its ancestors newer than ``read_id``; ``None`` when ``read_id`` is not an
    ancestor (``read_id`` ``None``: the write read an empty branch, so every ancestor is newer)."""
    since: set[int] = set()
    current: int | None = head_id
    while current is not None:
        if current == read_id:
            return since
        snapshot = metadata.snapshot_by_id(current)
        if snapshot is None:
            return since if read_id is None else None  # history expired below here
        since.add(current)
        current = snapshot.parent_snapshot_id
    return since if read_id is None else None


def may_hold_keys(metadata: TableMetadata, data_file: DataFile, write: TableWrite) -> bool:
    """Whether a file's key statistics overlap the write's key range in every key column (a file
    without statistics for a key column may hold anything)."""
    return may_hold_range(metadata, data_file, write.key_lower_bounds, write.key_upper_bounds)


def may_hold_range(
    metadata: TableMetadata, data_file: DataFile, key_lower: Mapping[str, str], key_upper: Mapping[str, str]
) -> bool:
    """``may_hold_keys`` for a key range given as bounds (``TableWrite.key_lower_bounds``' form)."""
    if not key_lower:
        return False  # an epoch without changes has no keys to collide with
    schema = metadata.schema()
    lower_bounds = data_file.lower_bounds or {}
    upper_bounds = data_file.upper_bounds or {}
    for name, encoded_low in key_lower.items():
        field = schema.find_field(name)
        field_type = cast(PrimitiveType, field.field_type)
        file_low, file_high = lower_bounds.get(field.field_id), upper_bounds.get(field.field_id)
        if file_low is None or file_high is None:
            continue  # unknown: may overlap
        low = _value(field_type, base64.b64decode(encoded_low))
        high = _value(field_type, base64.b64decode(key_upper[name]))
        if _value(field_type, file_high) < low or high < _value(field_type, file_low):
            return False  # disjoint in this column: no key of the epoch can be in the file
    return True


def identifier_update(metadata: TableMetadata, write: TableWrite) -> tuple[str, ...]:
    """The key to record as the table's identifier fields, when it has none and the key's columns
    allow it (required, primitive, not floating: Iceberg's rule); empty when nothing is to be set.
    A table whose key columns are optional keeps no identifier fields: the sink's key still holds."""
    key = tuple(write.key_lower_bounds)
    schema = metadata.schema()
    if not key or schema.identifier_field_ids:
        return ()
    try:
        fields = [schema.find_field(name) for name in key]
    except ValueError:
        return ()
    return key if all(f.required for f in fields) else ()


def _value(field_type: PrimitiveType, raw: bytes) -> Any:
    value = from_bytes(field_type, raw)
    # Iceberg orders strings by their UTF-8 bytes (and truncates bounds on bytes), not code points.
    return value.encode("utf-8") if isinstance(field_type, StringType) else value


def shown(paths: Iterable[str]) -> str:
    """The first few of ``paths`` and how many more: an error names what conflicts, readably."""
    listed = list(paths)
    return ", ".join(listed[:SHOWN]) + (f" (and {len(listed) - SHOWN} more)" if len(listed) > SHOWN else "")


def _conflict(owner: str, why: str, conflicting: Iterable[str]) -> None:
    raise UpsertConflict(
        f"{owner} refused: the table changed since the write read it: {why}. Nothing was committed and nothing "
        "deleted; the epoch's changes must be written again against the table as it is now: the task group's "
        "rewrite task does that (rewrites=), or clear the run (see docs/operations.md, 'An upsert conflict')",
        tuple(conflicting),
    )


# A revision's or an upsert's manifests written at persist, deletions included, so that its commit
# only lists them.
#
# A revision's commit (design.md, 'The Iceberg commit', step 6) removes the replaced write's files and adds the new
# write's in one overwrite snapshot. Written at commit, that snapshot costs a manifest of the added
# files, one of the removed files' entries (status deleted) and a copy of every manifest that held a
# removed file, without it: every one of them an Avro file written entry by entry inside the window
# where the catalog is contended. At persist the replaced write is known (the epoch's Committed row),
# and the table's branch head lists its files: persist writes all of those manifests
# (``SpecAwareOverwrite.write_ahead``: the very entries the commit would write, the deleted ones with
# the snapshot id the commit will take, which persist picks), and the commit lists them in place of
# the manifests they stand in for.
#
# Where the table changed in between, the commit falls back to writing its own, as before, and the
# prepared manifests are deleted (``prepared_manifests.tidy``): when a manifest that held a removed
# file is no longer listed by the branch head (maintenance merged or rewrote manifests since, or a
# foreign commit removed files), when the schema, the partition-summary limit or a spec is not as
# prepared, when a prepared manifest is gone or not its recorded length, when the files to remove
# are not as many as prepared, or when the snapshot id was taken. Persist itself prepares nothing
# where the replaced files are not all live in one manifest each (the commit then refuses, or filters).
#
# While the prepared snapshot stands, the check right before the commit decision that the replaced
# files are still in the table (``files_replaced``) is that the branch head still lists every manifest
# that held them; reading every replaced entry again, and building a ``DataFile`` per descriptor, was
# most of what a replacement's commit still cost. The plan then holds placeholders
# (``PREPARED_FILE``), which only the prepared path takes; a commit that finds the table changed
# since the check retries (``refuse_stale_placeholders``) and looks the files up.
#
# An upsert's first write is an overwrite of the files it rewrote (``prepare_upsert``): persist's
# conflict check found them in the branch head, and they are removed the same way. Its commit still
# checks for conflicts since the write's read; while the prepared snapshot stands, the rewritten files
# are placeholders too (``overwrites.files_to_rewrite``).
#
# The added files' manifest lies below the write location, like an append's. The deleted entries'
# manifest and the copies list other writes' files or outlive this write's own (a later revision
# carries them over), so they go in the table's metadata folder, where the commit's own would be.

#: What stands for a replaced file while the prepared snapshot stands (``replaced_as_prepared``).
PREPARED_FILE = DataFile.from_args(
    content=DataFileContent.DATA,
    file_path="exactly-once:replaced-file-listed-by-the-prepared-manifests",
    file_format=FileFormat.PARQUET,
    partition=Record(),
    record_count=0,
    file_size_in_bytes=0,
)


def preparer(kind: WriteKind, rewritten: Mapping[str, list[DataFile]], branch: str) -> Preparer:
    """What prepares each table's snapshot of a write of ``kind`` on ``branch``: an append's manifest
    (``prepared_manifests``), a revision's overwrite, or an upsert's (the files it rewrote, as
    ``prepare`` found them in each table: ``rewritten``); the kind stages manifests."""
    match kind:
        case WriteKind(kind=Kind.REVISION, replaces=ReplacedWrite() as replaced):
            return partial(prepare_replacement, replaced=replaced, branch=branch)
        case WriteKind(kind=Kind.UPSERT):
            return partial(prepare_upsert, rewritten=rewritten, branch=branch)
        case _:
            return prepare_snapshot


def prepare_replacement(
    table: Table, pre_commit: PreCommit, write: TableWrite, *, replaced: ReplacedWrite, branch: str
) -> PreparedSnapshot | None:
    """The manifests of a revision's overwrite snapshot of ``table`` as its branch head is now; ``None``
    where the commit must write its own: a format other than 2, nothing to commit, or a replaced file
    not found as it expects."""
    if table.metadata.format_version != PREPARED_FORMAT_VERSION:
        return None
    try:
        read = _replaced_entries(table, branch, pre_commit, replaced, write.table)
    except ReplacedFilesMissing:
        return None  # the commit refuses, and says why
    return _prepare_overwrite(table, pre_commit, write, read.files, branch, read)


def prepare_upsert(
    table: Table, pre_commit: PreCommit, write: TableWrite, *, rewritten: Mapping[str, list[DataFile]], branch: str
) -> PreparedSnapshot | None:
    """An upsert's manifests: an append's where it rewrote no file of ``table``, else an overwrite's
    that removes the files it rewrote. ``None`` where its commit first makes the key the table's
    identifier fields: that is a new schema, which no manifest written now is valid against."""
    if identifier_update(table.metadata, write):
        return None
    to_replace = rewritten.get(write.table, [])
    if not to_replace:
        return prepare_snapshot(table, pre_commit, write)
    if table.metadata.format_version != PREPARED_FORMAT_VERSION:
        return None
    return _prepare_overwrite(table, pre_commit, write, to_replace, branch)


def _prepare_overwrite(
    table: Table,
    pre_commit: PreCommit,
    write: TableWrite,
    to_replace: list[DataFile],
    branch: str,
    read: _Read | None = None,
) -> PreparedSnapshot | None:
    """Write the overwrite's manifests ahead; ``read``: what ``files_to_replace`` read of the branch
    head, which is not read again."""
    metadata = table.metadata
    if not to_replace and not write.data_files:
        return None  # the commit makes no snapshot of this table
    overwrite = SinkTransaction(table).replace_files(branch=branch, snapshot_properties={})
    for data_file in to_replace:
        overwrite.delete_data_file(data_file)
    for data_file in _data_files(metadata, pre_commit, write):
        overwrite.append_data_file(data_file)
    folder = manifest_folder(write, pre_commit.write_id)
    written = overwrite.write_ahead(folder, read.entries, read.since) if read else overwrite.write_ahead(folder, {})
    if written is None:
        return None
    copies = [recorded(copy, replaces=path) for path, copy in written.rewrites.items() if copy is not None]
    return PreparedSnapshot(
        schema_id=metadata.current_schema_id,
        summary_limit=summary_limit(metadata),
        summary=written.summary,
        manifests=[recorded(manifest) for manifest in written.new] + copies,
        snapshot_id=overwrite.snapshot_id,
        replaced=list(written.rewrites),
    )


def usable_replacement(
    metadata: TableMetadata, write: TableWrite, io: FileIO, branch: str, to_replace: list[DataFile]
) -> tuple[int, list[ManifestFile], dict[str, str]] | None:
    """The snapshot id, manifest list and summary properties a revision's commit takes from what its
    persist prepared, or ``None`` when it must write its own (the module's docstring says when).

    The manifest list is the one the commit would write: the added and deleted entries' manifests,
    then the branch head's manifests in order, each that held a removed file replaced by its copy
    (or dropped, when it held nothing else).
    """
    standing = _standing(metadata, write, io, branch)
    if standing is None or sum(m.deleted_files for m in standing[0].manifests) != len(to_replace):
        return None
    prepared, current = standing
    assert prepared.snapshot_id is not None
    replaced = set(prepared.replaced)
    snapshot_id = prepared.snapshot_id
    copies = {m.replaces: listed(m, snapshot_id) for m in prepared.manifests if m.replaces is not None}
    manifests = [listed(m, snapshot_id) for m in prepared.manifests if m.replaces is None]
    for manifest in current:
        if manifest.manifest_path not in replaced:
            manifests.append(manifest)
        elif manifest.manifest_path in copies:
            manifests.append(copies[manifest.manifest_path])
    return snapshot_id, manifests, prepared.summary


def files_replaced(
    table: Table, branch: str, pre_commit: PreCommit, write: TableWrite, replaced: ReplacedWrite
) -> list[DataFile]:
    """``files_to_replace``, but without reading the table's manifests while the revision's
    prepared snapshot stands (``replaced_as_prepared``): that read of every replaced entry is what
    the commit would otherwise spend right before its decision."""
    return replaced_as_prepared(table, branch, write) or files_to_replace(
        table, branch, pre_commit, replaced, write.table
    )


def replaced_as_prepared(table: Table, branch: str, write: TableWrite) -> list[DataFile]:
    """While the revision's prepared snapshot stands, ``PREPARED_FILE`` once per file it removes: the
    branch head still lists every manifest that held them as live entries at persist (a manifest
    never changes, and one that loses a file is no longer listed), so they are all still in the
    table, and the commit lists the prepared manifests, never these. Empty otherwise."""
    standing = _standing(table.metadata, write, table.io, branch)
    return [] if standing is None else [PREPARED_FILE] * sum(m.deleted_files for m in standing[0].manifests)


def refuse_stale_placeholders(table: Table, write: TableWrite, branch: str, to_replace: list[DataFile]) -> None:
    """``SinkCommitConflict`` when ``to_replace`` holds ``PREPARED_FILE`` but the table no longer lets
    the prepared snapshot be listed (it changed since the check): the retry loads the table again and
    looks the files up, so a placeholder never reaches a commit that filters manifests itself."""
    if (
        to_replace
        and to_replace[0] is PREPARED_FILE
        and usable_replacement(table.metadata, write, table.io, branch, to_replace) is None
    ):
        raise SinkCommitConflict(f"table {write.table!r} changed since the revision's prepared snapshot was checked")


def _standing(
    metadata: TableMetadata, write: TableWrite, io: FileIO, branch: str
) -> tuple[PreparedSnapshot, list[ManifestFile]] | None:
    """The revision's prepared snapshot and the branch head's manifests, while it may be listed as prepared."""
    prepared = write.prepared
    if (
        prepared is None
        or prepared.snapshot_id is None
        or not still_valid(metadata, prepared, io)
        or metadata.snapshot_by_id(prepared.snapshot_id) is not None
    ):
        return None
    head = metadata.snapshot_by_name(branch)
    current = snapshot_manifests(head, io) if head is not None else []
    if not set(prepared.replaced) <= {m.manifest_path for m in current}:
        return None  # merged or rewritten since persist: the commit filters the manifests itself
    return prepared, current


def _data_files(metadata: TableMetadata, pre_commit: PreCommit, write: TableWrite) -> list[DataFile]:
    spec = write_spec(metadata, write, owner=pre_commit.describe())
    return build_data_files(
        write.data_files, schema=metadata.schema(), spec=spec, spec_id=spec.spec_id, table=write.table
    )


def delete_shared_manifests(pre_commit: PreCommit, writes: Sequence[tuple[TableWrite, FileIO]]) -> int:
    """Delete the manifests a revision's persist wrote in the table's metadata folder, which deleting
    its location misses; how many were there. Only for a write no snapshot shows (an abort's): once
    committed, a later snapshot carries them, and a replaced write keeps them."""
    deleted = 0
    for write, io in writes:
        shared = [m.path for m in write.prepared.manifests if m.lists_other_writes] if write.prepared else []
        with unavailable_when_unreachable(f"{pre_commit.describe()}: could not delete its manifests", io.properties):
            for path in shared:
                try:
                    io.delete(path)
                except FileNotFoundError:
                    continue
                deleted += 1
    return deleted


def unrecorded(staged: TableWrite, recorded: TableWrite) -> TableWrite:
    """``staged`` with only the manifests ``recorded`` does not list (another persist attempt's)."""
    if staged.prepared is None:
        return staged
    kept = {m.path for m in recorded.prepared.manifests} if recorded.prepared else set()
    manifests = [m for m in staged.prepared.manifests if m.path not in kept]
    return staged.model_copy(update={"prepared": staged.prepared.model_copy(update={"manifests": manifests})})


# What the overwrite of an upsert write removes, for a first write and for a revision (design.md D14).
#
# A revision E' of a committed upsert write E was planned at P, the table just before E
# (``core.decisions``): it rewrote every file E rewrote and every file holding one of its own
# keys, from their rows at P. Its commit is one overwrite snapshot that removes E's added files and
# the files E' rewrote that E did not (those are still in the table, untouched by E), and adds E''s
# files. The table then equals P with E' applied instead of E, with everything committed since kept,
# provided that nothing committed since P, other than the epoch's own snapshots:
#
# * removed a file the overwrite removes (a later epoch or a compaction rewrote E's output or a file
#   holding a key of E'): its rows' newest state would be lost;
# * added a data file that may hold a key of E or E' (its key statistics overlap their key ranges, or
#   it has none), whether the file is still there or was itself rewritten since: a later epoch then
#   changed one of those keys, and replaying E' under it would undo or duplicate that change;
# * added delete files, which may delete rows the revision rewrote from the data alone.
#
# Otherwise the revision is refused with ``UpsertConflict``, nothing committed and nothing deleted,
# the epoch left with E. The check reads the manifests of the snapshots since P, once: the cost is what
# happened since the epoch, not the table's history.


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
