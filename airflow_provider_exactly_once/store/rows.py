"""Rows of the meta store's tables as the domain's values, and the domain's values as column text.

Public because the store's classes and the operations views' queries (``store/queries.py``) map the
same rows: one mapping, so a view never shows an epoch differently from what the coordinator reads.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Insert,
    Label,
    Row,
    Select,
    Table,
    Update,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.core.ports import CleanupTask, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import AbortCause, EpochStatus
from airflow_provider_exactly_once.core.write_kinds import ReplacedWrite
from airflow_provider_exactly_once.store.models import EpochMetadata, PendingSinkState, SinkCleanup, db_now

#: ``pending_sink_state`` itself: the row without its metadata, which is ``epoch_metadata``'s.
_STATE = cast(Table, PendingSinkState.__table__)
_BYTES = "metadata_bytes"


def load(session: Session, sink_id: str, epoch: int, *, for_update: bool = False) -> EpochRecord | None:
    """The epoch's row as the domain's value, its metadata read only when this store has not parsed
    that write yet (``ParsedWrites``): an epoch of 10,000 files has megabytes of metadata, which every
    step of its commit would fetch again otherwise. The first statement reads the row and the size of
    its metadata, which with the write id names a parsed write; only when it names none, a second
    reads the row with its metadata, in one statement, as the epoch may take another write between
    two of them (PostgreSQL's statements each see the latest commits)."""
    parameters = {"l_sink_id": sink_id, "l_epoch": epoch}
    found = session.execute(_row_select(for_update=for_update), parameters).one_or_none()
    if found is None:
        return None
    return _known(session, found) or _with_metadata(session, sink_id, epoch, for_update=for_update)


def _with_metadata(session: Session, sink_id: str, epoch: int, *, for_update: bool) -> EpochRecord | None:
    parameters = {"l_sink_id": sink_id, "l_epoch": epoch}
    found = session.execute(_row_select(for_update=for_update, metadata=True), parameters).one_or_none()
    return None if found is None else _mapped(session, found)


@functools.cache
def _row_select(*, for_update: bool, metadata: bool = False) -> Select[Any]:
    """``load``'s statements, built once each: building one cost as much as running it on SQLite."""
    columns = [*_STATE.columns, _of_write(EpochMetadata.metadata_bytes, _BYTES)]
    if metadata:
        columns += [
            _of_write(EpochMetadata.metadata_json, "metadata_json"),
            _of_write(EpochMetadata.metadata_zlib, "metadata_zlib"),
        ]
    statement = select(*columns).where(
        _STATE.c.sink_id == bindparam("l_sink_id"), _STATE.c.epoch == bindparam("l_epoch")
    )
    return statement.with_for_update() if for_update else statement


def updated(session: Session, statement: Update, parameters: Mapping[str, Any]) -> EpochRecord | None:
    """Run an ``UPDATE`` of one row (a ``cas.guarded`` statement with ``returning_row``); the row as
    changed, read back by the statement itself (``RETURNING``), or ``None`` when it matched no row."""
    found = session.execute(statement, parameters).one_or_none()
    if found is None:
        return None
    return _known(session, found) or _with_metadata(session, found.sink_id, int(found.epoch), for_update=False)


def returning_row(statement: Update) -> Update:
    """``statement`` reading back the row as ``updated`` maps it: its columns and its metadata's size."""
    return statement.returning(*_STATE.columns, _of_write(EpochMetadata.metadata_bytes, _BYTES))


def _known(session: Session, found: Row[*tuple[Any, ...]]) -> EpochRecord | None:
    """The row read without its metadata, when its write is one this store parsed; ``None`` otherwise."""
    size = found._mapping[_BYTES]
    if size is None:
        return None
    parsed = parsed_writes(session).get((found.sink_id, int(found.epoch), found.write_id, int(size)))
    return None if parsed is None else _mapped(session, found, parsed)


def _mapped(session: Session, found: Row[*tuple[Any, ...]], pre_commit: PreCommit | None = None) -> EpochRecord:
    """``record`` of a row read as columns: no ORM loading, and no ORM object either (its
    instrumentation cost about 0.1 ms a row, three rows a commit): ``record`` only reads the
    attributes, which a plain namespace holds as well."""
    row = SimpleNamespace(**{"metadata_json": None, "metadata_zlib": None, **found._mapping})
    return record(session, cast(PendingSinkState, row), pre_commit=pre_commit)


def _of_write(column: Any, name: str) -> Label[Any]:
    """``column`` of the row's write's ``epoch_metadata``, as the column ``name`` of a query or
    ``RETURNING`` clause on the row.

    Selected from ``epoch_metadata`` under other column names: SQLite's ``RETURNING`` names the row's
    columns unqualified (``sink_id``), and inside a subquery over ``epoch_metadata`` itself those
    would be ``epoch_metadata``'s own columns, matching its every row (the size of any epoch's
    metadata came back, and the process parsed its own write again)."""
    of = select(
        EpochMetadata.sink_id.label("of_sink"),
        EpochMetadata.epoch.label("of_epoch"),
        EpochMetadata.write_id.label("of_write"),
        column.label("of_value"),
    ).subquery()
    # Correlated to the table, not the mapped class, which would make every statement carrying it
    # ORM-enabled (and compiled and run through the ORM) for a row that is read as plain columns.
    row = _STATE.c
    return (
        select(of.c.of_value)
        .where(of.c.of_sink == row.sink_id, of.c.of_epoch == row.epoch, of.c.of_write == row.write_id)
        .correlate(_STATE)
        .scalar_subquery()
        .label(name)
    )


def insert_metadata(session: Session, pre_commit: PreCommit) -> str:
    """Store the metadata of a new row's write; its JSON text, which the caller may keep elsewhere too."""
    text = _remembered_json(session, pre_commit)
    # Passed as parameters, not as values of the statement: the engine caches a compiled statement with
    # the values it was first compiled with, and megabytes would live as long as the engine.
    session.execute(_metadata_insert(), _metadata_values(pre_commit, text))
    return text


def _remembered_json(session: Session, pre_commit: PreCommit) -> str:
    """The JSON text of a write's metadata about to be stored, the write known to the store as parsed:
    the store reads back every row it changes, and reading this one parses nothing."""
    text = pre_commit.to_json()
    parsed_writes(session).put((pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id, _size(text)), pre_commit)
    return text


@functools.cache
def _metadata_insert() -> Insert:
    """A Core statement built once: the ORM's bulk insert of ``insert(EpochMetadata)`` cost a first
    persist more than the database's own work on the row (``first_write.py``)."""
    return insert(cast(Table, EpochMetadata.__table__))


def _deflated(text: str) -> tuple[bytes, int]:
    """The JSON as stored (``epoch_metadata.metadata_zlib``, migration 0007) and its size in UTF-8
    bytes. zlib's fastest level: 0.9 ms for the 0.6 MB of 1,000 files, which it shrinks to a few
    percent, where writing the text cost SQLite 2 ms and PostgreSQL 5 ms more than the deflated bytes."""
    raw = text.encode()
    return zlib.compress(raw, 1), len(raw)


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


def replace_metadata(session: Session, pre_commit: PreCommit, *, replaced_write_id: str) -> None:
    """The row's write became ``pre_commit``'s, in the same transaction: so does its metadata."""
    packed, size = _deflated(_remembered_json(session, pre_commit))
    table = cast(Table, EpochMetadata.__table__)
    statement = (
        update(table)
        .where(
            table.c.sink_id == bindparam("b_sink_id"),
            table.c.epoch == bindparam("b_epoch"),
            table.c.write_id == bindparam("b_replaced"),
        )
        .values(
            write_id=bindparam("b_write_id"),
            metadata_bytes=bindparam("b_bytes"),
            metadata=None,
            metadata_zlib=bindparam("b_packed"),
        )
    )
    parameters = {
        "b_sink_id": pre_commit.sink_id,
        "b_epoch": pre_commit.epoch,
        "b_replaced": replaced_write_id,
        "b_write_id": pre_commit.write_id,
        "b_bytes": size,
        "b_packed": packed,
    }
    if cast(CursorResult[Any], session.execute(statement, parameters)).rowcount != 1:
        # Rolls the transaction back: a row whose metadata is not its write's must never be written.
        raise InvalidPreCommit(
            f"sink {pre_commit.sink_id!r} epoch {pre_commit.epoch}: the meta store holds no metadata of "
            f"write {replaced_write_id}, which write {pre_commit.write_id} replaces"
        )


def _metadata_values(pre_commit: PreCommit, text: str) -> dict[str, Any]:
    packed, size = _deflated(text)
    return {
        "sink_id": pre_commit.sink_id,
        "epoch": pre_commit.epoch,
        "write_id": pre_commit.write_id,
        "metadata_bytes": size,
        "metadata_json": None,
        "metadata_zlib": packed,
    }


def rowcount(session: Session, statement: Update, parameters: Mapping[str, Any] | None = None) -> int:
    result = cast(CursorResult[Any], session.execute(statement, parameters))
    return int(result.rowcount)


def record(session: Session, row: PendingSinkState, *, pre_commit: PreCommit | None = None) -> EpochRecord:
    """The row as the domain's value; ``pre_commit``: its metadata, when known to be the row's."""
    parsed = parsed_writes(session)
    return EpochRecord(
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        status=EpochStatus(row.status),
        write_id=row.write_id,
        pre_commit=pre_commit
        or parsed.pre_commit(
            row.sink_id,
            int(row.epoch),
            row.write_id,
            row.metadata_json,
            packed=row.metadata_zlib,
            size=row.metadata_bytes,
        ),
        run_id=row.run_id,
        try_number=row.try_number,
        created_at=row.created_at,
        updated_at=row.updated_at,
        commit_decided_at=row.commit_decided_at,
        committed=None if row.committed is None else json.loads(row.committed),
        error=row.error,
        abort_cause=None if row.abort_cause is None else AbortCause(row.abort_cause),
        dag_id=row.dag_id,
        table_uuids=None if row.table_uuids is None else json.loads(row.table_uuids),
        warning=row.warning,
        revision=int(row.revision or 0),
        replaces=None if row.replaces is None else parsed.replaced(row.replaces),
    )


def replaces_json(session: Session, record: EpochRecord) -> str:
    """What a revision keeps of the Committed row it replaces (``ParsedWrites.replaced`` reads it back)."""
    text = json.dumps(
        {
            "write_id": record.write_id,
            "metadata": record.pre_commit.to_dict(),
            "committed": dict(record.committed or {}),
            "table_uuids": None if record.table_uuids is None else dict(record.table_uuids),
            "revision": record.revision,
            "committed_at": record.updated_at.isoformat(),
        },
        sort_keys=True,
    )
    parsed_writes(session).put_replaced(text, record.as_replaced())
    return text


def new_write_values(
    pre_commit: PreCommit, *, run_id: str | None, try_number: int | None, dag_id: str | None, now: object
) -> dict[str, Any]:
    """The columns a row takes when a committed epoch is handed to a new Pending write: nothing of
    the earlier write's decision, commit, tables or error may stay behind (its metadata is
    ``replace_metadata``'s)."""
    return {
        "status": EpochStatus.PENDING.value,
        "write_id": pre_commit.write_id,
        "run_id": run_id,
        "try_number": try_number,
        "dag_id": dag_id,
        "created_at": now,
        "updated_at": now,
        "commit_decided_at": None,
        "committed": None,
        "table_uuids": None,
        "error": None,
    }


def cleanup_task(row: SinkCleanup) -> CleanupTask:
    return CleanupTask(
        id=int(row.id),
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        write_id=row.write_id,
        pre_commit=PreCommit.from_json(row.metadata_json, recorded=True),
        reason=row.reason,
        created_at=row.created_at,
        removed_by=None if row.removed_by is None else json.loads(row.removed_by),
    )


def database_now(session: Session) -> datetime:
    now: datetime | None = session.scalar(select(db_now()))
    if now is None:  # pragma: no cover - a database without a clock
        raise MetaStoreUnavailable("the meta store returned no current time")
    return now


def config_json(config: Mapping[str, Any], what: str) -> str:
    if not isinstance(config, Mapping):
        raise InvalidSinkConfig(f"{what} must be a mapping (its to_dict() form), got {type(config).__name__}")
    try:
        return json.dumps(dict(config), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidSinkConfig(f"{what} is not JSON-serialisable: {exc}") from None


def committed_json(committed: Mapping[str, str], sink_id: str, epoch: int) -> str:
    if not isinstance(committed, Mapping) or not committed:
        raise InvalidPreCommit(f"sink {sink_id!r} epoch {epoch}: committed must name every table, got {committed!r}")
    bad = {k: v for k, v in committed.items() if not isinstance(k, str) or not isinstance(v, str) or not v}
    if bad:
        raise InvalidPreCommit(
            f"sink {sink_id!r} epoch {epoch}: committed maps tables to snapshot ids or 'empty' (strings), got {bad!r}"
        )
    return json.dumps(dict(committed), sort_keys=True)


def identities_json(identities: Mapping[str, str], sink_id: str, epoch: int) -> str | None:
    bad = {k: v for k, v in identities.items() if not isinstance(k, str) or not isinstance(v, str) or not v}
    if bad:
        raise InvalidPreCommit(f"sink {sink_id!r} epoch {epoch}: table identities must be strings, got {bad!r}")
    return json.dumps(dict(identities), sort_keys=True) if identities else None


# -- parsed metadata ------------------------------------------------------------------------------

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
        self._replaced: OrderedDict[tuple[int, int], ReplacedWrite] = OrderedDict()
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
            self._replaced.clear()

    def pre_commit(
        self, sink_id: str, epoch: int, write_id: str, text: str | None, *, packed: bytes | None, size: int | None
    ) -> PreCommit:
        """The write's metadata from its text, or from its deflated form (``packed``, whose JSON is
        ``size`` bytes), parsed unless known.

        The deflated form is only ever written by this package, after the write passed every check, so
        it is parsed as trusted (``PreCommit.parse``); zlib's checksum refuses a damaged one, and a form
        that inflates to another write's metadata is refused too."""
        if text is None and packed is None:
            raise InvalidPreCommit(
                f"sink {sink_id!r} epoch {epoch}: the meta store holds no metadata of write {write_id}"
            )
        if size is None and text is not None:
            size = _size(text)
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

    def replaced(self, text: str) -> ReplacedWrite:
        """The write a revision replaces, from its row's ``replaces``: every read of a revision's row
        carries the replaced write's files (10,000 descriptors make a JSON text of megabytes). Parsed as
        trusted: the text is the committed row's metadata, which passed every check at its persist."""
        key = (hash(text), len(text))
        with self._lock:
            cached = self._replaced.get(key)
        if cached is not None:
            return cached
        data = json.loads(text)
        replaced = ReplacedWrite(
            write_id=data["write_id"],
            pre_commit=PreCommit.parse(data["metadata"], recorded=True, trusted=True),
            committed=data["committed"],
            table_uuids=data["table_uuids"],
            revision=int(data["revision"]),
            committed_at=datetime.fromisoformat(data["committed_at"]),
        )
        self.put_replaced(text, replaced)
        return replaced

    def put_replaced(self, text: str, replaced: ReplacedWrite) -> None:
        with self._lock:
            self._replaced[(hash(text), len(text))] = replaced
            while len(self._replaced) > self.CAPACITY:
                self._replaced.popitem(last=False)


def _size(text: str) -> int:
    """The text's size in UTF-8 bytes (``epoch_metadata.metadata_bytes``); O(1) for ASCII, which
    metadata JSON nearly always is."""
    return len(text) if text.isascii() else len(text.encode())
