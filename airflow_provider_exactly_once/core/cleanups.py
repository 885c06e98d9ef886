"""Deleting the files of writes nobody may see again (design.md D3, D9): the clean-up queue worked
through under the same checks for every phase, the rules of which write locations are orphans, and
the stray files a sink can leave; and a write that reaches persist through its write location
instead of XCom (design.md D17), found among the same locations the orphan scan lists.

Beside the coordinator rather than in it because every phase ends here (a replaced write, an
abort, a late or discarded write, a replaced revision, an orphan) and recovery, ``eo-sink gc`` and
their dry runs apply the same rules through the same path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from airflow_provider_exactly_once.core.epochs import EpochStatus, check_epoch, check_write_id
from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    MetaStoreUnavailable,
    SinkLocked,
    StateConflict,
    mask_userinfo,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.outcomes import CleanupReport, SinkRecoveryReport
from airflow_provider_exactly_once.core.ports import (
    ORPHAN_EPOCH,
    CleanupTask,
    SinkCommitter,
    SinkRegistry,
    SinkStateStore,
)
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteLocation:
    """One write's folder for one target: ``table`` is the Iceberg table or the file sink's root."""

    table: str
    location: str


@dataclass(frozen=True)
class FileAge:
    files: int
    #: ``None`` when the storage reported no modification time for some file: age unknown.
    oldest: datetime | None
    newest: datetime | None

    @classmethod
    def of(cls, mtimes: Iterable[datetime | None]) -> FileAge:
        """The age of files by their modification times; one unknown time makes the age unknown."""
        times = list(mtimes)
        if not times or any(t is None for t in times):
            return cls(len(times), None, None)
        known = [t for t in times if t is not None]
        return cls(len(known), min(known), max(known))

    @classmethod
    def combined(cls, ages: Sequence[FileAge]) -> FileAge:
        """The age of one write's files over all its locations (a fan-out writes one per table)."""
        files = sum(a.files for a in ages)
        dated = [a for a in ages if a.files and a.newest is not None]
        if not dated or any(a.files and a.newest is None for a in ages):
            return cls(files, None, None)
        oldest = min(a.oldest for a in dated if a.oldest is not None)
        newest = max(a.newest for a in dated if a.newest is not None)
        return cls(files, oldest, newest)


@dataclass(frozen=True)
class WriteFolder:
    """A write location found on storage. Its files are listed only when ``age`` is asked, which the
    scan does only for writes the store does not know (committed Iceberg writes keep their folder,
    so the folder count grows with history; their files are never listed)."""

    location: WriteLocation
    age: Callable[[], FileAge]
    #: The pre-commit the write left here when it finished (``core/cleanups.py``), or ``None``.
    left_pre_commit: Callable[[], bytes | None] = field(default=lambda: None)


class WriteFolderListing(Protocol):
    """A sink's write folders on storage, by write id: what a scan asks the sink for
    (``sinks/write_locations.py`` lists them for each kind of sink)."""

    def folders(self) -> Mapping[str, Sequence[WriteFolder]]: ...


@runtime_checkable
class StrayFiles(Protocol):
    """A sink's files outside its write locations that nothing references and no commit ever will,
    as its listing finds them (``sinks/write_locations.py``), and their removal."""

    def stray_files(self, older_than: datetime) -> list[str]: ...

    def remove_stray(self, paths: Sequence[str]) -> int:
        """Delete ``paths`` (``stray_files``' answer); how many were there."""
        ...


@dataclass(frozen=True)
class OrphanCandidate:
    """A write location nobody answers for, with the age of its files."""

    sink_id: str
    write_id: str
    locations: tuple[WriteLocation, ...]
    age: FileAge

    def pre_commit(self) -> PreCommit:
        """The write as the committers' ``delete_write`` takes it: its locations, no data files.

        Its epoch is unknown (``ORPHAN_EPOCH``); the committers check the locations themselves (file
        sink: no commit-started marker; Iceberg: inside the table, not referenced by it).
        """
        return PreCommit(
            sink_id=self.sink_id,
            epoch=ORPHAN_EPOCH,
            write_id=self.write_id,
            tables=[TableWrite(table=w.table, location=w.location) for w in self.locations],
        )

    def older_than(self, cutoff: datetime) -> bool:
        return self.age.files > 0 and self.age.newest is not None and self.age.newest < cutoff

    def reason(self, grace: timedelta) -> str:
        where = ", ".join(location.location for location in self.locations)
        newest = self.age.newest.isoformat() if self.age.newest else "?"
        return (
            f"recovery: orphaned write location(s) {where}: no Pending or Committed epoch and no clean-up names "
            f"write {self.write_id}, and its {self.age.files} file(s) are older than {grace} (newest {newest})"
        )


