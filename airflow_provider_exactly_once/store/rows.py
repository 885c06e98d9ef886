"""The meta store's rows: the tables' rows as the domain's values and back, the checks of what
callers hand the store, the compare-and-swap every status change of an epoch is (invariant 5), a
write's head, and a write's metadata moved between the tables that hold it (design.md, "The meta
store").

Below every store class and the operations views' queries: one mapping of a row, so a view never
shows an epoch differently from what the coordinator reads, and one statement shape for a transition.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CursorResult,
    Delete,
    Insert,
    Label,
    Row,
    Select,
    String,
    Table,
    Text,
    Update,
    bindparam,
    case,
    delete,
    insert,
    null,
    select,
    update,
)
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.epochs import AbortCause, CheckpointStatus, EpochAudit, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    EpochNotFound,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    StateConflict,
)
from airflow_provider_exactly_once.core.ports import CleanupTask, EpochRecord, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit, TableWrite
from airflow_provider_exactly_once.store.database import ParsedWrites, parsed_writes, size_of
from airflow_provider_exactly_once.store.models import (
    CHECKPOINT_NAME_LENGTH,
    DAG_ID_LENGTH,
    LOCK_HOLDER_LENGTH,
    RUN_ID_LENGTH,
    EpochMetadata,
    PendingSinkState,
    ReplacedMetadata,
    SinkCleanup,
    db_now,
)

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
    """Run an ``UPDATE`` of one row (a ``rows.guarded`` statement with ``returning_row``); the row as
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
    persist more than the database's own work on the row (``SqlSinkStateStore.insert_pending``)."""
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
        audit=None if row.audit is None else EpochAudit.model_validate_json(row.audit),
    )


def replaces_json(record: EpochRecord) -> str:
    """What a revision's row keeps of the Committed row it replaces, but for its metadata, which
    ``rows.keep_replaced`` moves to ``replaced_metadata``."""
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
        "audit": None,
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
        raise InvalidSinkConfig(
            f"{what} must be a mapping (its model_dump(mode='json') form), got {type(config).__name__}"
        )
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


def epoch_status(status: object) -> EpochStatus:
    try:
        return EpochStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(f"epoch status {status!r} is not one of {[s.value for s in EpochStatus]}") from None


def checkpoint_status(status: object) -> CheckpointStatus:
    try:
        return CheckpointStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(
            f"checkpoint status {status!r} is not one of {[s.value for s in CheckpointStatus]}"
        ) from None


def checkpoint_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > CHECKPOINT_NAME_LENGTH:
        raise InvalidPreCommit(
            f"checkpoint name must be a non-empty string of at most {CHECKPOINT_NAME_LENGTH} characters, got {name!r}"
        )
    return name


def run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not run_id or len(run_id) > RUN_ID_LENGTH:
        raise InvalidPreCommit(
            f"run_id must be a non-empty string of at most {RUN_ID_LENGTH} characters, got {run_id!r}"
        )
    return run_id


def dag_id(dag_id: object) -> str | None:
    if dag_id is not None and (not isinstance(dag_id, str) or not dag_id or len(dag_id) > DAG_ID_LENGTH):
        raise InvalidPreCommit(
            f"dag_id must be None or a non-empty string of at most {DAG_ID_LENGTH} characters, got {dag_id!r}"
        )
    return dag_id


def check_run(run: object, try_number: object) -> None:
    if run is not None:
        run_id(run)
    if try_number is not None and (isinstance(try_number, bool) or not isinstance(try_number, int) or try_number < 0):
        raise InvalidPreCommit(f"try_number must be a non-negative integer or None, got {try_number!r}")


def lock_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder or len(holder) > LOCK_HOLDER_LENGTH:
        raise InvalidSinkConfig(
            f"lock holder must be a non-empty string of at most {LOCK_HOLDER_LENGTH} characters, got {holder!r}"
        )
    return holder


def text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidPreCommit(f"{what} must be a string, got {type(value).__name__}")
    return value


