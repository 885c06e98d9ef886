"""The writes' metadata one store parsed or wrote, each parsed once for as long as the store lives,
and the checks a stored form passes before it is trusted (``ParsedWrites.pre_commit``)."""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import PreCommit


class _Stored(Protocol):
    """A row naming a write and holding its metadata (``epoch_metadata``, ``sink_cleanup``, or
    ``pending_sink_state`` read with its write's)."""

    @property
    def sink_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def write_id(self) -> str: ...
    @property
    def metadata_json(self) -> str | None: ...
    @property
    def metadata_zlib(self) -> bytes | None: ...
    @property
    def metadata_bytes(self) -> int | None: ...


#: Refuse to inflate more than this: real metadata is megabytes, a damaged value could be anything.
_MAX_INFLATED = 1024 * 1024 * 1024
#: Where a session of the store's database finds its ``ParsedWrites`` (``Session.info``).
PARSED = "exactly_once_parsed_writes"


def parsed_writes(session: Session) -> ParsedWrites:
    """The ``ParsedWrites`` of the database the session belongs to (``MetaStoreDatabase.transaction``);
    a session of no store parses afresh."""
    found = session.info.get(PARSED)
    return found if isinstance(found, ParsedWrites) else ParsedWrites()


class ParsedWrites:
    """The writes' metadata one store parsed or wrote, each parsed once for as long as the store lives.

    A write's metadata never changes once written (a new write gets a new write id), so it is named
    by its sink, epoch, write id and size; an epoch of 10,000 files would otherwise be re-validated
    on every read of its row (get, decide, mark), which costs more than the Iceberg commit itself.
    The store's database owns one (``MetaStoreDatabase.parsed``); a new store, as a new process,
    knows none. Safe to share between threads, as the store is.
    """

    #: Writes kept: a commit reads a few epochs at a time, and each may be megabytes of objects.
    CAPACITY = 8

    def __init__(self) -> None:
        self._writes: OrderedDict[tuple[str, int, str, int], PreCommit] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, str, int]) -> PreCommit | None:
        with self._lock:
            found = self._writes.get(key)
            if found is not None:
                self._writes.move_to_end(key)
            return found

    def put(self, key: tuple[str, int, str, int], pre_commit: PreCommit) -> None:
        with self._lock:
            self._writes[key] = pre_commit
            self._writes.move_to_end(key)
            while len(self._writes) > self.CAPACITY:
                self._writes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._writes.clear()

    def stored(self, row: _Stored, head: Callable[[], PreCommit] | None = None) -> PreCommit:
        """The metadata of the write a row names, in whichever form the row holds it."""
        return self.pre_commit(
            row.sink_id,
            int(row.epoch),
            row.write_id,
            row.metadata_json,
            packed=row.metadata_zlib,
            size=row.metadata_bytes,
            head=head,
        )

    def pre_commit(
        self,
        sink_id: str,
        epoch: int,
        write_id: str,
        text: str | None,
        *,
        packed: bytes | None,
        size: int | None,
        head: Callable[[], PreCommit] | None = None,
    ) -> PreCommit:
        """The write's metadata from its text, or from its deflated form (``packed``, whose JSON is
        ``size`` bytes), parsed unless known; or, where the row was read with its write's head and
        not its metadata, from ``head`` (``write_heads.from_head``), under the same name.

        The deflated form is only ever written by this package, after the write passed every check, so
        it is parsed as trusted (``PreCommit.parse``); zlib's checksum refuses a damaged one, and a form
        that inflates to another write's metadata is refused too."""
        if head is not None and size is not None:
            known = self.get((sink_id, epoch, write_id, int(size)))
            if known is None:
                known = head()
                self.put((sink_id, epoch, write_id, int(size)), known)
            return known
        if text is None and packed is None:
            raise InvalidPreCommit(
                f"sink {sink_id!r} epoch {epoch}: the meta store holds no metadata of write {write_id}"
            )
        if size is None and text is not None:
            size = size_of(text)
        if size is not None:
            known = self.get((sink_id, epoch, write_id, int(size)))
            if known is not None:
                return known
        if packed is not None:
            raw = _inflated(packed, sink_id, epoch, write_id)
            try:
                pre_commit = PreCommit.parse(raw, recorded=True, trusted=True)
            except InvalidPreCommit as exc:
                raise _unreadable(sink_id, epoch, write_id, str(exc)) from None
            if (pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id) != (sink_id, epoch, write_id):
                raise _unreadable(sink_id, epoch, write_id, f"it describes {pre_commit.describe()}")
            size = len(raw)
        else:
            assert text is not None
            pre_commit = PreCommit.from_json(text, recorded=True)
        self.put((sink_id, epoch, write_id, int(size or 0)), pre_commit)
        return pre_commit


def size_of(text: str) -> int:
    """The text's size in UTF-8 bytes (``epoch_metadata.metadata_bytes``); O(1) for ASCII, which
    metadata JSON nearly always is."""
    return len(text) if text.isascii() else len(text.encode())


def _inflated(packed: bytes, sink_id: str, epoch: int, write_id: str) -> bytes:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(bytes(packed), _MAX_INFLATED)
        complete = inflater.eof and not inflater.unconsumed_tail
    except zlib.error as exc:
        raise _unreadable(sink_id, epoch, write_id, f"its deflated form does not inflate ({exc})") from None
    if not complete:
        raise _unreadable(
            sink_id, epoch, write_id, f"its deflated form is cut short or inflates past {_MAX_INFLATED} bytes"
        )
    return raw


def _unreadable(sink_id: str, epoch: int, write_id: str, why: str) -> InvalidPreCommit:
    """What a row's metadata that this package did not write, or that was damaged since, raises."""
    return InvalidPreCommit(
        f"sink {sink_id!r} epoch {epoch}: the meta store's metadata of write {write_id} (table epoch_metadata) "
        f"cannot be read: {why}; nothing about the epoch can be decided from it: restore that row from a backup "
        "of the meta store (the write's files stay in its location until the epoch is aborted)"
    )