def write_ids(names: Iterable[str]) -> list[str]:
    """Folder names that are canonical write ids; anything else is not ours to judge."""
    ids = []
    for name in names:
        try:
            if check_write_id(name) == name:
                ids.append(name)
        except InvalidPreCommit:
            continue
    return ids


def classify_orphans(
    sink_id: str,
    folders: Mapping[str, Sequence[WriteFolder]],
    registry: SinkRegistry,
    *,
    grace: timedelta,
    now: datetime | None = None,
) -> tuple[list[OrphanCandidate], list[OrphanCandidate]]:
    """The write folders (by write id) that no Pending/Committed row and no queued clean-up names.

    Returns ``(old, young)``: ``old`` have files all older than ``grace`` (safe to hand to the
    clean-up path); ``young`` may belong to a write still running or about to be persisted, or
    have files of unknown age, and are kept. Empty folders are ignored.
    """
    if grace < timedelta(0):
        raise ValueError(f"orphan grace must not be negative, got {grace}")
    unknown = sorted(set(folders) - registry.known_writes(sink_id, sorted(folders)))
    cutoff = (now or datetime.now(UTC)) - grace
    old: list[OrphanCandidate] = []
    young: list[OrphanCandidate] = []
    for write_id in unknown:
        found = folders[write_id]
        age = FileAge.combined([folder.age() for folder in found])
        if age.files == 0:
            continue
        candidate = OrphanCandidate(sink_id, write_id, tuple(folder.location for folder in found), age)
        (old if candidate.older_than(cutoff) else young).append(candidate)
    log.info(
        "sink %r: %d write location(s), %d unknown to the store: %d orphaned past the %s grace, %d kept",
        sink_id,
        len(folders),
        len(unknown),
        len(old),
        grace,
        len(young),
    )
    return old, young


def scan_orphans(
    sink_id: str, listing: WriteFolderListing, registry: SinkRegistry, grace: timedelta
) -> tuple[list[OrphanCandidate], list[OrphanCandidate], str | None]:
    """The sink's orphans, ``(old, young, None)``: ``classify_orphans`` of what ``listing`` finds, the
    one scan behind recovery's removal, ``eo-sink gc`` and their dry runs. A listing that fails is
    ``([], [], why)``, its secrets masked, not an error: recovery reports it and still finishes the
    sink's epochs. ``MetaStoreUnavailable`` is raised: without the store nothing can go on.
    """
    try:
        old, young = classify_orphans(sink_id, listing.folders(), registry, grace=grace)
    except MetaStoreUnavailable:
        raise
    except Exception as exc:
        log.warning("sink %r: the orphan scan failed: %s", sink_id, exc, exc_info=True)
        return [], [], mask_userinfo(f"sink {sink_id!r}: {type(exc).__name__}: {exc}")
    return old, young, None


def queue_orphans(registry: SinkRegistry, old: Sequence[OrphanCandidate], grace: timedelta) -> set[str]:
    """Queue each old orphan for the coordinator's clean-up path; the write ids queued.

    A write persisted since the scan is refused by the store (``StateConflict``): it is no orphan.
    """
    queued: set[str] = set()
    for candidate in old:
        assert candidate.age.oldest is not None  # only dated candidates are old enough to be queued
        try:
            registry.enqueue_orphan_cleanup(
                candidate.pre_commit(), reason=candidate.reason(grace), written_since=candidate.age.oldest
            )
        except StateConflict as exc:
            log.info("sink %r: %s", candidate.sink_id, exc)
            continue
        queued.add(candidate.write_id)
    return queued


def clean_up(
    store: SinkStateStore, committer: SinkCommitter, sink_id: str, epoch: int | None, *, fault: FaultHook = no_faults
) -> CleanupReport:
    """Run the queued clean-ups of a sink (or of one epoch) alone, without touching any epoch's status.

    What an operator asks for after a crash left an Aborted epoch's files, or after queuing
    orphaned write locations; the same checks as every other delete apply (invariant 4). A
    clean-up that fails is in the report's ``failed`` and stays queued.
    """
    if epoch is not None:
        check_epoch(epoch)
    report = CleanupReport(sink_id)
    report.files_deleted = run_cleanups(store, committer, sink_id, epoch, report=report, fault=fault)
    return report


