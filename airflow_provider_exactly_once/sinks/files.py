"""Exactly-once commits into a plain file directory.

Staged files move to final names that are a pure function of the persisted metadata, so a final
name that exists proves its move, and a ``_COMMIT_STARTED`` file lets ``delete_write`` tell this
write's begun commit from another write's. The contract: design.md, "The file-sink commit" and D8.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem

from airflow_provider_exactly_once.core.epochs import check_write_id
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CommitRefused,
    InvalidPreCommit,
    InvalidSinkConfig,
    MissingDataFiles,
    SinkUnavailable,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.ports import (
    EMPTY,
    CommitPlan,
    CommittedTables,
    FileCheck,
    ReplacedWrite,
    VisibleEpoch,
    WriteKind,
)
from airflow_provider_exactly_once.core.precommit import (
    DataFileDescriptor,
    PartitionValue,
    PreCommit,
    TableWrite,
)
from airflow_provider_exactly_once.extras import url_to_fs
from airflow_provider_exactly_once.filesystems import store_errors
from airflow_provider_exactly_once.sinks.layout import FILE_STAGING_DIR, file_write_location, file_writes_folder

__all__ = [
    "COMMIT_STARTED_MARKER",
    "HIVE_DEFAULT_PARTITION",
    "FileSinkCommitter",
    "PlannedMove",
    "escape_path_component",
    "partition_path",
]

log = logging.getLogger(__name__)

#: Written into a write's staging folder before its first move: "this write's commit has begun".
COMMIT_STARTED_MARKER = "_COMMIT_STARTED"
#: Hive's (and Spark's) directory name for a null or empty partition value.
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Token prefix of a committed file sink: ``files:<number of files>``.
TOKEN_PREFIX = "files:"

# Hive's FileUtils.escapePathName set, so Spark and Hive read the partition values back unchanged.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(0x20))


def escape_path_component(value: str) -> str:
    """Hive-style ``%XX`` escaping: the result is one safe path segment that readers decode back."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


def _partition_value(value: PartitionValue) -> str:
    if value is None or value == "":
        return HIVE_DEFAULT_PARTITION
    if isinstance(value, bool):  # before int: bool is an int, but Spark writes true/false
        return "true" if value else "false"
    return escape_path_component(str(value))


def partition_path(partition: Mapping[str, PartitionValue]) -> str:
    """``k1=v1/k2=v2`` for a descriptor's partition; ``""`` when unpartitioned.

    Keys are sorted: the metadata may pass through a JSON column that does not keep key order
    (PostgreSQL ``jsonb``), and a retry that ordered them differently would write other names.
    """
    parts = []
    for key in sorted(partition):
        if not key:
            raise InvalidPreCommit("a data file has a partition field with an empty name")
        parts.append(f"{escape_path_component(key)}={_partition_value(partition[key])}")
    return "/".join(parts)


@dataclass(frozen=True)
class PlannedMove:
    """One data file of a write: where it is staged and the one name it may ever be committed under.

    ``staged`` and ``final`` are paths on the committer's filesystem (protocol stripped).
    """

    descriptor: DataFileDescriptor
    staged: str
    final: str


@dataclass(frozen=True)
class _Plan:
    pre_commit: PreCommit
    table: TableWrite
    staging: str
    moves: tuple[PlannedMove, ...]


