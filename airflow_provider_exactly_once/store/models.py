"""Typed SQLAlchemy models of the meta store (design.md, 'The meta store').

The models describe the schema for queries and for comparison against the migrations; the schema
itself is created only by the Alembic revisions in ``store/migrations`` so that an upgraded
installation and a fresh one end up with the same tables.

Every timestamp is written from the database's clock (``db_now()``), never the caller's: the row's
``created_at`` bounds the Iceberg marker walk, and workers' clocks may disagree with each other.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

from airflow_provider_exactly_once.core.epochs import TABLE_NAME_MAX_LENGTH, CheckpointStatus, EpochStatus

_T = TypeVar("_T")

#: The Alembic version table of this package; its own name so it can share a database with anything.
VERSION_TABLE = "exactly_once_alembic_version"

SINK_ID_LENGTH = 128
LOCK_HOLDER_LENGTH = 250
RUN_ID_LENGTH = 250
DAG_ID_LENGTH = 250
WRITE_ID_LENGTH = 36
STATUS_LENGTH = 16
ABORT_CAUSE_LENGTH = 32
CHECKPOINT_NAME_LENGTH = 128
EVENT_LENGTH = 32
TABLE_NAME_LENGTH = TABLE_NAME_MAX_LENGTH

#: SQLite keeps timestamps as text; this gives millisecond precision in the ISO form Python parses.
SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f','now')"

_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(values: list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


EPOCH_STATUS_CHECK = f"status IN ({_in([s.value for s in EpochStatus])})"
CHECKPOINT_STATUS_CHECK = f"status IN ({_in([s.value for s in CheckpointStatus])})"


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that always comes back timezone-aware in UTC.

    SQLite has no time zones (it returns naive text that is UTC by construction, see ``db_now``)
    while PostgreSQL returns the session's zone; callers compare these instants with Iceberg
    snapshot times, so both are normalised here rather than at every use.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given to the meta store; pass an aware one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # a raw strftime() value that bypassed the DATETIME processor
            value = datetime.fromisoformat(value)
        if not isinstance(value, datetime):
            raise TypeError(f"the meta store returned {value!r} where a timestamp was expected")
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class db_now(FunctionElement[datetime]):
    """The database's current time, rendered per dialect (see ``SQLITE_NOW``)."""

    type = UtcDateTime()
    inherit_cache = True
    name = "db_now"