def run_cleanups(
    store: SinkStateStore,
    committer: SinkCommitter,
    sink_id: str,
    epoch: int | None,
    *,
    report: CleanupReport | None = None,
    fault: FaultHook = no_faults,
) -> int:
    """Run the sink's queued clean-ups (or one epoch's); the number of files deleted.

    Without a ``report`` the first failure is raised; with one, each failure is recorded there
    against its epoch and the others still run (what recovery and ``eo-sink gc`` want).
    """
    deleted = 0
    for task in store.cleanups(sink_id, epoch):
        if not task.pre_commit.written:  # the record of an abort without a write has no files
            store.complete_cleanup(task.id)
            continue
        row = store.get(task.sink_id, task.epoch)
        if row is not None and row.write_id == task.write_id and row.status is not EpochStatus.ABORTED:
            if row.status is EpochStatus.COMMITTED:
                store.complete_cleanup(task.id)  # its files are the table's now
            continue
        since = min(row.created_at, task.created_at) if row is not None else task.created_at
        try:
            freed = _delete(committer, task, since)
        except Exception as exc:
            if report is None or isinstance(exc, MetaStoreUnavailable):
                raise
            report.failed[task.epoch] = f"clean-up of write {task.write_id}: {type(exc).__name__}: {exc}"
            continue
        if freed is None:
            continue  # not yet: older snapshots still list a replaced write's files
        deleted += freed
        fault("cleanup.deleted")
        store.complete_cleanup(task.id)
    return deleted


def _delete(committer: SinkCommitter, task: CleanupTask, since: datetime) -> int | None:
    if task.removed_by is not None:
        # A write a revision replaced: older snapshots list its files until they expire.
        return committer.delete_replaced(task.pre_commit, task.removed_by, task.created_at)
    return committer.delete_write(task.pre_commit, since)


@contextmanager
def sink_lock(registry: SinkRegistry, sink_id: str, holder: str, ttl: timedelta) -> Iterator[None]:
    """Hold the sink's lock: two recoveries (or a recovery and ``eo-sink gc``) never work on one sink at once."""
    acquired, by, until = registry.acquire_sink_lock(sink_id, holder, ttl=ttl)
    if not acquired:
        raise SinkLocked(f"sink {sink_id!r} is being recovered by {by!r} (lock held until {until.isoformat()})")
    try:
        yield
    finally:
        try:
            registry.release_sink_lock(sink_id, holder)
        except MetaStoreUnavailable:
            log.warning("could not release the lock of sink %r; it expires by itself", sink_id)


def remove_orphans(
    store: SinkStateStore,
    registry: SinkRegistry,
    committer: SinkCommitter,
    listing: WriteFolderListing,
    sink_id: str,
    *,
    holder: str,
    grace: timedelta,
    lock_ttl: timedelta,
    fault: FaultHook = no_faults,
) -> SinkRecoveryReport:
    """Only the orphan half of a sink's recovery (``eo-sink gc``): no epoch's status is touched.

    Orphans go through the store's clean-up queue and the clean-up path, with the sink's committer,
    under the sink's lock, exactly as the recovery DAG removes them.
    """
    with sink_lock(registry, sink_id, holder, lock_ttl):
        report = SinkRecoveryReport(sink_id=sink_id)
        enqueued = queue_old_orphans(registry, sink_id, listing, grace, report)
        result = clean_up(store, committer, sink_id, ORPHAN_EPOCH, fault=fault)
        report.files_deleted = result.files_deleted
        settle_orphans(store, enqueued, result, report)
        stray, failed = scan_stray(listing, grace)
        if failed is not None:
            report.failed["stray files"] = failed
        elif stray:
            assert isinstance(listing, StrayFiles)
            report.files_deleted += listing.remove_stray(stray)
            report.stray_removed = stray
        return report


def scan_stray(listing: WriteFolderListing, grace: timedelta) -> tuple[list[str], str | None]:
    """The sink's stray files older than ``grace`` (none where its listing has no such files), or
    ``([], why)`` when they could not be listed, its secrets masked."""
    if not isinstance(listing, StrayFiles):
        return [], None
    try:
        return listing.stray_files(datetime.now(UTC) - grace), None
    except Exception as exc:
        log.warning("the scan for stray files failed: %s", exc, exc_info=True)
        return [], mask_userinfo(f"{type(exc).__name__}: {exc}")


