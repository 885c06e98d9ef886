"""A table and its files as the catalog gives them: tables loaded with the catalog's and the driver's
errors translated into the domain's (``core.errors``), and a write's files checked and deleted through
the table's own FileIO, which carries the catalog's storage credentials.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy.exc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, ServerError, ServiceUnavailableError
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import (
    MASK,
    SECRET_PROPERTY_MARKS,
    MissingDataFiles,
    SinkUnavailable,
    UnknownTable,
    mask_userinfo,
)

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from airflow_provider_exactly_once.core.precommit import PreCommit, PreparedManifest, TableWrite


# Loading tables, with the catalog's and the driver's errors translated into the domain's.
#
# The coordinator decides retry-or-refuse from the error class alone (``core.errors``), so a missing
# table must come out as ``UnknownTable`` (retrying cannot help) and a dropped connection as
# ``SinkUnavailable`` (retrying can), whichever catalog implementation raised them.
#
# The catalog's properties hold the storage credentials of the Iceberg connection (``s3.secret-access-key``,
# the REST ``credential``, ``glue.secret-access-key``...); a driver's error text can quote a URL or a
# setting, and these messages reach task logs, the meta store's ``error`` column and the UI, so every
# one passes through ``describe_error`` first.

#: Errors meaning "the catalog or storage could not be reached", not "the request was wrong".
UNREACHABLE: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
    sqlalchemy.exc.TimeoutError,
    ServiceUnavailableError,
    ServerError,
    ConnectionError,
    TimeoutError,
    OSError,
)


def secret_values(properties: Mapping[str, Any]) -> list[str]:
    """The values of the secret-looking properties, longest first (so no secret is masked in part)."""
    values = {
        value
        for key, value in properties.items()
        if isinstance(value, str) and any(part in key.lower() for part in SECRET_PROPERTY_MARKS)
    }
    # A REST ``credential`` is ``client_id:client_secret``: its secret half can appear on its own.
    for key, value in properties.items():
        if key == "credential" and isinstance(value, str) and ":" in value:
            values.add(value.split(":", 1)[1])
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def describe_error(exc: BaseException, properties: Mapping[str, Any]) -> str:
    """``<type>: <message>`` with userinfo and the given properties' secret values masked."""
    text = mask_userinfo(f"{type(exc).__name__}: {exc}")
    for value in secret_values(properties):
        text = text.replace(value, MASK)
    return text


@contextmanager
def unavailable_when_unreachable(what: str, properties: Mapping[str, Any]) -> Iterator[None]:
    """``SinkUnavailable`` (retryable, secrets masked) for an unreachable catalog or storage.

    Reading a table's manifests, checking or deleting its files reaches object storage through the
    table's FileIO, whose errors are the driver's own (pyarrow's ``OSError``, botocore's, requests');
    a raw one would reach the coordinator as an unknown failure instead of "try again".
    """
    try:
        yield
    except UNREACHABLE as exc:
        raise SinkUnavailable(f"{what}: {describe_error(exc, properties)}") from exc


def load_table(catalog: Catalog, name: str) -> Table:
    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise UnknownTable(f"catalog {catalog.name!r} has no table {name!r}: {exc}") from exc
    except UNREACHABLE as exc:
        raise SinkUnavailable(
            f"catalog {catalog.name!r} could not load table {name!r}: {describe_error(exc, catalog.properties)}"
        ) from exc


# Existence checks and deletes of a write's files, through the table's own FileIO.
#
# The table's FileIO carries the catalog's storage credentials and settings, so it is used rather than a
# second, differently configured client. FileIO has no listing, so deleting a whole write location asks
# the file system underneath it (pyarrow's for ``PyArrowFileIO``, fsspec's for ``FsspecFileIO``). Any
# other FileIO gets fsspec's file system built by pyiceberg's ``FsspecFileIO`` from the same properties
# (``s3.endpoint``, ``s3.access-key-id``, ... become s3fs options): a bare ``fsspec`` URL would reach
# S3 with whatever credentials the worker's environment happens to hold, or none.
#
# On an object store a "directory" is only a key prefix: listings here are prefix listings, a location
# with no object below it simply does not exist, and nothing has to be removed after its files.

#: Existence checks are latency-bound (one request each on an object store), not CPU-bound.
_EXISTS_THREADS = 16


def missing_files(io: FileIO, paths: Sequence[str], *, under: str | None = None) -> list[str]:
    """The paths that do not exist, in the order given.

    ``under``: a folder holding every path (a write's own location). On an object store it is
    listed once, recursively, instead of asking for each file (a HEAD request each: 1,000 of them
    took as long as the commit's append on a REST catalog with S3); only what the listing does not
    show is asked for one by one, so a listing that lags can cost requests, never a false "missing".
    """
    if not paths:
        return []
    local = _missing_local(paths)
    if local is not None:
        return local

    def exists(path: str) -> bool:
        return bool(io.new_input(path).exists())

    unseen = list(paths) if under is None else _not_listed(io, paths, under)
    if len(unseen) <= 1:
        return [path for path in unseen if not exists(path)]
    with ThreadPoolExecutor(max_workers=min(_EXISTS_THREADS, len(unseen))) as pool:
        found = list(pool.map(exists, unseen))
    return [path for path, ok in zip(unseen, found, strict=True) if not ok]


