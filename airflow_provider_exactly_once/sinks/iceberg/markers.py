"""What a table's snapshots prove about a sink's writes: the commit marker in a snapshot's summary and
the bounded look-back that finds it, how far back the snapshots still prove anything, and which data
files they added or still reference (design.md, 'The Iceberg commit').
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta

from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.utils.properties import property_as_int

from airflow_provider_exactly_once.core.errors import AbortRefused, MarkerHorizonExceeded
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.layout import parse_location

# The commit marker in the snapshot summary, and the bounded look-back that finds it.
#
# The marker is what makes a commit idempotent (design.md, 'The Iceberg commit'): before appending, the committer
# asks "does the branch already show this (sink, epoch)?". The question must cost what happened since
# the write, not the table's history, so nothing here calls ``TableMetadata.snapshot_by_id``,
# ``snapshot_by_name`` or ``ancestors_of``: each of those scans the whole snapshot list per lookup, which
# would make a walk quadratic in history. Instead the recent snapshots are indexed once, from the end of
# the list, and the walk stays inside that index.

SINK_ID_KEY = "exactly-once.sink-id"
EPOCH_KEY = "exactly-once.epoch"
WRITE_ID_KEY = "exactly-once.write-id"
#: Written by a replacement (a revision of the epoch, ``1`` and up); absent from first commits.
REVISION_KEY = "exactly-once.revision"


#: Written by an epoch of an incremental input: the upstream snapshots it consumed, the position
#: committed with the data (as Iceberg's Kafka Connect sink writes its offsets into the summary).
SOURCE_TABLE_KEY = "exactly-once.source.table"
SOURCE_AFTER_KEY = "exactly-once.source.after-snapshot-id"
SOURCE_TO_KEY = "exactly-once.source.to-snapshot-id"


#: Written by an audited sink's commit to its audit branch (design.md D23): the branch it was made
#: on. Its publish to the sink's branch carries the marker without it.
AUDIT_BRANCH_KEY = "exactly-once.audit-branch"
_AUDIT_BRANCH_PREFIX = "eo-audit-"


def audit_branch_name(sink_id: str, epoch: int) -> str:
    """An epoch's audit branch in each table of its sink (design.md D23): one per epoch, so that
    epochs audited at once are each read against the sink's branch plus themselves alone."""
    return f"{_AUDIT_BRANCH_PREFIX}{sink_id}-{epoch}"


def marker_properties(
    sink_id: str,
    epoch: int,
    write_id: str,
    revision: int = 0,
    consumed: SnapshotRange | None = None,
    *,
    branch: str = "main",
) -> dict[str, str]:
    """The summary properties one commit writes; strings because the summary is a string map."""
    props = {SINK_ID_KEY: sink_id, EPOCH_KEY: str(epoch), WRITE_ID_KEY: write_id}
    if branch == audit_branch_name(sink_id, epoch):
        props[AUDIT_BRANCH_KEY] = branch
    if revision:
        props[REVISION_KEY] = str(revision)
    if consumed is not None:
        props[SOURCE_TABLE_KEY] = consumed.table
        if consumed.after_snapshot_id is not None:
            props[SOURCE_AFTER_KEY] = str(consumed.after_snapshot_id)
        if consumed.to_snapshot_id is not None:
            props[SOURCE_TO_KEY] = str(consumed.to_snapshot_id)
    return props


def recent_snapshots(metadata: TableMetadata, not_before_ms: int) -> dict[int, Snapshot]:
    """Snapshots with ``timestamp_ms >= not_before_ms``, by id, found by scanning from the newest.

    Snapshots are appended to the metadata in commit order, so the scan stops at the first one older
    than the bound. A writer whose clock ran behind could have appended a slightly older timestamp
    after newer ones; the caller's clock-skew margin (subtracted from the bound) absorbs that.
    """
    recent: dict[int, Snapshot] = {}
    snapshots = metadata.snapshots
    for index in range(len(snapshots) - 1, -1, -1):
        snapshot = snapshots[index]
        if snapshot.timestamp_ms < not_before_ms:
            break
        recent[snapshot.snapshot_id] = snapshot
    return recent


def recent_ancestry(metadata: TableMetadata, *, branch: str, not_before_ms: int) -> list[Snapshot]:
    """The branch head and its ancestors, newest first, as far back as the recent index reaches."""
    ref = metadata.refs.get(branch)
    if ref is None:
        return []
    recent = recent_snapshots(metadata, not_before_ms)
    chain: list[Snapshot] = []
    snapshot_id: int | None = ref.snapshot_id
    while snapshot_id is not None and snapshot_id in recent:
        snapshot = recent.pop(snapshot_id)  # pop: a corrupt parent cycle cannot loop forever
        chain.append(snapshot)
        snapshot_id = snapshot.parent_snapshot_id
    return chain


