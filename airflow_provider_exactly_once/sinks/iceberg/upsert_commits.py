"""The commit side of an upsert write (design.md section 5, step 7): what its overwrite removes,
and when the table moved so that the write must not be committed.

The Spark write read the table at one snapshot (``TableWrite.read_snapshot_id``), rewrote the files
there that held the epoch's keys, and recorded the epoch's key range. Its commit is one snapshot that
removes exactly those files and adds the new ones. It is refused (``UpsertConflict``, nothing
committed, nothing deleted) when, on the branch head it would commit onto:

* a rewritten file is gone (a compaction or another upsert rewrote it): its rows' newest state is
  elsewhere, and the write's copy would resurrect deleted rows or undo updates;
* a data file added since the read may hold one of the epoch's keys (its key statistics overlap the
  epoch's key range, or it has none): the write never saw that row, so the table would end with two
  rows for one key, or a delete that missed its row;
* delete files were added since the read (another engine's merge-on-read): they may delete rows of
  the files the write rewrote from the data alone;
* the snapshot it read is no longer an ancestor of the head (rolled back, or expired past it).

Java Iceberg's ``OverwriteFiles.validateNoConflictingData`` with a conflict-detection filter is the
model; this is the same rule with the key range as the filter.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import PrimitiveType, StringType

from airflow_provider_exactly_once.core.errors import UpsertConflict
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite

#: Conflicting files an error names at most.
SHOWN = 5


def files_to_rewrite(
    table: Table, branch: str, pre_commit: PreCommit, write: TableWrite, prepared: Sequence[DataFile] = ()
) -> list[DataFile]:
    """The data files ``write`` rewrote, as the head of ``branch`` holds them; ``UpsertConflict``
    when the table moved since the write read it in a way the write cannot absorb.

    ``prepared``, one per rewritten file, where the write's prepared snapshot stands
    (``prepared_deletes.replaced_as_prepared``): the head still lists every manifest that held them
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