def _as_pyarrow_io(io: FileIO) -> PyArrowFileIO | None:
    """``io`` when it is pyiceberg's pyarrow FileIO. Asked without importing that module (pyarrow's
    datasets, about 0.15 s of every task start that commits): a FileIO of that class has loaded it."""
    module = sys.modules.get("pyiceberg.io.pyarrow")
    return io if module is not None and isinstance(io, module.PyArrowFileIO) else None


def _not_listed(io: FileIO, paths: Sequence[str], under: str) -> list[str]:
    """The paths a recursive listing of ``under`` does not show (all of them when it is not there)."""
    if (pa_io := _as_pyarrow_io(io)) is not None:
        from pyarrow import fs as pafs

        scheme, netloc, folder = pa_io.parse_location(under, pa_io.properties)
        filesystem = pa_io.fs_by_scheme(scheme, netloc)
        infos = filesystem.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        listed = {info.path for info in infos if info.type == pafs.FileType.File}
        return _absent(paths, under, folder, listed, lambda path: pa_io.parse_location(path, pa_io.properties)[2])
    filesystem, folder = fsspec_filesystem(io, under)
    # Never from s3fs's listing cache: a file deleted since an earlier listing would read as there.
    filesystem.invalidate_cache(folder)
    try:
        listed = {str(name) for name in filesystem.find(folder)}
    except FileNotFoundError:
        return list(paths)
    return _absent(paths, under, str(folder), listed, lambda path: str(filesystem._strip_protocol(path)))


def _absent(paths: Sequence[str], under: str, folder: str, listed: set[str], key: Callable[[str], str]) -> list[str]:
    """The paths whose key in the file system (``key``: ``bucket/key`` for a URL) ``listed`` lacks.
    A path below ``under`` has the key of ``under`` (``folder``) followed by the rest of the path:
    parsing each of 1,000 URLs cost a commit on S3 a fifth of its time."""
    root, prefix = under.rstrip("/") + "/", folder.rstrip("/") + "/"
    cut = len(root)
    return [path for path in paths if (prefix + path[cut:] if path.startswith(root) else key(path)) not in listed]


def local_folder(path: str) -> str | None:
    """The local file-system folder of ``path`` (``/x/f``, ``file:/x/f``, ``file:///x/f``: ``/x``), or
    ``None`` for an object store or a file URL with a host (asked through the FileIO instead)."""
    if path.startswith("/"):
        local = path
    elif path.startswith("file:///"):
        local = path[7:]
    elif path.startswith("file:/") and not path.startswith("file://"):
        local = path[5:]
    else:
        return None
    return local.rpartition("/")[0] or "/"


def _missing_local(paths: Sequence[str]) -> list[str] | None:
    """``missing_files`` of local paths: one directory listing per folder instead of one stat per
    file (a write's thousands of files sit in a handful of folders, and per-file calls through a
    thread pool cost more than the I/O). Each path is only split at its last ``/``, and each folder's
    URL parsed once: at 10,000 files, parsing every path cost as much as the listing. ``None`` when
    a path is not local."""
    split = [path.rpartition("/") for path in paths]
    listings: dict[str, frozenset[str]] = {}
    for folder, path in {folder: path for path, (folder, _, _) in zip(paths, split, strict=True)}.items():
        local = local_folder(path)
        if local is None:
            return None
        try:
            listings[folder] = frozenset(os.listdir(local))
        except FileNotFoundError:
            listings[folder] = frozenset()
    return [path for path, (folder, _, name) in zip(paths, split, strict=True) if name not in listings[folder]]


def missing_in_locations(
    pre_commit: PreCommit, loaded: Sequence[tuple[TableWrite, Table]], *, every_file: bool = True
) -> list[str]:
    """The write's files not in storage: each table's data files, looked for with one listing of its
    location; or, not ``every_file``, the manifests persist wrote of them (``own_manifests``), one
    request each, a manifest of another length than recorded counting as gone, and every data file
    of a table that has none (design.md, 'The Iceberg commit', step 3)."""
    missing: list[str] = []
    for write, table in loaded:
        manifests = [] if every_file else own_manifests(write)
        what = f"{pre_commit.describe()}: could not check the files of table {write.table!r}"
        with unavailable_when_unreachable(what, table.io.properties):
            if manifests:
                missing.extend(m.path for m in manifests if _length(table.io, m.path) != m.length)
            else:
                missing.extend(missing_files(table.io, write.data_files.paths(), under=write.location))
    return missing


