"""Which data files an Iceberg table references: what a delete must prove absent (invariant 4),
and the refusal of a delete that would remove any.

Two looks, from cheap to complete: the files the snapshots since a write *added* (a write's files can
only have entered the table after its row was written), and, beyond the snapshot-retention horizon
where those snapshots may be gone, every file any branch or tag can still read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from airflow_provider_exactly_once.core.errors import AbortRefused, MarkerHorizonExceeded
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.locations import parse_location
from airflow_provider_exactly_once.sinks.iceberg.markers import (
    EPOCH_KEY,
    SINK_ID_KEY,
    WRITE_ID_KEY,
    marker_of,
    recent_snapshots,
)

#: How many snapshots' added-file lists one committer remembers (a recovery pass over a sink reads
#: each snapshot's manifests once instead of once per aborted write that precedes it).
_ADDED_FILES_CACHE_MAX = 4096


class AddedFiles:
    """Paths of the data files each snapshot itself added, each snapshot's manifests read once.

    Without the memo, a recovery pass deleting the files of k aborted writes re-read every snapshot
    since each of them: k times the commits since, quadratic on one busy table. A snapshot never
    changes once written, so the memo can only save reads, never hide a reference.
    """

    def __init__(self) -> None:
        self._added: OrderedDict[tuple[str, int], frozenset[str]] = OrderedDict()

    def of(self, table: Table, snapshots: Iterable[Snapshot]) -> Iterator[str]:
        table_uuid = str(table.metadata.table_uuid)
        for snapshot in snapshots:
            key = (table_uuid, snapshot.snapshot_id)
            added = self._added.get(key)
            if added is None:
                added = frozenset(_files_added_by(table, snapshot))
                self._added[key] = added
                if len(self._added) > _ADDED_FILES_CACHE_MAX:
                    self._added.popitem(last=False)
            else:
                self._added.move_to_end(key)
            yield from added


def _files_added_by(table: Table, snapshot: Snapshot) -> Iterator[str]:
    """Paths of the data files one snapshot itself added (read from only the manifests it wrote)."""
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED:
                yield entry.data_file.file_path


def files_live_in_refs(table: Table) -> Iterator[str]:
    """Every data file any branch or tag can still read: the full (rare, beyond-horizon) check."""
    metadata = table.metadata
    by_id = {snapshot.snapshot_id: snapshot for snapshot in metadata.snapshots}
    heads = {ref.snapshot_id for ref in metadata.refs.values()}
    for head in heads:
        snapshot = by_id.get(head)
        if snapshot is None:
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                yield entry.data_file.file_path


def refuse_if_referenced(
    table: Table,
    pre_commit: PreCommit,
    write: TableWrite,
    not_before_ms: int,
    *,
    added_files: AddedFiles,
    check_horizon: Callable[[], None],
) -> None:
    """Invariant 4: delete only what is neither marked as ours nor referenced by the table.
    ``check_horizon`` raises ``MarkerHorizonExceeded`` when the snapshots since the write may be gone."""
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
        check_horizon()
        # Our files can only have entered the table after the row was written: looking at what
        # the recent snapshots added is enough, and costs what happened since, not history.
        candidates: Iterable[str] = added_files.of(table, recent.values())
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