def marker_of(snapshot: Snapshot) -> Mapping[str, str] | None:
    """The snapshot's marker properties, or ``None`` when it carries no (complete) marker."""
    summary = snapshot.summary
    if summary is None:
        return None
    props = summary.additional_properties
    if SINK_ID_KEY not in props or EPOCH_KEY not in props:
        return None
    return props


def find_marker(
    metadata: TableMetadata, sink_id: str, epoch: int, *, branch: str, not_before_ms: int
) -> tuple[int, str] | None:
    """``(snapshot_id, write_id)`` of the snapshot on ``branch`` that committed (sink, epoch), if recent.

    Only ancestors with ``timestamp_ms >= not_before_ms`` are looked at: the epoch cannot have been
    committed before its row was written, and the bound keeps the cost independent of history.
    """
    wanted_epoch = str(epoch)
    for snapshot in recent_ancestry(metadata, branch=branch, not_before_ms=not_before_ms):
        props = marker_of(snapshot)
        if props is not None and props[SINK_ID_KEY] == sink_id and props[EPOCH_KEY] == wanted_epoch:
            return snapshot.snapshot_id, props.get(WRITE_ID_KEY, "")
    return None


def sink_markers(
    metadata: TableMetadata, sink_id: str, *, branch: str, not_before_ms: int
) -> dict[str, tuple[int, str, int]]:
    """Per epoch (as the marker writes it): ``(snapshot_id, write_id, timestamp_ms)`` of the newest
    snapshot on ``branch`` with the sink's marker, as far back as ``not_before_ms``.

    One walk answers ``find_marker`` for every epoch of a batch: asking per epoch would walk the same
    recent snapshots once per epoch. A caller whose epochs have different bounds passes the oldest
    and compares each epoch's own bound with the timestamp.
    """
    found: dict[str, tuple[int, str, int]] = {}
    for snapshot in recent_ancestry(metadata, branch=branch, not_before_ms=not_before_ms):
        props = marker_of(snapshot)
        if props is not None and props[SINK_ID_KEY] == sink_id and props[EPOCH_KEY] not in found:
            found[props[EPOCH_KEY]] = (snapshot.snapshot_id, props.get(WRITE_ID_KEY, ""), snapshot.timestamp_ms)
    return found


# How far back a table's snapshots still prove anything about a write (design.md, 'The Iceberg commit').
#
# A commit's marker lives in its snapshot's summary. Once snapshot expiry may have removed snapshots
# as old as a write, the marker's absence no longer proves the write uncommitted, and what those
# snapshots added can no longer be looked at: the committer refuses to commit such a write unless an
# operator allows it, and a clean-up looks at every file the table's refs can still read instead.


def max_snapshot_age_ms(metadata: TableMetadata, branch: str) -> int:
    """How long the table keeps the branch's snapshots: the ref's own setting, else the table's."""
    ref = metadata.refs.get(branch)
    if ref is not None and ref.max_snapshot_age_ms:
        return ref.max_snapshot_age_ms
    max_age_ms = property_as_int(
        metadata.properties,
        TableProperties.MAX_SNAPSHOT_AGE_MS,
        TableProperties.MAX_SNAPSHOT_AGE_MS_DEFAULT,
    )
    assert max_age_ms is not None  # the default is not None
    return max_age_ms


def check_horizon(
    metadata: TableMetadata,
    branch: str,
    *,
    owner: str,
    table: str,
    since: datetime,
    not_before_ms: int,
    clock_skew: timedelta,
) -> None:
    """Refuse (``MarkerHorizonExceeded``) when snapshots as old as the write may already be expired.

    ``not_before_ms`` is ``since`` minus ``clock_skew``, in milliseconds; ``owner`` names the write.
    """
    max_age_ms = max_snapshot_age_ms(metadata, branch)
    if not_before_ms < time.time() * 1000 - max_age_ms:
        raise MarkerHorizonExceeded(
            f"{owner}: table {table!r} keeps snapshots for "
            f"{timedelta(milliseconds=max_age_ms)} ({TableProperties.MAX_SNAPSHOT_AGE_MS}), but the "
            f"write dates from {since.isoformat()} (minus {clock_skew} clock skew): its marker "
            "may have expired, so its absence does not prove the epoch uncommitted. Check the "
            "table's history, then commit with allow_beyond_horizon=True, or abort."
        )


# Which data files an Iceberg table references: what a delete must prove absent (invariant 4),
# and the refusal of a delete that would remove any.
#
# Two looks, from cheap to complete: the files the snapshots since a write *added* (a write's files can
# only have entered the table after its row was written), and, beyond the snapshot-retention horizon
# where those snapshots may be gone, every file any branch or tag can still read.

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
