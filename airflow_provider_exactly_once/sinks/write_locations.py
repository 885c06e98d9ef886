"""A sink's write locations as they are on storage, with the age of their files: what the orphan scan
lists (``core/cleanups.py`` decides which are orphans), and an Iceberg sink's stray metadata files.

Each listing runs on its committer's own catalog or file system, so a scan opens nothing of its own,
and costs one listing of the write-location folders per target. On an object store a location is a
key prefix, dated by the objects below it (there is no directory time). The contract: design.md D9.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pyarrow import fs as pafs
from pyiceberg.catalog import TABLE_METADATA_FILE_NAME_REGEX, Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.cleanups import FileAge, WriteFolder, WriteLocation, write_ids
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import fsspec_filesystem, load_table
from airflow_provider_exactly_once.sinks.layout import (
    PRE_COMMIT_FILE,
    file_writes_folder,
    iceberg_data_root,
    iceberg_write_location,
    iceberg_writes_folder,
    pre_commit_from_file,
)


class _ArrowTree:
    def __init__(self, filesystem: Any) -> None:
        self._fs = filesystem

    def subdirectories(self, path: str) -> list[str]:
        infos = self._fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
        return [info.base_name for info in infos if info.type == pafs.FileType.Directory]

    def file_age(self, path: str) -> FileAge:
        infos = self._fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        return FileAge.of(_as_utc(info.mtime) for info in infos if info.type == pafs.FileType.File)

    def files(self, path: str) -> list[tuple[str, datetime | None]]:
        infos = self._fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
        return [(info.base_name, _as_utc(info.mtime)) for info in infos if info.type == pafs.FileType.File]

    def pre_commit_at(self, path: str) -> bytes | None:
        try:
            with self._fs.open_input_stream(path) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return pre_commit_from_file(data)


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
        return FileAge.of(_fsspec_mtime(info) for info in found.values())

    def files(self, path: str) -> list[tuple[str, datetime | None]]:
        self._fs.invalidate_cache(path)
        try:
            entries = self._fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        return [(posixpath.basename(str(e["name"])), _fsspec_mtime(e)) for e in entries if e.get("type") == "file"]

    def pre_commit_at(self, path: str) -> bytes | None:
        try:
            data: bytes = self._fs.cat_file(path)
        except FileNotFoundError:
            return None
        return pre_commit_from_file(data)


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


def _tree_of_io(io: FileIO, location: str) -> tuple[_ArrowTree | _FsspecTree, str]:
    """The table FileIO's own file system (its credentials), as ``catalog_access.delete_tree`` uses it."""
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = io.parse_location(location, io.properties)
        return _ArrowTree(io.fs_by_scheme(scheme, netloc)), path
    # Any other FileIO: fsspec configured from the same properties, never a bare URL (no credentials).
    filesystem, path = fsspec_filesystem(io, location)
    return _FsspecTree(filesystem), path


