"""Finding orphaned write locations: files of writes the meta store does not answer for.

A write puts its files under a location unique to it (an Iceberg table's ``<data>/_eo/<write_id>/``,
a file sink's ``<root>/_staging/<write_id>/``) *before* it is persisted. A Spark job killed after
writing, or a write task that crashed before its XCom was read, leaves such a location that no row
and no clean-up names: nothing in the protocol will ever delete it. This module only *finds* them;
deleting goes through the store's clean-up queue and the coordinator's clean-up path, so the
committers' own checks (invariant 4) decide whether anything may go.

Cost: one listing of the write-location folders, one store query for their ids, and a recursive
listing only of the locations the store does not know (committed Iceberg writes keep their folder,
so the folder count grows with history, their files are never listed).

On an object store the "folders" are key prefixes: the listing of ``_eo/`` is one delimited prefix
listing, a write location whose objects are all gone is simply absent from it, and a location is
dated by the objects below it, never by a directory's own time (there is none).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.identifiers import check_write_id
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH, SinkRegistry
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import load_table
from airflow_provider_exactly_once.sinks.iceberg.storage import fsspec_filesystem
from airflow_provider_exactly_once.sinks.layout import file_writes_folder, iceberg_data_root, iceberg_writes_folder

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


class _Tree(Protocol):
    def subdirectories(self, path: str) -> list[str]: ...

    def file_age(self, path: str) -> FileAge: ...


class _ArrowTree:
    def __init__(self, filesystem: Any) -> None:
        self._fs = filesystem

    def subdirectories(self, path: str) -> list[str]:
        infos = self._fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
        return [info.base_name for info in infos if info.type == pafs.FileType.Directory]

    def file_age(self, path: str) -> FileAge:
        infos = self._fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        return _age(_as_utc(info.mtime) for info in infos if info.type == pafs.FileType.File)


class _FsspecTree:
    def __init__(self, filesystem: Any) -> None:
        self._fs = filesystem

    def subdirectories(self, path: str) -> list[str]:
        self._fs.invalidate_cache(path)
        try:
            entries = self._fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(e["name"]).rstrip("/")) for e in entries if e.get("type") == "directory"]

    def file_age(self, path: str) -> FileAge:
        try:
            found: Mapping[str, Mapping[str, Any]] = self._fs.find(path, detail=True)
        except FileNotFoundError:
            return FileAge(0, None, None)
        return _age(_fsspec_mtime(info) for info in found.values())


def _age(mtimes: Iterable[datetime | None]) -> FileAge:
    times = list(mtimes)
    if not times or any(t is None for t in times):
        return FileAge(len(times), None, None)
    known = [t for t in times if t is not None]
    return FileAge(len(known), min(known), max(known))


def _as_utc(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, str):
        try:
            return _as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def _fsspec_mtime(info: Mapping[str, Any]) -> datetime | None:
    """Filesystems name the modification time differently (local, S3, GCS, Azure)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        if info.get(key) is not None:
            return _as_utc(info[key])
    return None


def _tree_of_io(io: FileIO, location: str) -> tuple[_Tree, str]:
    """The table FileIO's own file system (its credentials), as ``storage.delete_tree`` uses it."""
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = io.parse_location(location, io.properties)
        return _ArrowTree(io.fs_by_scheme(scheme, netloc)), path
    # Any other FileIO: fsspec configured from the same properties, never a bare URL (no credentials).
    filesystem, path = fsspec_filesystem(io, location)
    return _FsspecTree(filesystem), path


def _write_ids(names: Iterable[str]) -> list[str]:
    """Folder names that are canonical write ids; anything else is not ours to judge."""
    ids = []
    for name in names:
        try:
            if check_write_id(name) == name:
                ids.append(name)
        except InvalidPreCommit:
            continue
    return ids


def _iceberg_locations(sink: IcebergSinkConfig, catalog: Catalog) -> dict[str, list[tuple[WriteLocation, _Tree, str]]]:
    found: dict[str, list[tuple[WriteLocation, _Tree, str]]] = {}
    for name in sink.tables:
        table = load_table(catalog, name)
        parent = iceberg_writes_folder(iceberg_data_root(table.location(), table.properties))
        tree, parent_path = _tree_of_io(table.io, parent)
        for write_id in _write_ids(tree.subdirectories(parent_path)):
            location = WriteLocation(name, f"{parent}/{write_id}")
            found.setdefault(write_id, []).append((location, tree, posixpath.join(parent_path, write_id)))
    return found


def _file_sink_locations(
    sink: FileSinkConfig, storage_options: Mapping[str, Any] | None
) -> dict[str, list[tuple[WriteLocation, _Tree, str]]]:
    committer = sink.committer(storage_options=storage_options)
    filesystem = committer.filesystem
    root_path = str(filesystem._strip_protocol(committer.root))
    tree = _FsspecTree(filesystem)
    found: dict[str, list[tuple[WriteLocation, _Tree, str]]] = {}
    folder = file_writes_folder(root_path)
    for write_id in _write_ids(tree.subdirectories(folder)):
        location = WriteLocation(committer.root, committer.staging_location(write_id))
        found[write_id] = [(location, tree, posixpath.join(folder, write_id))]
    return found


def find_orphans(
    sink: SinkConfig,
    registry: SinkRegistry,
    *,
    grace: timedelta,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> tuple[list[OrphanCandidate], list[OrphanCandidate]]:
    """The sink's write locations that no Pending/Committed row and no queued clean-up names; a
    file sink's root is opened with ``storage_options`` (its connection resolved, ``runtime.storage_options``).

    Returns ``(old, young)``: ``old`` have files all older than ``grace`` (safe to hand to the
    clean-up path); ``young`` may belong to a write still running or about to be persisted, or
    have files of unknown age, and are kept. Empty folders are ignored.
    """
    if grace < timedelta(0):
        raise ValueError(f"orphan grace must not be negative, got {grace}")
    if isinstance(sink, IcebergSinkConfig):
        if catalog is None:
            raise ValueError(f"sink {sink.sink_id!r}: an Iceberg sink needs its catalog to list write locations")
        locations = _iceberg_locations(sink, catalog)
    else:
        locations = _file_sink_locations(sink, storage_options)
    unknown = sorted(set(locations) - registry.known_writes(sink.sink_id, sorted(locations)))
    cutoff = (now or datetime.now(UTC)) - grace
    old: list[OrphanCandidate] = []
    young: list[OrphanCandidate] = []
    for write_id in unknown:
        entries = locations[write_id]
        ages = [tree.file_age(path) for _, tree, path in entries]
        unknown_age = any(a.files and a.newest is None for a in ages)
        dated = [a for a in ages if a.files and a.newest is not None]
        age = FileAge(
            sum(a.files for a in ages),
            None if unknown_age or not dated else min(a.oldest for a in dated if a.oldest is not None),
            None if unknown_age or not dated else max(a.newest for a in dated if a.newest is not None),
        )
        if age.files == 0:
            continue
        candidate = OrphanCandidate(sink.sink_id, write_id, tuple(loc for loc, _, _ in entries), age)
        (old if candidate.older_than(cutoff) else young).append(candidate)
    log.info(
        "sink %r: %d write location(s), %d unknown to the store: %d orphaned past the %s grace, %d kept",
        sink.sink_id,
        len(locations),
        len(unknown),
        len(old),
        grace,
        len(young),
    )
    return old, young