class EpochRowMissing(StateConflict, EpochNotFound):
    """A compare-and-swap found no row at all: both a conflict and "never persisted"."""


#: The parameters of every ``guarded`` statement: the row's key and the write it must hold (``key``).
_SINK_ID, _EPOCH, _WRITE_ID = "g_sink_id", "g_epoch", "g_write_id"


@functools.cache
def guarded(status: EpochStatus, *, undecided: bool = False, decided: bool = False) -> Update:
    """An ``UPDATE`` of an epoch's row that matches only while it holds ``status`` and the write
    (with ``undecided``/``decided``: only before/after the commit decision); add ``.values(...)``.

    The row and the write are parameters (``key``), so each form is built once: building one per
    call cost as much as running it."""
    row = _STATE.c
    conditions: list[ColumnElement[bool]] = [
        row.sink_id == bindparam(_SINK_ID, type_=String),
        row.epoch == bindparam(_EPOCH, type_=BigInteger),
        row.status == status.value,
        row.write_id == bindparam(_WRITE_ID, type_=String),
    ]
    if undecided:
        conditions.append(row.commit_decided_at.is_(None))
    if decided:
        conditions.append(row.commit_decided_at.is_not(None))
    # On the table, not the mapped class: an ORM-enabled UPDATE ... RETURNING runs through the ORM's
    # bulk-update machinery, which cost a commit decision about a millisecond more on PostgreSQL
    # (issue 18); the session holds no objects of the row for it to synchronise anyway.
    return update(_STATE).where(*conditions)


def key(sink_id: str, epoch: int, write_id: str, **values: object) -> dict[str, object]:
    """The parameters of a ``guarded`` statement, with those of its values."""
    return {_SINK_ID: sink_id, _EPOCH: epoch, _WRITE_ID: write_id, **values}


def holds(record: EpochRecord | None) -> str:
    if record is None:
        return "there is no row"
    decided = record.commit_decided_at
    return f"the row holds status {record.status} write {record.write_id}" + (
        f", commit decided at {decided.isoformat()}" if decided is not None else ", no commit decided"
    )


def conflict(record: EpochRecord | None, sink_id: str, epoch: int, wanted: str) -> StateConflict:
    message = f"sink {sink_id!r} epoch {epoch}: expected to {wanted}, but {holds(record)}"
    return EpochRowMissing(message) if record is None else StateConflict(message)


def swap(session: Session, statement: Update, parameters: dict[str, object], wanted: str) -> None:
    """Run a ``guarded`` statement with its ``key``; ``StateConflict`` (``EpochRowMissing`` without a
    row) unless it changed exactly the one row."""
    if rowcount(session, statement, parameters) != 1:
        raise _conflict(session, parameters, wanted)


def swapped(session: Session, statement: Update, parameters: dict[str, object], wanted: str) -> EpochRecord:
    """``swap`` of a statement with ``rows.returning_row``: the row as the statement changed it, no
    second read."""
    changed = updated(session, statement, parameters)
    if changed is None:
        raise _conflict(session, parameters, wanted)
    return changed


def _conflict(session: Session, parameters: dict[str, object], wanted: str) -> StateConflict:
    sink_id, epoch = str(parameters[_SINK_ID]), int(cast(int, parameters[_EPOCH]))
    return conflict(load(session, sink_id, epoch), sink_id, epoch, wanted)


def reloaded(session: Session, sink_id: str, epoch: int) -> EpochRecord:
    """The row as the transaction now sees it, after a change that must have left it in place."""
    record = load(session, sink_id, epoch)
    assert record is not None
    return record


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


_METADATA = ("sink_id", "epoch", "write_id", "metadata_bytes", "metadata", "metadata_zlib")
#: Between ``epoch_metadata`` and ``replaced_metadata``, the write's head goes along; the clean-up
#: queue reads writes whole.
_WITH_HEAD = (*_METADATA, "head_zlib")