def own_manifests(write: TableWrite) -> list[PreparedManifest]:
    """The manifests persist wrote of the write's added files below its location (D16): nothing
    references them before the commit, so whatever removes the write's unreferenced files (an
    orphan removal, a clean-up, a person) removes them as it removes the data files. A revision's
    manifests in the table's metadata folder are not the write's own."""
    root = write.location.rstrip("/") + "/"
    return [m for m in write.prepared.manifests if m.path.startswith(root)] if write.prepared else []


def _length(io: FileIO, path: str) -> int | None:
    """The file's length, ``None`` when it is not there: one request (a HEAD on an object store).
    Never from s3fs's listing cache: after a listing of the write location in this process (the
    check of every file, a clean-up), a manifest deleted since would read as there."""
    if _as_pyarrow_io(io) is None:
        filesystem, key = fsspec_filesystem(io, path)
        filesystem.invalidate_cache(key)
    try:
        return len(io.new_input(path))
    except FileNotFoundError:
        return None


def require_files(
    pre_commit: PreCommit, loaded: Sequence[tuple[TableWrite, Table]], *, every_file: bool = True
) -> None:
    """``MissingDataFiles`` unless every file of the write ``missing_in_locations`` looks for is there."""
    missing = missing_in_locations(pre_commit, loaded, every_file=every_file)
    if missing:
        raise MissingDataFiles(pre_commit.sink_id, pre_commit.epoch, missing)


def delete_locations(pre_commit: PreCommit, loaded: Sequence[tuple[TableWrite, Table]]) -> int:
    """Delete each write location, once every table cleared it: the number of files deleted."""
    deleted = 0
    for write, table in loaded:
        what = f"{pre_commit.describe()}: could not delete below {write.location!r}"
        with unavailable_when_unreachable(what, table.io.properties):
            deleted += delete_tree(table.io, write.location)
    return deleted


def delete_tree(io: FileIO, location: str, *, keep: Collection[str] = ()) -> int:
    """Delete every file below ``location`` but those in ``keep``; return how many were deleted.
    Missing is not an error."""
    if (pa_io := _as_pyarrow_io(io)) is not None:
        kept = {pa_io.parse_location(path, pa_io.properties)[2] for path in keep}
        return _delete_tree_pyarrow(pa_io, location, kept)
    filesystem, path = fsspec_filesystem(io, location)
    return _delete_tree_fsspec(filesystem, path, {str(filesystem._strip_protocol(p)) for p in keep})


def fsspec_filesystem(io: FileIO, location: str) -> tuple[Any, str]:
    """fsspec's file system for ``location`` configured from the FileIO's properties, and the path in it."""
    import fsspec
    from pyiceberg.io.fsspec import FsspecFileIO

    scheme = location.split("://", 1)[0] if "://" in location else "file"
    fsspec_io = io if isinstance(io, FsspecFileIO) else FsspecFileIO(dict(io.properties))
    try:
        filesystem = fsspec_io.get_fs(scheme)
    except ValueError:  # a scheme pyiceberg has no settings for: fsspec's own defaults are all there is
        filesystem, path = fsspec.core.url_to_fs(location)
        return filesystem, str(path)
    return filesystem, str(filesystem._strip_protocol(location))


def _delete_tree_pyarrow(io: PyArrowFileIO, location: str, kept: set[str]) -> int:
    from pyarrow import fs as pafs

    scheme, netloc, path = io.parse_location(location, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    deleted = 0
    for info in infos:
        if info.type == pafs.FileType.File and info.path not in kept:
            try:
                filesystem.delete_file(info.path)
            except FileNotFoundError:
                continue
            deleted += 1
    # Directories only exist on hierarchical file systems; their absence is fine.
    with contextlib.suppress(FileNotFoundError, OSError):
        if not kept and filesystem.get_file_info(path).type == pafs.FileType.Directory:
            filesystem.delete_dir(path)
    return deleted


def _delete_tree_fsspec(filesystem: Any, location: str, kept: set[str]) -> int:
    try:
        found = filesystem.find(location, withdirs=True, detail=True)
    except FileNotFoundError:
        return 0
    folders = [str(name) for name, info in found.items() if info.get("type") == "directory"]
    deleted = 0
    for path in [str(name) for name, info in found.items() if info.get("type") != "directory"]:
        if path in kept:
            continue
        try:
            filesystem.rm_file(path)
        except FileNotFoundError:
            continue
        deleted += 1
    if kept:
        return deleted
    # A store that keeps folders as entries (SeaweedFS's filer) still lists an emptied folder until
    # its own key goes, deepest first; elsewhere there is no such key, and deleting it is a no-op.
    for folder in sorted({*folders, location}, key=len, reverse=True):
        with contextlib.suppress(FileNotFoundError, OSError):
            filesystem.rm_file(folder.rstrip("/") + "/")
    with contextlib.suppress(FileNotFoundError, OSError):
        filesystem.invalidate_cache(location)  # the listing above is cached: ask again
        if filesystem.exists(location):
            filesystem.rm(location, recursive=True)
    return deleted