@compiles(db_now)
def _db_now_default(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return SQLITE_NOW


@compiles(db_now, "postgresql")
def _db_now_postgresql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # The transaction's start: every timestamp one method writes is the same instant.
    return "now()"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class _StoredMetadata:
    """A write's pre-commit metadata as stored, in either form; ``store/rows.py`` moves it between
    the tables that hold it as it is."""

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    #: The write the metadata describes, which every read checks.
    write_id: Mapped[str] = mapped_column(String(WRITE_ID_LENGTH))
    #: The JSON's size in UTF-8 bytes, whichever form holds it: with the write id it names the
    #: metadata for a store that parsed it already (``rows.load``), without reading it.
    #: Before the metadata, so that SQLite reads it without walking overflow pages.
    metadata_bytes: Mapped[int] = mapped_column(BigInteger)
    #: The PreCommit JSON of rows written before migration 0007, which deflates it into
    #: ``metadata_zlib`` instead; a row holds one of the two. ``metadata`` is reserved on
    #: declarative classes, hence the attribute name.
    metadata_json: Mapped[str | None] = mapped_column("metadata", Text)
    #: The PreCommit JSON deflated (``zlib``, 0007): a tenth or less of the text's pages to write.
    metadata_zlib: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: The write's head (``store/rows.py``, 0011): what a commit reads instead of the metadata, whose
    #: descriptors it parses only if it needs them; ``None`` for rows written before.
    head_zlib: Mapped[bytes | None] = mapped_column(LargeBinary)


class EpochMetadata(_StoredMetadata, Base):
    """The pre-commit metadata of each epoch's current write (migration 0006), apart from its row;
    its ``write_id`` is always the row's, on which every read joins.

    It is megabytes for a write of thousands of files, and SQLite rewrites a whole row on every
    ``UPDATE``: kept in ``pending_sink_state`` it was written again by the commit decision and by the
    Committed mark. Here it is written only when the epoch takes a write.
    """

    __tablename__ = "epoch_metadata"
    __table_args__ = (PrimaryKeyConstraint("sink_id", "epoch"),)


class ReplacedMetadata(_StoredMetadata, Base):
    """The metadata of the Committed write a Pending revision replaces (migration 0010), moved here
    from ``epoch_metadata`` in the database when the revision opens; its ``write_id`` is the one
    ``pending_sink_state.replaces`` names.

    Kept in the row's ``replaces`` it was megabytes of text that every ``UPDATE`` of the row wrote
    again (the commit decision, the Committed mark): a replacement commit cost several first commits.
    The revision's commit moves it on to the clean-up queue, its abort back to ``epoch_metadata``,
    both without Python reading it.
    """

    __tablename__ = "replaced_metadata"
    __table_args__ = (PrimaryKeyConstraint("sink_id", "epoch"),)


def _of_write(column: Mapped[_T], sink_id: Mapped[str], epoch: Mapped[int], write_id: Mapped[str]) -> Any:
    """``column`` of the row's write's ``epoch_metadata``, as a column of the row."""
    return (
        select(column)
        .where(EpochMetadata.sink_id == sink_id, EpochMetadata.epoch == epoch, EpochMetadata.write_id == write_id)
        .correlate_except(EpochMetadata)
        .scalar_subquery()
    )


def _of_replaced(column: Mapped[_T], sink_id: Mapped[str], epoch: Mapped[int]) -> Any:
    """``column`` of the ``replaced_metadata`` of the row's revision in flight, as a column of the row."""
    return (
        select(column)
        .where(ReplacedMetadata.sink_id == sink_id, ReplacedMetadata.epoch == epoch)
        .correlate_except(ReplacedMetadata)
        .scalar_subquery()
    )


class PendingSinkState(Base):
    """One (sink, epoch): the seed's ``pending_sink_state`` plus what Airflow reruns need."""

    __tablename__ = "pending_sink_state"
    __table_args__ = (
        PrimaryKeyConstraint("sink_id", "epoch"),
        CheckConstraint(EPOCH_STATUS_CHECK, name="status"),
        Index("ix_pending_sink_state_sink_id_status", "sink_id", "status"),
        # the recovery DAG's orphan scan asks which of a sink's write ids the store knows
        Index("ix_pending_sink_state_sink_id_write_id", "sink_id", "write_id"),
        # the operations views list newest epochs first, per sink and status, per status, or overall
        Index("ix_pending_sink_state_sink_id_status_epoch", "sink_id", "status", "epoch"),
        Index("ix_pending_sink_state_status_epoch_sink_id", "status", "epoch", "sink_id"),
        Index("ix_pending_sink_state_epoch_sink_id", "epoch", "sink_id"),
    )

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH))
    write_id: Mapped[str] = mapped_column(String(WRITE_ID_LENGTH))
    run_id: Mapped[str | None] = mapped_column(String(RUN_ID_LENGTH))
    try_number: Mapped[int | None] = mapped_column(Integer)
    #: The DAG whose run wrote the row (migration 0003): the sink view links to it and applies its access.
    dag_id: Mapped[str | None] = mapped_column(String(DAG_ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    commit_decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    #: JSON object: table -> snapshot id, or ``"empty"``.
    committed: Mapped[str | None] = mapped_column(Text)
    #: JSON object: table -> the table's identity (Iceberg UUID) the epoch was committed to (0004).
    table_uuids: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    #: Why an Aborted epoch's write was given up (``core.epochs.AbortCause``, 0009); ``error`` says it in words.
    abort_cause: Mapped[str | None] = mapped_column(String(ABORT_CAUSE_LENGTH))
    #: What a persist found suspicious about the epoch (0004): shown to operators, decides nothing.
    warning: Mapped[str | None] = mapped_column(Text)
    #: How often the epoch's committed write was replaced by a newer generation's (0005).
    revision: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: JSON, while a revision is Pending: the committed write it replaces (``core.ports.ReplacedWrite``),
    #: whose metadata is ``replaced_metadata``'s (0010).
    replaces: Mapped[str | None] = mapped_column(Text)
    #: JSON, for an audited sink's write (0015): its audit branch, snapshots and verdict (``core.epochs.EpochAudit``).
    audit: Mapped[str | None] = mapped_column(Text)
    #: The write's metadata, from ``epoch_metadata`` (0006) in either of its forms, and its size
    #: (``rows.record``); ``rows.load`` reads the row without it when its write is parsed already.
    metadata_json: Mapped[str | None] = column_property(
        _of_write(EpochMetadata.metadata_json, sink_id, epoch, write_id)
    )
    metadata_zlib: Mapped[bytes | None] = column_property(
        _of_write(EpochMetadata.metadata_zlib, sink_id, epoch, write_id)
    )
    metadata_bytes: Mapped[int | None] = column_property(
        _of_write(EpochMetadata.metadata_bytes, sink_id, epoch, write_id)
    )
    #: The same of the write a revision in flight replaces (``replaced_metadata``, 0010).
    replaced_json: Mapped[str | None] = column_property(_of_replaced(ReplacedMetadata.metadata_json, sink_id, epoch))
    replaced_zlib: Mapped[bytes | None] = column_property(_of_replaced(ReplacedMetadata.metadata_zlib, sink_id, epoch))
    replaced_bytes: Mapped[int | None] = column_property(_of_replaced(ReplacedMetadata.metadata_bytes, sink_id, epoch))


class SinkCleanup(Base):
    """A write whose files must be deleted once it is certain nothing references them."""

    __tablename__ = "sink_cleanup"
    __table_args__ = (
        Index("ix_sink_cleanup_sink_id_done_at", "sink_id", "done_at"),
        # persist asks whether a write was ever discarded: keep that O(1) as the log grows
        Index("ix_sink_cleanup_sink_id_epoch_write_id", "sink_id", "epoch", "write_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger)
    write_id: Mapped[str] = mapped_column(String(WRITE_ID_LENGTH))
    #: The write's metadata copied from where the epoch kept it (0010: in the database, as it was
    #: stored): the JSON text, or its deflated form with the text's size; one of the two is set.
    metadata_json: Mapped[str | None] = mapped_column("metadata", Text)
    metadata_bytes: Mapped[int | None] = mapped_column(BigInteger)
    metadata_zlib: Mapped[bytes | None] = mapped_column(LargeBinary)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    done_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    #: JSON, for a replaced write (0005): table -> the snapshot that removed its files; they are
    #: deleted only once no retained snapshot is older than that one.
    removed_by: Mapped[str | None] = mapped_column(Text)


class EpochHistory(Base):
    """Every transition of an epoch, appended in the transaction of its change (``store/history.py``,
    migration 0012): what happened, to which write, done by whom, and why; an epoch's revision
    records are read from it (0014). Never updated; only the retention clean-up deletes rows, of
    this table only and never those a revision record is read from."""

    __tablename__ = "epoch_history"
    __table_args__ = (Index("ix_epoch_history_sink_id_epoch_id", "sink_id", "epoch", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    #: ``core.epochs.EpochEvent``.
    event: Mapped[str] = mapped_column(String(EVENT_LENGTH))
    write_id: Mapped[str] = mapped_column(String(WRITE_ID_LENGTH))
    #: The epoch's status after the event.
    status: Mapped[str | None] = mapped_column(String(STATUS_LENGTH))
    revision: Mapped[int | None] = mapped_column(Integer)
    #: The run the event belongs to: the write's for persists, the acting task's run otherwise.
    dag_id: Mapped[str | None] = mapped_column(String(DAG_ID_LENGTH))
    run_id: Mapped[str | None] = mapped_column(String(RUN_ID_LENGTH))
    try_number: Mapped[int | None] = mapped_column(Integer)
    #: How Airflow started the acting run (``DagRunType``), and how often it was cleared before.
    run_type: Mapped[str | None] = mapped_column(String(EVENT_LENGTH))
    clear_number: Mapped[int | None] = mapped_column(Integer)
    #: ``core.epochs.ActorKind`` and its name (a task, a user).
    actor: Mapped[str] = mapped_column(String(EVENT_LENGTH))
    actor_name: Mapped[str | None] = mapped_column(String(LOCK_HOLDER_LENGTH))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    #: ``core.epochs.RevisionWrite`` as JSON (0014): the revision record the event makes or changes.
    revision_record: Mapped[str | None] = mapped_column(Text)
    #: The write a revision's commit replaced (0014).
    replaced_write_id: Mapped[str | None] = mapped_column(String(WRITE_ID_LENGTH))


class CheckpointState(Base):
    """The built-in checkpoint source's table, written by the upstream (design.md, 'Checkpoint sources')."""

    __tablename__ = "checkpoint_state"
    __table_args__ = (
        PrimaryKeyConstraint("name", "epoch"),
        CheckConstraint(CHECKPOINT_STATUS_CHECK, name="status"),
    )

    name: Mapped[str] = mapped_column(String(CHECKPOINT_NAME_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH))
    detail: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


class EpochAllocation(Base):
    """Epochs handed to DAG runs that have no data interval, one per (sink, run) forever."""

    __tablename__ = "epoch_allocation"
    __table_args__ = (
        PrimaryKeyConstraint("sink_id", "run_id"),
        UniqueConstraint("sink_id", "epoch"),
    )

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger)


class InputRange(Base):
    """The snapshot range of an upstream Iceberg table an epoch of an incremental sink reads
    (``core.input_ranges``, migration 0013): reserved before the write, never changed. ``position``
    chains a sink's reservations, unique so that two epochs cannot reserve from the same start."""

    __tablename__ = "input_range"
    __table_args__ = (
        PrimaryKeyConstraint("sink_id", "epoch"),
        UniqueConstraint("sink_id", "position"),
    )

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    epoch: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    position: Mapped[int] = mapped_column(BigInteger)
    #: The upstream table, ``namespace.table``.
    source: Mapped[str] = mapped_column(String(TABLE_NAME_LENGTH))
    after_snapshot_id: Mapped[int | None] = mapped_column(BigInteger)
    to_snapshot_id: Mapped[int | None] = mapped_column(BigInteger)
    run_id: Mapped[str | None] = mapped_column(String(RUN_ID_LENGTH))
    reserved_at: Mapped[datetime] = mapped_column(UtcDateTime())


class RunRecord(Base):
    """A DAG run that persisted a write, with its logical date and data interval (0008).

    Operators pick a run by its logical date (``airflow tasks clear -s``, ``backfill create``), and
    that date is the interval's end for a ``dags test DAG DATE`` run but its start for a scheduled
    or backfilled one: the epoch alone cannot tell which run to select. Kept per run, not per epoch,
    so that every revision's run is known, and kept here because Airflow deletes a run that
    ``dags test`` runs again.
    """

    __tablename__ = "dag_run_record"
    __table_args__ = (PrimaryKeyConstraint("dag_id", "run_id"),)

    dag_id: Mapped[str] = mapped_column(String(DAG_ID_LENGTH))
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH))
    #: ``None`` for a run without one (Airflow 3 allows it) or without a data interval.
    logical_date: Mapped[datetime | None] = mapped_column(UtcDateTime())
    interval_start: Mapped[datetime | None] = mapped_column(UtcDateTime())
    interval_end: Mapped[datetime | None] = mapped_column(UtcDateTime())
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime())


class SinkRegistry(Base):
    """Every sink the epoch operators have used, with the configs to rebuild its coordinator.

    The recovery DAG reads this instead of importing user DAG files: it must finish a crashed
    sink's epochs even when the DAG that wrote them was since changed, paused or deleted.
    """

    __tablename__ = "sink_registry"
    __table_args__ = (PrimaryKeyConstraint("sink_id"),)

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    #: ``SinkConfig.model_dump(mode="json")`` as JSON.
    sink_config: Mapped[str] = mapped_column(Text)
    #: ``CheckpointConfig.model_dump(mode="json")`` as JSON, or NULL: the meta-store checkpoint table stands in.
    checkpoint_config: Mapped[str | None] = mapped_column(Text)
    registered_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


class SinkLock(Base):
    """Who is recovering a sink, until when: taken and stolen (once expired) by compare-and-swap."""

    __tablename__ = "sink_lock"
    __table_args__ = (PrimaryKeyConstraint("sink_id"),)

    sink_id: Mapped[str] = mapped_column(String(SINK_ID_LENGTH))
    holder: Mapped[str] = mapped_column(String(LOCK_HOLDER_LENGTH))
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime())
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
