"""Rows of the meta store's tables as the domain's values, and the domain's values as column text.

Public because the store's classes and the operations views' queries (``store/queries.py``) map the
same rows: one mapping, so a view never shows an epoch differently from what the coordinator reads.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable, Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Delete,
    Insert,
    Label,
    Row,
    Select,
    Table,
    Update,
    bindparam,
    case,
    insert,
    null,
    select,
    update,
)
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.core.ports import CleanupTask, EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import AbortCause, EpochStatus
from airflow_provider_exactly_once.core.write_kinds import ReplacedWrite
from airflow_provider_exactly_once.store.models import (
    EpochMetadata,
    PendingSinkState,
    ReplacedMetadata,
    SinkCleanup,
    db_now,
)
from airflow_provider_exactly_once.store.parsed_writes import ParsedWrites, parsed_writes, size_of
from airflow_provider_exactly_once.store.write_heads import from_head, head_of, whole_reader

#: ``pending_sink_state`` itself: the row without its metadata, which is ``epoch_metadata``'s.
_STATE = cast(Table, PendingSinkState.__table__)
_BYTES = "metadata_bytes"
_REPLACED_BYTES = "replaced_bytes"


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
    columns = [*_STATE.columns, *_SIZES]
    if metadata:
        columns += [
            # A write's head, or where it has none (rows older than 0011), its metadata.
            _of(EpochMetadata, EpochMetadata.head_zlib, "head_zlib"),
            _of(EpochMetadata, EpochMetadata.metadata_json, "metadata_json"),
            _of(EpochMetadata, _unless_head(EpochMetadata), "metadata_zlib"),
            _of(ReplacedMetadata, ReplacedMetadata.head_zlib, "replaced_head"),
            _of(ReplacedMetadata, ReplacedMetadata.metadata_json, "replaced_json"),
            _of(ReplacedMetadata, _unless_head(ReplacedMetadata), "replaced_zlib"),
        ]
    statement = select(*columns).where(
        _STATE.c.sink_id == bindparam("l_sink_id"), _STATE.c.epoch == bindparam("l_epoch")
    )
    return statement.with_for_update() if for_update else statement


def _unless_head(model: type[EpochMetadata | ReplacedMetadata]) -> Any:
    """The deflated metadata of a row without a head; megabytes a commit task would otherwise fetch."""
    return case((model.head_zlib.is_(None), model.metadata_zlib), else_=null())


def updated(session: Session, statement: Update, parameters: Mapping[str, Any]) -> EpochRecord | None:
    """Run an ``UPDATE`` of one row (a ``cas.guarded`` statement with ``returning_row``); the row as
    changed, read back by the statement itself (``RETURNING``), or ``None`` when it matched no row."""
    found = session.execute(statement, parameters).one_or_none()
    if found is None:
        return None
    return _known(session, found) or _with_metadata(session, found.sink_id, int(found.epoch), for_update=False)


def returning_row(statement: Update) -> Update:
    """``statement`` reading back the row as ``updated`` maps it: its columns and its metadata's sizes."""
    return statement.returning(*_STATE.columns, *_SIZES)


def _known(session: Session, found: Row[*tuple[Any, ...]]) -> EpochRecord | None:
    """The row read without its metadata, when its write (and the one a revision in flight
    replaces) is one this store parsed; ``None`` otherwise."""
    parsed = parsed_writes(session)
    sink_id, epoch = found.sink_id, int(found.epoch)
    size = found._mapping[_BYTES]
    pre_commit = None if size is None else parsed.get((sink_id, epoch, found.write_id, int(size)))
    if pre_commit is None:
        return None
    replaced = None
    if found.replaces is not None:
        size = found._mapping[_REPLACED_BYTES]
        replaced_id = json.loads(found.replaces)["write_id"]
        replaced = None if size is None else parsed.get((sink_id, epoch, replaced_id, int(size)))
        if replaced is None:
            return None
    return _mapped(session, found, pre_commit, replaced)


def _mapped(
    session: Session,
    found: Row[*tuple[Any, ...]],
    pre_commit: PreCommit | None = None,
    replaced: PreCommit | None = None,
) -> EpochRecord:
    """``record`` of a row read as columns: no ORM loading, and no ORM object either (its
    instrumentation cost about 0.1 ms a row, three rows a commit): ``record`` only reads the
    attributes, which a plain namespace holds as well."""
    absent = dict.fromkeys(
        ("head_zlib", "metadata_json", "metadata_zlib", "replaced_head", "replaced_json", "replaced_zlib")
    )
    row = SimpleNamespace(**{**absent, **found._mapping})
    return record(session, cast(PendingSinkState, row), pre_commit=pre_commit, replaced=replaced)


