"""The commit marker in the snapshot summary, and the bounded look-back that finds it.

The marker is what makes a commit idempotent (design.md section 5): before appending, the committer
asks "does the branch already show this (sink, epoch)?". The question must cost what happened since
the write, not the table's history, so nothing here calls ``TableMetadata.snapshot_by_id``,
``snapshot_by_name`` or ``ancestors_of``: each of those scans the whole snapshot list per lookup, which
would make a walk quadratic in history. Instead the recent snapshots are indexed once, from the end of
the list, and the walk stays inside that index.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from airflow_provider_exactly_once.core.input_ranges import SnapshotRange

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


def marker_properties(
    sink_id: str, epoch: int, write_id: str, revision: int = 0, consumed: SnapshotRange | None = None
) -> dict[str, str]:
    """The summary properties one commit writes; strings because the summary is a string map."""
    props = {SINK_ID_KEY: sink_id, EPOCH_KEY: str(epoch), WRITE_ID_KEY: write_id}
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