class IcebergWriteFolders:
    """An Iceberg sink's write locations, read through the catalog its committer commits with.

    :param catalog: the sink's catalog, opened once for the committer and this listing.
    :param tables: the sink's tables.
    """

    def __init__(self, catalog: Catalog, tables: Sequence[str]) -> None:
        self._catalog = catalog
        self._tables = tuple(tables)
        #: Each stray file found, with the FileIO of its table, for ``remove_stray``.
        self._stray: dict[str, FileIO] = {}

    def folders(self) -> dict[str, list[WriteFolder]]:
        found: dict[str, list[WriteFolder]] = {}
        for name in self._tables:
            table = load_table(self._catalog, name)
            data_root = iceberg_data_root(table.location(), table.properties)
            tree, parent = _tree_of_io(table.io, iceberg_writes_folder(data_root))
            for write_id in write_ids(tree.subdirectories(parent)):
                location = WriteLocation(name, iceberg_write_location(data_root, write_id))
                path = posixpath.join(parent, write_id)
                left = partial(tree.pre_commit_at, posixpath.join(path, PRE_COMMIT_FILE))
                found.setdefault(write_id, []).append(WriteFolder(location, partial(tree.file_age, path), left))
        return found

    def stray_files(self, older_than: datetime) -> list[str]:
        """Each table's metadata files that no commit can make current any more and the table's
        metadata does not list, last modified before ``older_than``: those of a commit that died
        after writing them, before the catalog took them (a fan-out's on a SQL catalog, design.md
        D18), or that lost its compare-and-swap (``_stray_metadata`` says which are certain). Only on
        a SQL catalog, whose metadata files pyiceberg writes in this process under the rules
        ``_stray_metadata`` relies on; a REST catalog's server writes its own."""
        found: list[str] = []
        if not isinstance(self._catalog, SqlCatalog):
            return found
        for name in self._tables:
            table = load_table(self._catalog, name)
            folder = posixpath.dirname(table.metadata_location)
            tree, path = _tree_of_io(table.io, folder)
            for file_name in _stray_metadata(table, folder, tree.files(path), older_than):
                found.append(f"{folder}/{file_name}")
                self._stray[found[-1]] = table.io
        return found

    def remove_stray(self, paths: Sequence[str]) -> int:
        removed = 0
        for path in paths:
            try:
                self._stray[path].delete(path)
            except FileNotFoundError:
                continue
            removed += 1
        return removed


def _metadata_version(file_name: str) -> int | None:
    """The version in a metadata file's name as pyiceberg and Java write it (``00042-<uuid>.metadata.json``)."""
    found = TABLE_METADATA_FILE_NAME_REGEX.fullmatch(file_name)
    return int(found.group(1)) if found else None


def _stray_metadata(
    table: Table, folder: str, listed: Sequence[tuple[str, datetime | None]], older_than: datetime
) -> list[str]:
    """The names of ``listed`` (the files of the table's metadata folder) that nothing references and
    no commit ever will: a metadata file of a version no newer than the current one (a commit makes
    version n+1 current only from version n, with a compare-and-swap on the table's pointer) and no
    older than the oldest the table's metadata log keeps (older ones may be history trimmed from the
    log), neither current nor in the log, of this very table (its UUID, read from the file: a table
    dropped and created again at the same location keeps its own), last modified before ``older_than``."""
    current = _metadata_version(posixpath.basename(table.metadata_location))
    logged = {posixpath.basename(entry.metadata_file) for entry in table.metadata.metadata_log}
    logged.add(posixpath.basename(table.metadata_location))
    versions = [v for v in (_metadata_version(name) for name in logged) if v is not None]
    if current is None or not versions:
        return []
    oldest = min(versions)
    stray: list[str] = []
    for name, modified in listed:
        version = _metadata_version(name)
        if version is None or name in logged or not oldest <= version <= current:
            continue
        if modified is None or modified >= older_than:
            continue
        if FromInputFile.table_metadata(table.io.new_input(f"{folder}/{name}")).table_uuid == table.metadata.table_uuid:
            stray.append(name)
    return stray


class FileWriteFolders:
    """A file sink's write locations (its staging folders), listed on its committer's file system,
    the one its deletes use."""

    def __init__(self, committer: FileSinkCommitter) -> None:
        self._committer = committer

    def folders(self) -> dict[str, list[WriteFolder]]:
        committer = self._committer
        tree = _FsspecTree(committer.filesystem)
        folder = file_writes_folder(str(committer.filesystem._strip_protocol(committer.root)))
        found: dict[str, list[WriteFolder]] = {}
        for write_id in write_ids(tree.subdirectories(folder)):
            location = WriteLocation(committer.root, committer.staging_location(write_id))
            path = posixpath.join(folder, write_id)
            left = partial(tree.pre_commit_at, posixpath.join(path, PRE_COMMIT_FILE))
            found[write_id] = [WriteFolder(location, partial(tree.file_age, path), left)]
        return found
