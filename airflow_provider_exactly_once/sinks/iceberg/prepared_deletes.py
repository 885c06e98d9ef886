"""A revision's or an upsert's manifests written at persist, deletions included, so that its commit
only lists them.

A revision's commit (design.md section 5, step 6) removes the replaced write's files and adds the new
write's in one overwrite snapshot. Written at commit, that snapshot costs a manifest of the added
files, one of the removed files' entries (status deleted) and a copy of every manifest that held a
removed file, without it: every one of them an Avro file written entry by entry inside the window
where the catalog is contended. At persist the replaced write is known (the epoch's Committed row),
and the table's branch head lists its files: persist writes all of those manifests
(``SpecAwareOverwrite.write_ahead``: the very entries the commit would write, the deleted ones with
the snapshot id the commit will take, which persist picks), and the commit lists them in place of
the manifests they stand in for.

Where the table changed in between, the commit falls back to writing its own, as before, and the
prepared manifests are deleted (``prepared_manifests.tidy``): when a manifest that held a removed
file is no longer listed by the branch head (maintenance merged or rewrote manifests since, or a
foreign commit removed files), when the schema, the partition-summary limit or a spec is not as
prepared, when a prepared manifest is gone or not its recorded length, when the files to remove
are not as many as prepared, or when the snapshot id was taken. Persist itself prepares nothing
where the replaced files are not all live in one manifest each (the commit then refuses, or filters).

While the prepared snapshot stands, the check right before the commit decision that the replaced
files are still in the table (``files_replaced``) is that the branch head still lists every manifest
that held them; reading every replaced entry again, and building a ``DataFile`` per descriptor, was
most of what a replacement's commit still cost. The plan then holds placeholders
(``PREPARED_FILE``), which only the prepared path takes; a commit that finds the table changed
since the check retries (``refuse_stale_placeholders``) and looks the files up.

An upsert's first write is an overwrite of the files it rewrote (``prepare_upsert``): persist's
conflict check found them in the branch head, and they are removed the same way. Its commit still
checks for conflicts since the write's read; while the prepared snapshot stands, the rewritten files
are placeholders too (``upsert_commits.files_to_rewrite``).

The added files' manifest lies below the write location, like an append's. The deleted entries'
manifest and the copies list other writes' files or outlive this write's own (a later revision
carries them over), so they go in the table's metadata folder, where the commit's own would be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from airflow_provider_exactly_once.core.errors import ReplacedFilesMissing
from airflow_provider_exactly_once.core.precommit import PreCommit, PreparedSnapshot, TableWrite
from airflow_provider_exactly_once.core.write_kinds import Kind, ReplacedWrite, WriteKind
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import unavailable_when_unreachable
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
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
from airflow_provider_exactly_once.sinks.iceberg.replacement import files_to_replace
from airflow_provider_exactly_once.sinks.iceberg.transaction import SinkCommitConflict, SinkTransaction
from airflow_provider_exactly_once.sinks.iceberg.upsert_commits import identifier_update
from airflow_provider_exactly_once.sinks.iceberg.write_check import write_spec

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
        to_replace = files_to_replace(table, branch, pre_commit, replaced, write.table)
    except ReplacedFilesMissing:
        return None  # the commit refuses, and says why
    return _prepare_overwrite(table, pre_commit, write, to_replace, branch)


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
    table: Table, pre_commit: PreCommit, write: TableWrite, to_replace: list[DataFile], branch: str
) -> PreparedSnapshot | None:
    metadata = table.metadata
    if not to_replace and not write.data_files:
        return None  # the commit makes no snapshot of this table
    overwrite = SinkTransaction(table).replace_files(branch=branch, snapshot_properties={})
    for data_file in to_replace:
        overwrite.delete_data_file(data_file)
    for data_file in _data_files(metadata, pre_commit, write):
        overwrite.append_data_file(data_file)
    written = overwrite.write_ahead(manifest_folder(write, pre_commit.write_id))
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
    """``replacement.files_to_replace``, but without reading the table's manifests while the revision's
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
