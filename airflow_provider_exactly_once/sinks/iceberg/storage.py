"""Existence checks and deletes of a write's files, through the table's own FileIO.

The table's FileIO carries the catalog's storage credentials and settings, so it is used rather than a
second, differently configured client. FileIO has no listing, so deleting a whole write location asks
the file system underneath it (pyarrow's for ``PyArrowFileIO``, fsspec's for ``FsspecFileIO``) and
falls back to plain fsspec for any other FileIO.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from pyarrow import fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

#: Existence checks are latency-bound (one request each on an object store), not CPU-bound.
_EXISTS_THREADS = 16


def missing_files(io: FileIO, paths: Sequence[str]) -> list[str]:
    """The paths that do not exist, in the order given."""
    if not paths:
        return []
    local = _local_paths(paths)
    if local is not None:
        return _missing_local(paths, local)

    def exists(path: str) -> bool:
        return bool(io.new_input(path).exists())

    if len(paths) == 1:
        return [] if exists(paths[0]) else list(paths)
    with ThreadPoolExecutor(max_workers=min(_EXISTS_THREADS, len(paths))) as pool:
        found = list(pool.map(exists, paths))
    return [path for path, ok in zip(paths, found, strict=True) if not ok]


def _local_paths(paths: Sequence[str]) -> list[str] | None:
    """The local file-system paths, when every path is local (``/x``, ``file:/x``, ``file:///x``)."""
    local = []
    for path in paths:
        if path.startswith("/"):
            local.append(path)
        elif path.startswith("file:///"):
            local.append(path[7:])
        elif path.startswith("file:/") and not path.startswith("file://"):
            local.append(path[5:])
        else:
            return None  # an object store, or a file URL with a host: ask the FileIO per file
    return local


def _missing_local(paths: Sequence[str], local: Sequence[str]) -> list[str]:
    """One directory listing per folder instead of one stat per file: a write's thousands of files
    sit in a handful of folders, and per-file calls through a thread pool cost more than the I/O."""
    listings: dict[str, set[str]] = {}
    missing = []
    for path, local_path in zip(paths, local, strict=True):
        folder, _, name = local_path.rpartition("/")
        if folder not in listings:
            try:
                listings[folder] = set(os.listdir(folder or "/"))
            except FileNotFoundError:
                listings[folder] = set()
        if name not in listings[folder]:
            missing.append(path)
    return missing


def delete_tree(io: FileIO, location: str) -> int:
    """Delete every file below ``location``; return how many were deleted. Missing is not an error."""
    if isinstance(io, PyArrowFileIO):
        return _delete_tree_pyarrow(io, location)
    if isinstance(io, FsspecFileIO):
        return _delete_tree_fsspec(io.get_fs(_scheme(location)), location)
    filesystem, path = fsspec.core.url_to_fs(location)
    return _delete_tree_fsspec(filesystem, path)


def _scheme(location: str) -> str:
    return location.split("://", 1)[0] if "://" in location else "file"


def _delete_tree_pyarrow(io: PyArrowFileIO, location: str) -> int:
    scheme, netloc, path = io.parse_location(location, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    deleted = 0
    for info in infos:
        if info.type == pafs.FileType.File:
            try:
                filesystem.delete_file(info.path)
            except FileNotFoundError:
                continue
            deleted += 1
    # Directories only exist on hierarchical file systems; their absence is fine.
    with contextlib.suppress(FileNotFoundError, OSError):
        if filesystem.get_file_info(path).type == pafs.FileType.Directory:
            filesystem.delete_dir(path)
    return deleted


def _delete_tree_fsspec(filesystem: Any, location: str) -> int:
    try:
        files = list(filesystem.find(location))
    except FileNotFoundError:
        return 0
    deleted = 0
    for path in files:
        try:
            filesystem.rm_file(path)
        except FileNotFoundError:
            continue
        deleted += 1
    with contextlib.suppress(FileNotFoundError, OSError):
        if filesystem.exists(location):
            filesystem.rm(location, recursive=True)
    return deleted