def keep_replaced(session: Session, sink_id: str, epoch: int, write_id: str) -> None:
    """A revision opens: the committed write's metadata moves to ``replaced_metadata`` before the
    revision's takes its place in ``epoch_metadata`` (``rows.replace_metadata``)."""
    _once(session, _copy(EpochMetadata, ReplacedMetadata), sink_id, epoch, write_id, "keep the replaced write's")


def restore_replaced(session: Session, sink_id: str, epoch: int, *, revision_write_id: str) -> None:
    """A revision is aborted: the write it replaced is the epoch's again, and so is its metadata."""
    _once(session, _delete(EpochMetadata, by_write=True), sink_id, epoch, revision_write_id, "drop the revision's")
    _once(session, _copy(ReplacedMetadata, EpochMetadata), sink_id, epoch, None, "restore the replaced write's")
    _once(session, _delete(ReplacedMetadata, by_write=False), sink_id, epoch, None, "drop the replaced write's")


def queue_cleanup(
    session: Session,
    sink_id: str,
    epoch: int,
    write_id: str,
    *,
    reason: str,
    removed_by: str | None = None,
    replaced: bool = False,
) -> None:
    """Queue a write's files for clean-up with its metadata: the epoch's write (``epoch_metadata``),
    or, once its revision committed (``replaced``), the write that revision replaced, whose metadata
    then leaves ``replaced_metadata``."""
    source = ReplacedMetadata if replaced else EpochMetadata
    parameters = {"q_reason": reason, "q_removed_by": removed_by}
    _once(session, _queue(source), sink_id, epoch, write_id, "queue the write's", parameters)
    if replaced:
        _once(session, _delete(ReplacedMetadata, by_write=False), sink_id, epoch, None, "drop the replaced write's")


def _once(
    session: Session,
    statement: Insert | Delete,
    sink_id: str,
    epoch: int,
    write_id: str | None,
    what: str,
    extra: dict[str, Any] | None = None,
) -> None:
    parameters = {"m_sink_id": sink_id, "m_epoch": epoch, "m_write_id": write_id, **(extra or {})}
    if cast(CursorResult[Any], session.execute(statement, parameters)).rowcount != 1:
        # Rolls the transaction back: a step that would lose a write's metadata must not happen.
        raise InvalidPreCommit(
            f"sink {sink_id!r} epoch {epoch}: could not {what} metadata"
            + (f" of write {write_id}" if write_id else "")
            + ": the meta store holds no such row; restore the meta store from a backup"
        )


def _where(table: Table, *, by_write: bool) -> list[Any]:
    found = [table.c.sink_id == bindparam("m_sink_id"), table.c.epoch == bindparam("m_epoch")]
    return [*found, table.c.write_id == bindparam("m_write_id")] if by_write else found


@functools.cache
def _copy(source: type[EpochMetadata | ReplacedMetadata], target: type[EpochMetadata | ReplacedMetadata]) -> Insert:
    """Statements built once each: building one costs as much as running it on SQLite."""
    origin = cast(Table, source.__table__)
    by_write = source is EpochMetadata  # a replaced write is the epoch's one
    return insert(cast(Table, target.__table__)).from_select(
        list(_WITH_HEAD), select(*(origin.c[c] for c in _WITH_HEAD)).where(*_where(origin, by_write=by_write))
    )


@functools.cache
def _delete(source: type[EpochMetadata | ReplacedMetadata], *, by_write: bool) -> Delete:
    table = cast(Table, source.__table__)
    return delete(table).where(*_where(table, by_write=by_write))


@functools.cache
def _queue(source: type[EpochMetadata | ReplacedMetadata]) -> Insert:
    origin = cast(Table, source.__table__)
    return insert(cast(Table, SinkCleanup.__table__)).from_select(
        [*_METADATA, "reason", "created_at", "removed_by"],
        select(
            *(origin.c[c] for c in _METADATA),
            bindparam("q_reason", type_=Text),
            db_now(),
            bindparam("q_removed_by", type_=Text),
        ).where(*_where(origin, by_write=True)),
    )