def queue_old_orphans(
    registry: SinkRegistry, sink_id: str, listing: WriteFolderListing, grace: timedelta, report: SinkRecoveryReport
) -> set[str]:
    """Queue every orphan older than ``grace`` for the clean-up path; their write ids. A failed scan
    is in the report: it must not stop the epochs' recovery."""
    old, young, failed = scan_orphans(sink_id, listing, registry, grace)
    if failed is not None:
        report.failed["orphan scan"] = failed
    report.orphans_kept = [candidate.write_id for candidate in young]
    return queue_orphans(registry, old, grace)


def settle_orphans(
    store: SinkStateStore, enqueued: set[str], result: CleanupReport, report: SinkRecoveryReport
) -> None:
    """An orphan is removed once its clean-up left the queue; what is still queued failed."""
    remaining = {task.write_id for task in store.cleanups(report.sink_id, ORPHAN_EPOCH)}
    report.orphans_removed = sorted(enqueued - remaining)
    for write_id in sorted(remaining):
        report.failed[f"orphan {write_id}"] = result.failed.get(ORPHAN_EPOCH, "its clean-up did not complete")


class NoWriteLeft(InvalidPreCommit):
    """The write task returned no pre-commit and no finished write of the epoch left one."""


@dataclass(frozen=True)
class LeftWrite:
    pre_commit: PreCommit
    #: The newest modification time of the write's files (``None``: unknown).
    newest: datetime | None


def left_writes(
    sink_id: str, epoch: int, folders: Mapping[str, Sequence[WriteFolder]], registry: SinkRegistry
) -> list[LeftWrite]:
    """The finished writes of the sink's ``epoch`` that no row or clean-up of the store names, newest
    first (those of unknown age last)."""
    unknown = sorted(set(folders) - registry.known_writes(sink_id, sorted(folders)))
    found: list[LeftWrite] = []
    for write_id in unknown:
        pre_commit = _left_in(write_id, folders[write_id])
        if pre_commit is None or (pre_commit.sink_id, pre_commit.epoch) != (sink_id, epoch):
            continue
        age = FileAge.combined([folder.age() for folder in folders[write_id]])
        found.append(LeftWrite(pre_commit, age.newest))
    dated = sorted((w for w in found if w.newest is not None), key=lambda w: w.newest or datetime.min, reverse=True)
    return dated + [w for w in found if w.newest is None]


def newest_left_write(
    sink_id: str, epoch: int, folders: Mapping[str, Sequence[WriteFolder]], registry: SinkRegistry, task: str
) -> PreCommit:
    """The write persist takes when task ``task`` returned none: the newest finished one."""
    found = left_writes(sink_id, epoch, folders, registry)
    if not found:
        raise NoWriteLeft(
            f"task {task!r} returned no pre-commit, and no finished write of sink {sink_id!r} epoch {epoch} left one "
            f"in the sink's write locations ({len(folders)} listed): the write task must run the epoch writer "
            "(its application, or write_epoch in a PySpark job), which leaves it there; clear the write task "
            "to write the epoch again"
        )
    chosen, *others = found
    if others:
        log.warning(
            "sink %r epoch %d: %d finished writes left no XCom; taking the newest, %s; %s stay unknown to the "
            "store and are removed as orphans after the grace",
            sink_id,
            epoch,
            len(found),
            chosen.pre_commit.write_id,
            ", ".join(w.pre_commit.write_id for w in others),
        )
    return chosen.pre_commit


def _left_in(write_id: str, folders: Sequence[WriteFolder]) -> PreCommit | None:
    for folder in folders:
        data = folder.left_pre_commit()
        if data is None:
            continue
        try:
            pre_commit = PreCommit.from_json(data)
        except InvalidPreCommit as exc:
            log.info("write %s: its pre-commit at %s is unreadable, not taken: %s", write_id, folder.location, exc)
            return None
        return pre_commit if pre_commit.write_id == write_id else None
    return None


__all__ = [
    "FileAge",
    "OrphanCandidate",
    "StrayFiles",
    "WriteFolder",
    "WriteFolderListing",
    "WriteLocation",
    "classify_orphans",
    "clean_up",
    "queue_old_orphans",
    "remove_orphans",
    "run_cleanups",
    "scan_orphans",
    "scan_stray",
    "settle_orphans",
    "sink_lock",
]
