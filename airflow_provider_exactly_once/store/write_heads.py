"""A stored write's head: its metadata without the data file descriptors, which a commit task
reads instead of the whole, parsing the descriptors only if its commit needs them (``DataFiles``).

Stored deflated beside the metadata (``head_zlib``, migration 0011) when the write is: JSON of the
write with every table's ``data_files`` empty, and per table the files' number, rows, bytes and paths
(relative to the write location, which every file lies below). At 10,000 files the head is a few
hundred kilobytes of paths against megabytes of descriptors, parsed in a millisecond or two.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.store.models import EpochMetadata, ReplacedMetadata, SinkCleanup
from airflow_provider_exactly_once.store.parsed_writes import ParsedWrites

#: Refuse to inflate more than this: a head is kilobytes per thousand files.
_MAX_INFLATED = 256 * 1024 * 1024


def head_of(pre_commit: PreCommit) -> bytes:
    """The write's head, deflated as stored."""
    files = []
    for write in pre_commit.tables:
        paths = write.data_files.paths()
        root = write.location.rstrip("/") + "/"
        if not all(path.startswith(root) for path in paths):
            root = ""  # metadata from before the location was enforced: paths kept whole
        files.append(
            {
                "count": len(paths),
                "records": write.record_count,
                "bytes": write.data_files.size_in_bytes(),
                "root": root,
                "names": [path[len(root) :] for path in paths],
            }
        )
    bare = pre_commit.model_copy(
        update={"tables": [write.model_copy(update={"data_files": DataFiles()}) for write in pre_commit.tables]}
    )
    text = '{"write":' + bare.to_json() + ',"files":' + json.dumps(files, separators=(",", ":")) + "}"
    return zlib.compress(text.encode(), 1)


def from_head(packed: bytes, read_whole: Callable[[], PreCommit], *, owner: str) -> PreCommit:
    """The write a head describes, its descriptors parsed from ``read_whole()`` (the stored metadata)
    the first time one is read; ``owner`` names the row in an error."""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(bytes(packed), _MAX_INFLATED)
        if not inflater.eof or inflater.unconsumed_tail:
            raise ValueError(f"cut short or inflating past {_MAX_INFLATED} bytes")
        data = json.loads(raw)
        bare = PreCommit.parse(data["write"], recorded=True, trusted=True)
        files: list[dict[str, Any]] = data["files"]
        if len(files) != len(bare.tables):
            raise ValueError(f"{len(files)} file lists for {len(bare.tables)} tables")
    except (zlib.error, ValueError, KeyError, TypeError, InvalidPreCommit) as exc:
        raise InvalidPreCommit(
            f"{owner}: the meta store's head of the write (epoch_metadata.head_zlib) cannot be read: {exc}; "
            "set the column to NULL for the row, and the write is read whole"
        ) from None
    whole = _Once(read_whole)
    tables = [
        write.model_copy(
            update={
                "data_files": DataFiles.unread(
                    count=int(listed["count"]),
                    records=int(listed["records"]),
                    size=int(listed["bytes"]),
                    paths=[listed["root"] + name for name in listed["names"]],
                    load=_table_files(whole, position, write.table),
                )
            }
        )
        for position, (write, listed) in enumerate(zip(bare.tables, files, strict=True))
    ]
    return bare.model_copy(update={"tables": tables})


class _Once:
    """The whole write, read once for all its tables."""

    def __init__(self, read: Callable[[], PreCommit]) -> None:
        self._read: Callable[[], PreCommit] | None = read
        self._whole: PreCommit | None = None
        self._lock = threading.Lock()

    def __call__(self) -> PreCommit:
        with self._lock:
            if self._whole is None:
                assert self._read is not None
                self._whole, self._read = self._read(), None
            return self._whole


def _table_files(whole: _Once, position: int, name: str) -> Callable[[], Sequence[DataFileDescriptor]]:
    def load() -> Sequence[DataFileDescriptor]:
        write: TableWrite = whole().tables[position]
        if write.table != name:
            raise InvalidPreCommit(f"the stored write lists table {write.table!r} where its head lists {name!r}")
        return write.data_files

    return load


def whole_reader(session: Session, sink_id: str, epoch: int, write_id: str) -> Callable[[], PreCommit]:
    """How a write read by its head is read whole later, in a session of its own: from whichever
    table holds its metadata by then (a revision may have moved it to ``replaced_metadata``, its
    commit to the clean-up queue)."""
    bind = session.get_bind()

    def read() -> PreCommit:
        with Session(bind) as own:
            for model in (EpochMetadata, ReplacedMetadata, SinkCleanup):
                found = own.execute(
                    select(model.metadata_json, model.metadata_zlib, model.metadata_bytes)
                    .where(model.sink_id == sink_id, model.epoch == epoch, model.write_id == write_id)
                    .limit(1)
                ).first()
                if found is not None:
                    text, packed, size = found
                    return ParsedWrites().pre_commit(sink_id, epoch, write_id, text, packed=packed, size=size)
        raise InvalidPreCommit(
            f"sink {sink_id!r} epoch {epoch}: the meta store no longer holds the metadata of write {write_id} "
            "(its files were cleaned up since this attempt read the epoch); this attempt is stale and stops here"
        )

    return read