def _of(model: type[EpochMetadata | ReplacedMetadata], column: Any, name: str) -> Label[Any]:
    """``column`` of the row's write's ``epoch_metadata`` (or of the ``replaced_metadata`` of its
    revision in flight), as the column ``name`` of a query or ``RETURNING`` clause on the row; in the
    row's own statement, as the epoch may take another write between two statements (PostgreSQL's
    statements each see the latest commits).

    Selected from the table under other column names: SQLite's ``RETURNING`` names the row's
    columns unqualified (``sink_id``), and inside a subquery over ``epoch_metadata`` itself those
    would be ``epoch_metadata``'s own columns, matching its every row (the size of any epoch's
    metadata came back, and the process parsed its own write again)."""
    of = select(
        model.sink_id.label("of_sink"),
        model.epoch.label("of_epoch"),
        model.write_id.label("of_write"),
        column.label("of_value"),
    ).subquery()
    # Correlated to the table, not the mapped class, which would make every statement carrying it
    # ORM-enabled (and compiled and run through the ORM) for a row that is read as plain columns.
    row = _STATE.c
    same = [of.c.of_sink == row.sink_id, of.c.of_epoch == row.epoch]
    if model is EpochMetadata:
        same.append(of.c.of_write == row.write_id)
    return select(of.c.of_value).where(*same).correlate(_STATE).scalar_subquery().label(name)


#: The sizes of the row's metadata and of its replaced write's, read with every row (``_known``).
_SIZES = (
    _of(EpochMetadata, EpochMetadata.metadata_bytes, _BYTES),
    _of(ReplacedMetadata, ReplacedMetadata.metadata_bytes, _REPLACED_BYTES),
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
    parsed_writes(session).put((pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id, size_of(text)), pre_commit)
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
            head_zlib=bindparam("b_head"),
        )
    )
    parameters = {
        "b_sink_id": pre_commit.sink_id,
        "b_epoch": pre_commit.epoch,
        "b_replaced": replaced_write_id,
        "b_write_id": pre_commit.write_id,
        "b_bytes": size,
        "b_packed": packed,
        "b_head": head_of(pre_commit),
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
        "head_zlib": head_of(pre_commit),
    }


def rowcount(session: Session, statement: Update | Delete, parameters: Mapping[str, Any] | None = None) -> int:
    result = cast(CursorResult[Any], session.execute(statement, parameters))
    return int(result.rowcount)


def record(
    session: Session, row: PendingSinkState, *, pre_commit: PreCommit | None = None, replaced: PreCommit | None = None
) -> EpochRecord:
    """The row as the domain's value; ``pre_commit``, ``replaced``: its metadata and the replaced
    write's, when known to be the row's."""
    parsed = parsed_writes(session)
    return EpochRecord(
        sink_id=row.sink_id,
        epoch=int(row.epoch),
        status=EpochStatus(row.status),
        write_id=row.write_id,
        pre_commit=pre_commit or parsed.stored(row, _head(session, row, row.write_id, "head_zlib")),
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
        replaces=_replaced(session, parsed, row, replaced),
    )


def replaces_json(record: EpochRecord) -> str:
    """What a revision's row keeps of the Committed row it replaces, but for its metadata, which
    ``metadata_copies.keep_replaced`` moves to ``replaced_metadata``."""
    return json.dumps(
        {
            "write_id": record.write_id,
            "committed": dict(record.committed or {}),
            "table_uuids": None if record.table_uuids is None else dict(record.table_uuids),
            "revision": record.revision,
            "committed_at": record.updated_at.isoformat(),
        },
        sort_keys=True,
    )


def _head(session: Session, row: PendingSinkState, write_id: str, column: str) -> Callable[[], PreCommit] | None:
    """The write read from its head (``column`` of a row read as columns), when the row holds one."""
    packed = getattr(row, column, None)
    if packed is None:
        return None
    sink_id, epoch = row.sink_id, int(row.epoch)
    owner = f"sink {sink_id!r} epoch {epoch} write {write_id}"
    return lambda: from_head(packed, whole_reader(session, sink_id, epoch, write_id), owner=owner)


def _replaced(
    session: Session, parsed: ParsedWrites, row: PendingSinkState, pre_commit: PreCommit | None
) -> ReplacedWrite | None:
    """The write a revision in flight replaces (``replaces_json``'s text, and the write's metadata);
    ``None`` for a row with no revision in flight."""
    if row.replaces is None:
        return None
    data = json.loads(row.replaces)
    if pre_commit is None:
        pre_commit = parsed.pre_commit(
            row.sink_id,
            int(row.epoch),
            data["write_id"],
            row.replaced_json,
            packed=row.replaced_zlib,
            size=row.replaced_bytes,
            head=_head(session, row, data["write_id"], "replaced_head"),
        )
    return ReplacedWrite(
        write_id=data["write_id"],
        pre_commit=pre_commit,
        committed=data["committed"],
        table_uuids=data["table_uuids"],
        revision=int(data["revision"]),
        committed_at=datetime.fromisoformat(data["committed_at"]),
    )


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
        pre_commit=ParsedWrites().stored(row),
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