class FileSinkCommitter:
    """``SinkCommitter`` for a directory of data files, local or on any fsspec filesystem.

    Moves are atomic renames on a local disk; elsewhere they are a copy then a delete (an object
    store has no rename), which is still safe because a final name is only ever written with the
    one staged file that maps to it, and a staged file is only deleted once its final copy exists.
    Object stores have no folders either: every look-up is of one object by its full name, and the
    only listing (tidying the staging folder) is a prefix listing.
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        fault: FaultHook = no_faults,
    ) -> None:
        if not isinstance(root, str) or not root.strip():
            raise InvalidSinkConfig(f"file sink root must be a non-empty path or URL, got {root!r}")
        try:
            fs, path = url_to_fs(root, storage_options, feature=f"file sink root {root!r}")
        except (ValueError, ImportError, TypeError) as exc:
            raise InvalidSinkConfig(f"file sink root {root!r}: cannot open its filesystem: {exc}") from exc
        self._fs: Any = fs
        self._local = isinstance(fs, LocalFileSystem)
        protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
        self._protocols: tuple[str, ...] = tuple(str(p) for p in protocols)
        self._fault = fault
        self._root_path = posixpath.normpath(str(path)) if path else ""
        if self._root_path in ("", "/", "."):
            raise InvalidSinkConfig(f"file sink root {root!r} names the top of its filesystem; give a directory")
        segments = self._root_path.split("/")
        if FILE_STAGING_DIR in segments:
            raise InvalidSinkConfig(
                f"file sink root {root!r} lies inside a {FILE_STAGING_DIR!r} folder: readers would never see its files"
            )
        if self._local and os.path.exists(self._root_path) and not os.path.isdir(self._root_path):
            raise InvalidSinkConfig(f"file sink root {root!r} exists and is not a directory")
        self._root = self._root_path if self._local else str(fs.unstrip_protocol(self._root_path))

    # -- naming -----------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        """The normalised sink root: what a pre-commit's ``TableWrite.table`` must name."""
        return self._root

    @property
    def filesystem(self) -> Any:
        """The fsspec filesystem the sink lives on (for writers and tests)."""
        return self._fs

    def staging_location(self, write_id: str) -> str:
        """Where a write must put its files: the ``TableWrite.location`` its pre-commit declares."""
        return self._url(self._staging_path(check_write_id(write_id)))

    def table_write(self, write_id: str, data_files: Sequence[DataFileDescriptor] = ()) -> TableWrite:
        """The one ``TableWrite`` a write of this sink reports (its table and location filled in)."""
        return TableWrite(table=self.root, location=self.staging_location(write_id), data_files=list(data_files))

    def plan(self, pre_commit: PreCommit) -> list[PlannedMove]:
        """Every staged file with its final name, after ``prepare``'s checks; a pure function of the metadata."""
        return list(self._plan(pre_commit).moves)

    # -- SinkCommitter ----------------------------------------------------------------------------

    def prepare(
        self, pre_commit: PreCommit, *, replaces: ReplacedWrite | None = None, check_files: FileCheck = FileCheck.NONE
    ) -> CommitPlan:
        """Refuse metadata that names another sink root or stages files outside this write's folder,
        and any revision: a file sink cannot replace a committed write. Nothing is kept in the plan:
        the final names are a pure function of the metadata, and ``commit`` looks at every file anyway.
        ``check_files`` (any but ``NONE``: a file sink writes no manifest): every file must be staged
        or at its final name already (a resumed commit).
        """
        layout = self._plan(pre_commit)
        kind = WriteKind.of(pre_commit, replaces)
        if kind.revises:
            raise CommitRefused(
                f"{pre_commit.describe()}: a file sink cannot replace committed write {kind.replaced_write_id}"
            )
        if check_files is not FileCheck.NONE:
            missing = [
                m.descriptor.path for m in layout.moves if not self._exists(m.staged) and not self._exists(m.final)
            ]
            if missing:
                raise MissingDataFiles(pre_commit.sink_id, pre_commit.epoch, missing)
        return CommitPlan(pre_commit)

    def stage(self, plan: CommitPlan) -> PreCommit:
        """Nothing to write ahead: a file sink's commit moves the staged files, no more."""
        return plan.pre_commit

    def tidy(self, staged: PreCommit, recorded: PreCommit | None) -> None:
        """``stage`` writes nothing, so nothing is left to delete."""

    def identities(self, pre_commit: PreCommit) -> Mapping[str, str]:
        """A directory has no identity apart from its path: re-created, it is the same sink root."""
        return {}

    def find_committed(self, pre_commit: PreCommit, since: datetime) -> VisibleEpoch:
        """Visible only when every final name exists; a partial set means a commit must still finish.

        ``since`` is not needed: the final names are looked up one by one, so the cost is the
        write's own file count, never the directory's history. An empty write shows nothing (it
        needs no visible trace); committing it again is free and returns ``EMPTY``.
        """
        plan = self._plan(pre_commit)
        if not plan.moves:
            return VisibleEpoch(tables={}, write_ids={})
        for move in plan.moves:
            if not self._exists(move.final):
                return VisibleEpoch(tables={}, write_ids={})
        return VisibleEpoch(tables={self.root: _token(plan)}, write_ids={self.root: None})

    def commit(self, plan: CommitPlan, since: datetime, *, allow_beyond_horizon: bool = False) -> CommittedTables:
        """Move every staged file to its final name; idempotent and safe to run concurrently.

        Nothing moves unless every file is found, staged or final, so a refusal leaves the sink as
        it was. A prepared plan and an unprepared one commit alike. ``allow_beyond_horizon`` has no
        meaning here: final names never expire. A file sink has no revisions (``FileSinkConfig``
        refuses ``on_reprocess="replace"``), so a plan that ``replaces`` is refused.
        """
        pre_commit = plan.pre_commit
        if plan.kind.revises:
            raise CommitRefused(
                f"{pre_commit.describe()}: a file sink cannot replace committed write {plan.kind.replaced_write_id}; "
                "nothing was moved"
            )
        layout = self._plan(pre_commit)
        if not layout.moves:
            self._remove_staging(layout, best_effort=True)
            return {self.root: EMPTY}

        to_move: list[PlannedMove] = []
        missing: list[str] = []
        for move in layout.moves:
            # Staged first, then final: a concurrent move between the two looks can only turn
            # "staged" into "final", never make a file look missing.
            staged = self._exists(move.staged)
            final = self._exists(move.final)
            if staged and not final:
                to_move.append(move)
            elif not staged and not final:
                missing.append(move.descriptor.path)
        if missing:
            raise MissingDataFiles(pre_commit.sink_id, pre_commit.epoch, missing)

        if to_move:
            self._write_commit_started(layout)
        for move in to_move:
            self._fault("files.before_move")
            self._move(layout, move)
            self._fault("files.after_move")

        self._remove_staging(layout, best_effort=True)
        log.info(
            "%s: %d file(s) committed to %s (%d moved now)",
            pre_commit.describe(),
            len(layout.moves),
            self.root,
            len(to_move),
        )
        return {self.root: _token(layout)}

    def missing_files(self, pre_commit: PreCommit) -> Sequence[str]:
        """Staged files that are gone; refused once the write's moves began (it is partly visible)."""
        plan = self._plan(pre_commit)
        moved = [m for m in plan.moves if self._exists(m.final)]
        if moved or self._exists(posixpath.join(plan.staging, COMMIT_STARTED_MARKER)):
            raise AbortRefused(
                f"{pre_commit.describe()}: its commit into {self.root!r} has begun ({len(moved)} file(s) "
                "at their final names): it is partly visible, so restore the missing files and commit it"
            )
        return [move.descriptor.path for move in plan.moves if not self._exists(move.staged)]

    def delete_replaced(
        self, pre_commit: PreCommit, removed_by: Mapping[str, str], recorded_at: datetime
    ) -> int | None:
        """A file sink never replaces a write (``commit`` refuses), so nothing of one is ever queued."""
        raise CommitRefused(f"{pre_commit.describe()}: a file sink has no replaced writes to delete")

    def delete_write(self, pre_commit: PreCommit, since: datetime) -> int:
        """Delete the write's staging folder unless this write's commit may have begun.

        Refused when the write's commit-started marker is there, or when a final name exists while
        its staged copy is gone (this write's move may have made it): only finishing the commit is
        safe then. Final names that exist next to their still-staged copies, with no marker, belong
        to another write of the same epoch (this one was replaced), so the staging folder can go.
        Returns how many files were deleted; a second call finds nothing and returns 0.
        """
        plan = self._plan(pre_commit)
        marker = posixpath.join(plan.staging, COMMIT_STARTED_MARKER)
        if self._exists(marker):
            raise AbortRefused(
                f"{pre_commit.describe()}: its commit into {self.root!r} has begun "
                f"({self._url(marker)} exists); only finishing the commit is safe"
            )
        moved = [m for m in plan.moves if not self._exists(m.staged) and self._exists(m.final)]
        if moved:
            shown = ", ".join(self._url(m.final) for m in moved[:5])
            raise AbortRefused(
                f"{pre_commit.describe()}: {len(moved)} file(s) already at their final names "
                "with no staged copy "
                f"left ({shown}); its commit may have begun, so only finishing it is safe"
            )
        return self._remove_staging(plan, best_effort=False)

    # -- internals --------------------------------------------------------------------------------

    def _staging_path(self, write_id: str) -> str:
        return file_write_location(self._root_path, write_id)

    def _url(self, path: str) -> str:
        return path if self._local else str(self._fs.unstrip_protocol(path))

    def _to_path(self, url: str, what: str) -> str:
        protocol, _ = split_protocol(url)
        if protocol is not None and protocol not in self._protocols:
            raise InvalidPreCommit(
                f"{what} {url!r} is on filesystem {protocol!r}, but the sink root {self.root!r} is on "
                f"{self._protocols[0]!r}"
            )
        path = str(self._fs._strip_protocol(url))
        return posixpath.normpath(path) if path else path

    def _plan(self, pre_commit: PreCommit) -> _Plan:
        if len(pre_commit.tables) != 1:
            raise InvalidPreCommit(
                f"{pre_commit.describe()}: a file sink takes exactly one table write (its root), got "
                f"{[t.table for t in pre_commit.tables]}"
            )
        table = pre_commit.tables[0]
        if self._to_path(table.table, "table") != self._root_path:
            raise InvalidPreCommit(
                f"{pre_commit.describe()}: table {table.table!r} is not this file sink's root {self.root!r}"
            )
        staging = self._staging_path(pre_commit.write_id)
        staging_root = file_writes_folder(self._root_path)
        if self._to_path(table.location, "write location") != staging:
            raise InvalidPreCommit(
                f"{pre_commit.describe()}: write location {table.location!r} is not the write's "
                f"staging folder {self._url(staging)!r} (it must lie under {self._url(staging_root)!r})"
            )
        marker = posixpath.join(staging, COMMIT_STARTED_MARKER)
        counters: dict[tuple[str, str], int] = {}
        moves = []
        for descriptor in sorted(table.data_files, key=lambda d: d.path):
            staged = self._to_path(descriptor.path, "data file")
            if not staged.startswith(staging + "/") or staged == marker:
                raise InvalidPreCommit(
                    f"{pre_commit.describe()}: data file {descriptor.path!r} is not inside the write's "
                    f"staging folder {self._url(staging)!r}"
                )
            partition = partition_path(descriptor.partition)
            writer = escape_path_component(descriptor.writer or "0")
            n = counters.get((partition, writer), 0)
            counters[(partition, writer)] = n + 1
            name = f"{pre_commit.epoch}-{writer}-{n}.{descriptor.format}"
            final = (
                posixpath.join(self._root_path, partition, name) if partition else posixpath.join(self._root_path, name)
            )
            moves.append(PlannedMove(descriptor=descriptor, staged=staged, final=final))
        return _Plan(pre_commit=pre_commit, table=table, staging=staging, moves=tuple(moves))

    def _exists(self, path: str) -> bool:
        """Strict existence: unlike ``fs.exists``, an unreachable store is an error, not "absent".

        The filesystem's listing cache (object stores keep one) is dropped first: a committer racing
        another must see the other's moves, not what it listed before.
        """
        self._fs.invalidate_cache(path)
        try:
            self._fs.info(path)
        except FileNotFoundError:
            return False
        except store_errors() as exc:
            raise SinkUnavailable(f"file sink {self.root!r}: cannot look up {self._url(path)!r}: {exc}") from exc
        return True

    def _write_commit_started(self, plan: _Plan) -> None:
        marker = posixpath.join(plan.staging, COMMIT_STARTED_MARKER)
        try:
            self._fs.pipe_file(marker, plan.pre_commit.write_id.encode())
        except FileNotFoundError:
            # The staging folder is gone: a concurrent committer of this write finished every move
            # and tidied up since we looked; the moves below will find each final name in place.
            log.debug("file sink %r: staging folder of %s already removed", self.root, plan.pre_commit.describe())
        except store_errors() as exc:
            raise SinkUnavailable(f"file sink {self.root!r}: cannot write {self._url(marker)!r}: {exc}") from exc

    def _move(self, plan: _Plan, move: PlannedMove) -> None:
        try:
            if self._local:
                os.makedirs(posixpath.dirname(move.final), exist_ok=True)
                os.rename(move.staged, move.final)
            else:
                # An object store's move is a copy and a delete: the final name exists before the
                # staged copy goes, so a crash in between leaves both, which a retry tidies.
                self._fs.makedirs(posixpath.dirname(move.final), exist_ok=True)
                self._fs.cp_file(move.staged, move.final)
                self._fault("files.after_copy")
                self._fs.rm_file(move.staged)
        except FileNotFoundError:
            # Another committer of the same write moved it first: its final name is the proof.
            if self._exists(move.final):
                return
            raise MissingDataFiles(plan.pre_commit.sink_id, plan.pre_commit.epoch, [move.descriptor.path]) from None
        except store_errors() as exc:
            raise SinkUnavailable(
                f"file sink {self.root!r}: cannot move {self._url(move.staged)!r} to {self._url(move.final)!r}: {exc}"
            ) from exc

    def _remove_staging(self, plan: _Plan, *, best_effort: bool) -> int:
        """Delete the write's staging folder and whatever is left in it; returns files deleted.

        After a commit it only holds writer by-products (``_SUCCESS``, ``.crc``) and the marker, so a
        failure there is logged rather than raised: the commit itself is done.
        """
        try:
            # Listed afresh (an object store's listing cache may predate a concurrent write), and
            # files only: some stores (SeaweedFS, S3 with folder-marker objects) list an emptied
            # folder as an entry of its own.
            self._fs.invalidate_cache(plan.staging)
            found = self._fs.find(plan.staging, detail=True)
            files = [name for name, info in found.items() if info.get("type") != "directory"]
            if self._local:
                shutil.rmtree(plan.staging, onerror=_ignore_missing)
            elif files or self._fs.isdir(plan.staging):
                self._fs.rm(plan.staging, recursive=True)
        except FileNotFoundError:
            return 0
        except store_errors() as exc:
            if best_effort:
                log.warning("file sink %r: could not remove staging folder %s: %s", self.root, plan.staging, exc)
                return 0
            raise SinkUnavailable(
                f"file sink {self.root!r}: cannot delete staging folder {self._url(plan.staging)!r}: {exc}"
            ) from exc
        return len(files)


def _token(plan: _Plan) -> str:
    return f"{TOKEN_PREFIX}{len(plan.moves)}"


def _ignore_missing(
    function: Any, path: str, exc_info: tuple[type[BaseException], BaseException, TracebackType | None]
) -> None:
    """``rmtree`` error handler: a concurrent committer removing the same folder is not a failure."""
    if issubclass(exc_info[0], FileNotFoundError):
        return
    raise exc_info[1]
